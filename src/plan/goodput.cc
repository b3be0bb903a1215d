#include "plan/goodput.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/rng.h"
#include "plan/table.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// RNG purpose for the planner's simulations (its own stream; see core/rng.h).
constexpr auto kPlanPurpose = static_cast<RngPurpose>(0x504c414e);  // "PLAN"

// Exponential waiting times from counter-based draws: (seed, trial, purpose, index).
class Arrivals {
 public:
  Arrivals(uint64_t seed, uint64_t trial, uint64_t stream)
      : seed_(seed), trial_(trial), stream_(stream) {}
  double Next(double rate) {
    if (!(rate > 0)) return kInf;
    uint64_t bits = RandomBits(seed_, trial_, kPlanPurpose, (index_++ << 2) | stream_);
    double u = (static_cast<double>(bits >> 11) + 0.5) * 0x1.0p-53;  // in (0, 1)
    return -std::log(u) / rate;
  }

 private:
  uint64_t seed_, trial_, stream_;
  uint64_t index_ = 0;
};

struct Saved {
  double progress;
  bool clean;
};

struct TrialResult {
  double progress = 0, lost = 0, saving = 0, restarting = 0;
  int interruptions = 0;
};

TrialResult RunTrial(const GoodputSettings& s, Recovery mode, double interval, uint64_t trial) {
  const double horizon = s.days * 86400.0;
  const double n = static_cast<double>(s.gpus);
  const double fail_rate = n * s.failure_rate_per_gpu_hour / 3600.0;
  const double sdc_rate = n * s.sdc_rate_per_gpu_hour / 3600.0;
  const bool replica_mode = mode == Recovery::kReplica;
  const double persist_every = replica_mode ? s.persistent_interval_s : interval;
  const double replica_every = replica_mode ? interval : kInf;

  Arrivals failures(s.seed, trial, 1), sdcs(s.seed, trial, 2);
  TrialResult r;
  double t = 0;
  double next_fail = failures.Next(fail_rate);
  double next_sdc = sdcs.Next(sdc_rate);
  double detect_at = kInf;
  bool corrupt = false;
  std::vector<Saved> persistent = {{0, true}};
  Saved replica = {0, true};
  double next_persist = persist_every, next_replica = replica_every;

  auto interrupt = [&](bool detected) {
    ++r.interruptions;
    // Newest usable state: a detected corruption needs a clean one; a hard failure takes the
    // newest (which may itself be corrupt, and then the corruption is still pending).
    Saved restore = {0, true};
    bool from_replica = false;
    for (const Saved& p : persistent) {
      if (!detected || p.clean) restore = p;
    }
    if (replica_mode && replica.progress >= restore.progress && (!detected || replica.clean)) {
      restore = replica;
      from_replica = true;
    }
    r.lost += r.progress - restore.progress;
    r.progress = restore.progress;
    corrupt = !restore.clean;
    if (!corrupt) detect_at = kInf;
    std::erase_if(persistent, [&](const Saved& p) { return p.progress > restore.progress; });
    if (replica.progress > restore.progress || !from_replica) replica = restore;
    const double restart = from_replica ? RestartSeconds(s, Recovery::kReplica)
                                        : RestartSeconds(s, Recovery::kCheckpoint);
    double start = t, end = t + restart;
    // A failure during the restart starts it over (when restarts outlast the MTBF this can go on
    // until the horizon: the run makes no progress at all).
    while (next_fail < end && next_fail < horizon) {
      ++r.interruptions;
      end = next_fail + restart;
      next_fail += failures.Next(fail_rate);
    }
    if (next_sdc < end) next_sdc = end + sdcs.Next(sdc_rate);
    r.restarting += std::min(end, horizon) - start;
    t = end;
    next_persist = r.progress + persist_every;
    next_replica = r.progress + replica_every;
  };

  while (t < horizon) {
    const double target = std::min(next_persist, next_replica);
    const double done = t + (target - r.progress);
    const double event = std::min({next_fail, next_sdc, detect_at, horizon});
    if (event < done) {
      r.progress += event - t;
      t = event;
      if (t >= horizon) break;
      if (event == next_sdc) {
        if (!corrupt) {
          corrupt = true;
          detect_at = t + s.sdc_detection_delay_s;
        }
        next_sdc = t + sdcs.Next(sdc_rate);
      } else if (event == next_fail) {
        next_fail = t + failures.Next(fail_rate);
        interrupt(false);
      } else {
        interrupt(true);
      }
      continue;
    }
    r.progress = target;
    t = done;
    const bool persist = target == next_persist;
    const double cost = persist ? s.checkpoint_cost_s : s.replica_cost_s;
    double end = t + cost;
    if (next_sdc < end && !corrupt) {  // corruption while saving: the save is corrupt too
      corrupt = true;
      detect_at = next_sdc + s.sdc_detection_delay_s;
    }
    if (next_sdc < end) next_sdc = end + sdcs.Next(sdc_rate);
    if (std::min(next_fail, detect_at) < std::min(end, horizon)) {
      double at = std::min(next_fail, detect_at);
      r.saving += at - t;
      t = at;
      bool detected = detect_at <= next_fail;
      if (!detected) next_fail = t + failures.Next(fail_rate);
      interrupt(detected);
      continue;
    }
    if (end >= horizon) {
      r.saving += horizon - t;
      t = horizon;
      break;
    }
    r.saving += cost;
    t = end;
    if (persist) {
      persistent.push_back({r.progress, !corrupt});
      next_persist = r.progress + persist_every;
      if (replica_mode && next_replica <= r.progress) next_replica = r.progress + replica_every;
    } else {
      replica = {r.progress, !corrupt};
      next_replica = r.progress + replica_every;
    }
  }
  return r;
}

}  // namespace

Status ValidateGoodputSettings(const GoodputSettings& s) {
  auto positive = [](double v, const char* what) -> Status {
    if (!(v > 0) || !std::isfinite(v)) {
      return Status::InvalidArgument(fmt::format("{} must be positive, got {}", what, v));
    }
    return Status::Ok();
  };
  auto nonneg = [](double v, const char* what) -> Status {
    if (!(v >= 0) || !std::isfinite(v)) {
      return Status::InvalidArgument(fmt::format("{} must be >= 0, got {}", what, v));
    }
    return Status::Ok();
  };
  if (s.gpus < 1) return Status::InvalidArgument("--gpus must be >= 1");
  ATOLL_RETURN_IF_ERROR(positive(s.days, "--days"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.failure_rate_per_gpu_hour, "--failure-rate"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.sdc_rate_per_gpu_hour, "--sdc-rate"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.sdc_detection_delay_s, "--sdc-delay"));
  ATOLL_RETURN_IF_ERROR(positive(s.checkpoint_cost_s, "--checkpoint-cost"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.checkpoint_interval_s, "--checkpoint-interval"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.restart_base_s, "--restart"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.restart_per_1k_gpus_s, "--restart-per-1k-gpus"));
  ATOLL_RETURN_IF_ERROR(positive(s.replica_cost_s, "--replica-cost"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.replica_interval_s, "--replica-interval"));
  ATOLL_RETURN_IF_ERROR(nonneg(s.replica_restart_base_s, "--replica-restart"));
  ATOLL_RETURN_IF_ERROR(positive(s.persistent_interval_s, "--persistent-interval"));
  if (s.trials < 1 || s.trials > 100000) {
    return Status::InvalidArgument("--trials must be in [1, 100000]");
  }
  if (s.failure_rate_per_gpu_hour + s.sdc_rate_per_gpu_hour <= 0) {
    return Status::InvalidArgument("at least one of --failure-rate, --sdc-rate must be > 0");
  }
  return Status::Ok();
}

double SystemMtbfSeconds(const GoodputSettings& s) {
  double rate = static_cast<double>(s.gpus) *
                (s.failure_rate_per_gpu_hour + s.sdc_rate_per_gpu_hour) / 3600.0;
  return rate > 0 ? 1.0 / rate : kInf;
}

double RestartSeconds(const GoodputSettings& s, Recovery r) {
  double base = r == Recovery::kReplica ? s.replica_restart_base_s : s.restart_base_s;
  return base + s.restart_per_1k_gpus_s * static_cast<double>(s.gpus) / 1000.0;
}

double YoungInterval(double cost_s, double mtbf_s) { return std::sqrt(2.0 * cost_s * mtbf_s); }

double DalyInterval(double cost_s, double mtbf_s) {
  if (cost_s >= 2.0 * mtbf_s) return mtbf_s;
  double x = cost_s / (2.0 * mtbf_s);
  return std::sqrt(2.0 * cost_s * mtbf_s) * (1.0 + std::sqrt(x) / 3.0 + x / 9.0) - cost_s;
}

GoodputStats SimulateGoodput(const GoodputSettings& s, Recovery recovery, double interval_s) {
  GoodputStats st;
  st.interval_s = interval_s;
  const double horizon = s.days * 86400.0;
  double sum = 0, sum2 = 0;
  for (int k = 0; k < s.trials; ++k) {
    TrialResult r = RunTrial(s, recovery, interval_s, static_cast<uint64_t>(k));
    double g = r.progress / horizon;
    sum += g;
    sum2 += g * g;
    st.interruptions += r.interruptions;
    st.lost_fraction += r.lost / horizon;
    st.checkpoint_fraction += r.saving / horizon;
    st.restart_fraction += r.restarting / horizon;
  }
  const double n = s.trials;
  st.goodput = sum / n;
  st.goodput_sd = n > 1 ? std::sqrt(std::max(0.0, (sum2 - sum * sum / n) / (n - 1))) : 0;
  st.interruptions /= n;
  st.lost_fraction /= n;
  st.checkpoint_fraction /= n;
  st.restart_fraction /= n;
  return st;
}

StatusOr<GoodputResult> RunGoodput(const GoodputSettings& s) {
  ATOLL_RETURN_IF_ERROR(ValidateGoodputSettings(s));
  GoodputResult r;
  r.mtbf_s = SystemMtbfSeconds(s);
  r.young_s = YoungInterval(s.checkpoint_cost_s, r.mtbf_s);
  r.daly_s = DalyInterval(s.checkpoint_cost_s, r.mtbf_s);
  const double replica_daly = DalyInterval(s.replica_cost_s, r.mtbf_s);
  // Intervals from Daly's / 8 to x 8 in half-octave steps; the best is the simulated optimum.
  auto sweep = [&](Recovery mode, double center, std::vector<GoodputStats>* out) {
    GoodputStats best;
    for (int k = -6; k <= 6; ++k) {
      GoodputStats st = SimulateGoodput(s, mode, center * std::pow(2.0, k / 2.0));
      out->push_back(st);
      if (st.goodput > best.goodput) best = st;
    }
    return best;
  };
  r.best_checkpoint = sweep(Recovery::kCheckpoint, r.daly_s, &r.checkpoint_sweep);
  r.best_replica = sweep(Recovery::kReplica, replica_daly, &r.replica_sweep);
  r.checkpoint_at_daly = r.checkpoint_sweep[6];
  if (s.recovery == Recovery::kCheckpoint) {
    r.chosen = s.checkpoint_interval_s > 0
                   ? SimulateGoodput(s, Recovery::kCheckpoint, s.checkpoint_interval_s)
                   : r.checkpoint_at_daly;
  } else {
    r.chosen = SimulateGoodput(s, Recovery::kReplica,
                               s.replica_interval_s > 0 ? s.replica_interval_s : replica_daly);
  }
  return r;
}

std::string GoodputReport(const GoodputResult& r, const GoodputSettings& s) {
  const double horizon = s.days * 86400.0;
  std::string out = fmt::format(
      "{} GPUs for {} days: {:.3g} failures and {:.3g} silent corruptions per GPU-hour "
      "(expected {:.0f} interruptions), system MTBF {}\n",
      s.gpus, s.days, s.failure_rate_per_gpu_hour, s.sdc_rate_per_gpu_hour, horizon / r.mtbf_s,
      FormatSeconds(r.mtbf_s));
  out += fmt::format(
      "checkpoint: {} to write; restart {} ({} + {} per 1k GPUs); SDC detected after {}\n",
      FormatSeconds(s.checkpoint_cost_s), FormatSeconds(RestartSeconds(s, Recovery::kCheckpoint)),
      FormatSeconds(s.restart_base_s), FormatSeconds(s.restart_per_1k_gpus_s),
      FormatSeconds(s.sdc_detection_delay_s));
  out += fmt::format(
      "in-memory replica: {} to refresh; restart {}; persistent checkpoint every {} for SDC\n\n",
      FormatSeconds(s.replica_cost_s), FormatSeconds(RestartSeconds(s, Recovery::kReplica)),
      FormatSeconds(s.persistent_interval_s));
  TextTable t;
  for (const char* h : {"recovery", "interval", "goodput", "+-", "interruptions", "lost work",
                        "saving", "restarting"}) {
    t.AddColumn(h);
  }
  auto add = [&](const char* mode, const GoodputStats& st) {
    t.AddRow({mode, FormatSeconds(st.interval_s), fmt::format("{:.2f}%", st.goodput * 100),
              fmt::format("{:.2f}", st.goodput_sd * 100), fmt::format("{:.1f}", st.interruptions),
              fmt::format("{:.2f}%", st.lost_fraction * 100),
              fmt::format("{:.2f}%", st.checkpoint_fraction * 100),
              fmt::format("{:.2f}%", st.restart_fraction * 100)});
  };
  for (const auto& st : r.checkpoint_sweep) add("checkpoint", st);
  for (const auto& st : r.replica_sweep) add("replica", st);
  out += t.Render();
  out += fmt::format("\nYoung's interval sqrt(2 delta M) = {}; Daly's = {}\n",
                     FormatSeconds(r.young_s), FormatSeconds(r.daly_s));
  out += fmt::format(
      "simulated best checkpoint interval: {} -> goodput {:.2f}% (at Daly's: "
      "{:.2f}%)\n",
      FormatSeconds(r.best_checkpoint.interval_s), r.best_checkpoint.goodput * 100,
      r.checkpoint_at_daly.goodput * 100);
  out += fmt::format("in-memory replica, best refresh interval {}: goodput {:.2f}%\n",
                     FormatSeconds(r.best_replica.interval_s), r.best_replica.goodput * 100);
  out += fmt::format("chosen ({} every {}): goodput {:.2f}% +- {:.2f}, {:.1f} interruptions\n",
                     s.recovery == Recovery::kCheckpoint ? "checkpoint" : "replica",
                     FormatSeconds(r.chosen.interval_s), r.chosen.goodput * 100,
                     r.chosen.goodput_sd * 100, r.chosen.interruptions);
  return out;
}

nlohmann::json GoodputJson(const GoodputResult& r, const GoodputSettings& s) {
  auto stats = [](const GoodputStats& st) {
    return nlohmann::json{{"interval_s", st.interval_s},
                          {"goodput", st.goodput},
                          {"goodput_sd", st.goodput_sd},
                          {"interruptions", st.interruptions},
                          {"lost_fraction", st.lost_fraction},
                          {"checkpoint_fraction", st.checkpoint_fraction},
                          {"restart_fraction", st.restart_fraction}};
  };
  nlohmann::json ck = nlohmann::json::array(), rep = nlohmann::json::array();
  for (const auto& st : r.checkpoint_sweep) ck.push_back(stats(st));
  for (const auto& st : r.replica_sweep) rep.push_back(stats(st));
  return {{"gpus", s.gpus},
          {"days", s.days},
          {"mtbf_s", r.mtbf_s},
          {"young_interval_s", r.young_s},
          {"daly_interval_s", r.daly_s},
          {"restart_s", RestartSeconds(s, Recovery::kCheckpoint)},
          {"replica_restart_s", RestartSeconds(s, Recovery::kReplica)},
          {"checkpoint_sweep", ck},
          {"replica_sweep", rep},
          {"best_checkpoint", stats(r.best_checkpoint)},
          {"checkpoint_at_daly", stats(r.checkpoint_at_daly)},
          {"best_replica", stats(r.best_replica)},
          {"chosen", stats(r.chosen)}};
}

StatusOr<MeasuredStartup> ParseMeasuredStartup(const nlohmann::json& j) {
  MeasuredStartup m;
  struct Key {
    const char* name;
    double* out;
  };
  for (const Key& k :
       {Key{"fixed_s", &m.fixed_s}, Key{"per_rank_s", &m.per_rank_s},
        Key{"per_site_s", &m.per_site_s}, Key{"restart_from_memory_s", &m.restart_from_memory_s},
        Key{"restart_from_disk_s", &m.restart_from_disk_s}}) {
    if (!j.is_object() || !j.contains(k.name) || !j.at(k.name).is_number())
      return Status::InvalidArgument(fmt::format("measured start-up: no number \"{}\"", k.name));
    *k.out = j.at(k.name).get<double>();
  }
  // A negative slope (noise in a flat fit) is taken as no growth; the restarts must be positive.
  m.per_rank_s = std::max(m.per_rank_s, 0.0);
  m.per_site_s = std::max(m.per_site_s, 0.0);
  if (j.contains("restart_sites") && j.at("restart_sites").is_number_integer())
    m.restart_sites = std::max(j.at("restart_sites").get<int>(), 0);
  if (m.restart_from_memory_s <= 0 || m.restart_from_disk_s <= 0)
    return Status::InvalidArgument("measured start-up: the restart times must be positive");
  return m;
}

void ApplyMeasuredStartup(const MeasuredStartup& m, int gpus_per_site, GoodputSettings* s) {
  const double grown = m.per_rank_s * double(std::max(gpus_per_site, 1) - 1);
  // The measured world's own sites are counted by the growth per GPU already.
  s->restart_base_s =
      std::max(m.restart_from_disk_s - m.per_site_s * double(m.restart_sites), 0.0) + grown;
  s->replica_restart_base_s = m.restart_from_memory_s + grown;
  s->restart_per_1k_gpus_s = m.per_site_s * 1000.0 / double(std::max(gpus_per_site, 1));
}

}  // namespace atl::plan
