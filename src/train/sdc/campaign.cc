// The fault-injection campaign: runs and scoring (train/sdc/campaign.h). The tables are
// campaign_report.cc's.
#include "train/sdc/campaign.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "core/file.h"
#include "core/rng.h"
#include "model/config.h"
#include "train/local_world.h"
#include "train/sdc/fingerprint.h"
#include "train/trainer.h"

namespace atl {

namespace {

// An sdc event as metrics.jsonl holds it (train/sdc/monitor.h SdcEvent::ToJson), with its step.
struct Event {
  int64_t step = 0;
  int site = 0, rank = -1;
  std::string detector, verdict, what, op;
  int64_t micro = -1;
  int layer = -1;
  bool majority = true;  // fingerprint: false when it names every replica or site (no majority)
  bool across_sites = false;  // fingerprint: the sites compared
};

// Ranks per site.
int RanksOf(const RunConfig& cfg) {
  return int(cfg.parallel.dp * cfg.parallel.tp * cfg.parallel.pp);
}

struct RunRecord {
  std::vector<Event> events;
  double val_loss = std::numeric_limits<double>::quiet_NaN();  // the last line's
  int64_t steps = 0;
  std::string model;  // the final checkpoint's model.safetensors, bytes
  // Several sites: their fingerprints differed after the last step, and no replay came after
  // (site 0's checkpoint is not every site's state).
  bool sites_apart = false;
};

// An event of a metrics line of step `step`.
Event EventOf(int64_t step, const nlohmann::json& e) {
  Event ev;
  ev.step = step;
  ev.site = e.value("site", 0);
  ev.rank = e.value("rank", -1);
  ev.detector = e.value("detector", "");
  ev.verdict = e.value("verdict", "");
  ev.what = e.value("what", "");
  ev.op = e.value("op", "");
  ev.micro = e.value("micro", int64_t(-1));
  ev.layer = e.value("layer", -1);
  ev.majority = e.value("majority", true);
  ev.across_sites = e.value("across", "") == "sites";
  return ev;
}

// Every site's events (in step order, a finding several sites report once), site 0's steps and
// validation loss, and the checkpoint.
StatusOr<RunRecord> ReadRun(const RunConfig& cfg, const std::string& dir) {
  RunRecord r;
  std::set<std::string> seen;
  for (int site = 0; site < int(cfg.world.sites); ++site) {
    const std::string path = LocalSiteDir(cfg, dir, site) + "/metrics.jsonl";
    std::ifstream in(path);
    std::string line;
    // Whether the sites' fingerprints differed at the site's last step, after its last replay
    // (a line holds the first run's events, the replay's verdict, then the kept run's).
    int64_t last = -1;
    bool apart = false;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) return Status::Corruption(path + ": not JSON: " + line);
      const int64_t step = j.value("step", int64_t(0));
      if (site == 0) r.steps = step;
      if (site == 0 && j.contains("val_loss")) r.val_loss = j["val_loss"].get<double>();
      if (step > last) {
        last = step;
        apart = false;
      }
      if (!j.contains("sdc")) continue;
      for (const auto& e : j["sdc"]) {
        const Event ev = EventOf(step, e);
        if (ev.detector == "replay") apart = false;
        if (ev.detector == "fingerprint" && ev.across_sites) apart = true;
        if (seen.insert(fmt::format("{}|{}", step, e.dump())).second) r.events.push_back(ev);
      }
    }
    r.sites_apart |= apart;
  }
  std::stable_sort(r.events.begin(), r.events.end(),
                   [](const Event& a, const Event& b) { return a.step < b.step; });
  if (auto m = ReadFile(dir + "/checkpoint/model.safetensors"); m.ok()) r.model = std::move(*m);
  return r;
}

// The fired faults of every rank's log, site by site.
std::vector<FaultRecord> ReadFired(const RunConfig& cfg, const std::string& dir) {
  std::vector<FaultRecord> out;
  const int ranks = RanksOf(cfg);
  for (int i = 0; i < ranks * int(cfg.world.sites); ++i) {
    const std::string site_dir = LocalSiteDir(cfg, dir, i / ranks);
    const int rank = i % ranks;
    std::ifstream in(rank == 0 ? site_dir + "/faults.jsonl"
                               : fmt::format("{}/faults-rank{}.jsonl", site_dir, rank));
    std::string line;
    while (std::getline(in, line)) {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded()) continue;
      FaultRecord f{};
      f.step = j.value("step", int64_t(0));
      f.site = j.value("site", 0);
      f.rank = j.value("rank", 0);
      f.micro = j.value("micro", int64_t(-1));
      f.layer = j.value("layer", -1);
      f.gemm = j.value("gemm", -1);
      f.elem = j.value("elem", int64_t(0));
      f.bit = j.value("bit", 0);
      f.chunk = j.value("chunk", int64_t(-1));
      f.to_site = j.value("to_site", -1);
      out.push_back(f);
    }
  }
  return out;
}

// The tensor of a rank's flat buffer that element `elem` belongs to (empty when the rank's
// buffer is not the whole model's layout: tensor or pipeline parallel, or a ZeRO shard).
std::string TensorOf(const RunConfig& cfg, FaultKind kind, int64_t elem) {
  const ParallelConfig& pc = cfg.parallel;
  if (pc.tp > 1 || pc.pp > 1 || (pc.zero && pc.dp > 1 && kind != FaultKind::kParam)) return "";
  const std::vector<ParamTensor> layout = ParameterLayout(cfg.model);
  const ParamTensor* t = TensorAt(layout, size_t(elem));
  return t != nullptr ? ShortTensorName(t->name) : "";
}

bool IsCompute(FaultKind k) {
  return k == FaultKind::kGemmForward || k == FaultKind::kGemmBackward ||
         k == FaultKind::kActivation;
}

// The buffer a flat-buffer flip struck, as events name it ("params", "moment_m", "moment_v").
std::string BufferOf(const Outcome& o) {
  return o.kind == FaultKind::kMoment ? fmt::format("moment_{}", o.moment) : std::string("params");
}

// Whether event e names the place of the flip o (see campaign.h).
bool Names(const Event& e, const Outcome& o) {
  const FaultRecord& t = o.truth;
  const bool replay = e.detector == "replay" && e.verdict == "transient";
  // A payload is found where it arrived: the replay names the site that took it and the WAN.
  if (o.kind == FaultKind::kWan)
    return replay && e.step == t.step && e.site == t.to_site && e.op == "wan";
  if (e.site != t.site || e.rank != t.rank) return false;
  if ((replay || e.detector == "checksum") && e.step == t.step) {
    if (IsCompute(o.kind)) {
      return e.micro == t.micro && e.layer == t.layer && e.op == OpName(o.kind, t.gemm);
    }
    return o.kind == FaultKind::kGrad && e.op == "grad" &&
           (o.tensor.empty() || e.what == o.tensor || e.what == "shard");
  }
  if (e.detector == "memory")  // found by its owner at the start of the flip's step
    return e.step == t.step &&
           (e.what == BufferOf(o) + ":" + o.tensor || e.what == BufferOf(o) + ":shard");
  // Two replicas (or sites) that disagree are both named: that names no place.
  if (e.detector == "fingerprint" && !o.tensor.empty() && e.majority) {
    // A gradient flip on one replica shows as its parameters after the update.
    if (o.kind == FaultKind::kGrad && e.step != t.step) return false;
    return e.what == BufferOf(o) + ":" + o.tensor;
  }
  return false;
}

// An event's identity, to tell the clean run's own findings (a genuine spike at step k) from the
// flip's in an injected run, which is the clean run bit for bit wherever the flip changed nothing.
std::string KeyOf(const Event& e) {
  return fmt::format("{}|{}|{}|{}|{}|{}|{}", e.step, e.site, e.rank, e.detector, e.verdict, e.what,
                     e.op);
}

std::set<std::string> KeysOf(const std::vector<Event>& events) {
  std::set<std::string> keys;
  for (const Event& e : events) keys.insert(KeyOf(e));
  return keys;
}

// What the events of steps before `t` found, leaving out those in `known` (there was nothing to
// find). A "reproduced" verdict counts for a step the guard alarmed in (audits do not count).
FalseFindings FindingsBefore(const std::vector<Event>& events, int64_t t,
                             const std::set<std::string>& known = {}) {
  FalseFindings f;
  int64_t alarm = 0, verdict = 0;  // the last step counted
  for (const Event& e : events) {  // in step order
    if (e.step >= t) break;
    if (known.count(KeyOf(e)) > 0) continue;
    if (e.detector == "replay" && e.verdict == "reproduced") {
      f.reproduced += e.step == alarm;
      continue;
    }
    const bool is_alarm = e.detector == "guard";
    int64_t& last = is_alarm ? alarm : verdict;
    if (e.step == last) continue;
    last = e.step;
    ++(is_alarm ? f.alarm_steps : f.verdict_steps);
  }
  return f;
}

// Scores run (with flip o) against the clean run: the clean run's own findings (its keys) are
// not the flip's.
void Score(const RunRecord& run, const RunRecord& clean, const std::set<std::string>& clean_keys,
           Outcome* o) {
  const int64_t t = o->fired ? o->truth.step : std::numeric_limits<int64_t>::max();
  o->false_findings = FindingsBefore(run.events, t, clean_keys);
  for (const Event& e : run.events) {
    if (e.step < t || clean_keys.count(KeyOf(e)) > 0) continue;
    bool detection = true;
    if (e.detector == "guard")
      o->guard = true;
    else if (e.detector == "fingerprint")
      o->fingerprint = true;
    else if (e.detector == "checksum")
      o->checksum = true;
    else if (e.detector == "memory")
      o->memory = true;
    else if (e.detector == "replay" && e.verdict == "transient")
      o->replay = true;
    else
      detection = false;
    if (detection && o->delay < 0) o->delay = e.step - t;
    if (Names(e, *o)) o->localized = true;
  }
  if (!o->error.empty()) {
    o->harm = std::numeric_limits<double>::infinity();
    return;
  }
  o->recovered = !run.model.empty() && run.model == clean.model && !run.sites_apart;
  o->harm = std::isfinite(run.val_loss) ? std::abs(run.val_loss / clean.val_loss - 1)
                                        : std::numeric_limits<double>::infinity();
}

// Appends the metrics lines of dir's run that carry sdc events to `path` (the clean runs' false
// positives, kept for a look).
void KeepEventLines(const std::string& dir, const std::string& path) {
  std::ifstream in(dir + "/metrics.jsonl");
  std::ofstream out(path, std::ios::app);
  std::string line;
  while (std::getline(in, line))
    if (line.find("\"sdc\"") != std::string::npos) out << line << "\n";
}

}  // namespace

std::string Outcome::ToJson() const {
  nlohmann::ordered_json j;
  j["spec"] = spec;
  j["kind"] = FaultKindName(kind);
  j["bit"] = bit;
  j["fired"] = fired;
  if (fired) {
    j["step"] = truth.step;
    j["site"] = truth.site;
    j["rank"] = truth.rank;
    if (truth.chunk >= 0) {
      j["chunk"] = truth.chunk;
      j["to_site"] = truth.to_site;
    }
    j["micro"] = truth.micro;
    j["layer"] = truth.layer;
    j["gemm"] = truth.gemm;
    j["elem"] = truth.elem;
  }
  if (!tensor.empty()) j["tensor"] = tensor;
  j["guard"] = guard;
  j["fingerprint"] = fingerprint;
  j["checksum"] = checksum;
  j["memory"] = memory;
  j["replay"] = replay;
  j["delay"] = delay;
  j["localized"] = localized;
  j["recovered"] = recovered;
  j["harm"] = std::isfinite(harm) ? nlohmann::ordered_json(harm) : nlohmann::ordered_json("inf");
  j["false_alarm_steps"] = false_findings.alarm_steps;
  j["false_verdict_steps"] = false_findings.verdict_steps;
  if (!error.empty()) j["error"] = error;
  return j.dump();
}

StatusOr<std::vector<FaultKind>> ParseFaultKinds(std::string_view list) {
  std::vector<FaultKind> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view name = list.substr(pos, comma - pos);
    pos = comma + 1;
    if (name.empty()) continue;
    // A spec of the kind parses (the step is needed by the grammar, not used).
    auto spec = ParseFaults(fmt::format("{}:step=1", name));
    if (!spec.ok() || spec->size() != 1)
      return Status::InvalidArgument(fmt::format(
          "--kinds: unknown injection site '{}' (gemm_fwd, gemm_bwd, activation, grad, param, "
          "moment, wan)",
          name));
    if ((*spec)[0].kind == FaultKind::kBadCore)
      return Status::InvalidArgument(
          "--kinds: bad_core is not a campaign site (one flip per run); inject it with `atoll "
          "train --inject bad_core:p=...`");
    out.push_back((*spec)[0].kind);
  }
  if (out.empty()) return Status::InvalidArgument("--kinds: no injection site named");
  return out;
}

StatusOr<std::vector<int>> ParseBits(std::string_view list) {
  std::vector<int> out;
  size_t pos = 0;
  auto bad = [&](std::string_view item) {
    return Status::InvalidArgument(
        fmt::format("--bits: '{}' is not a bit (0..31) or a range (23-31)", item));
  };
  while (pos <= list.size()) {
    const size_t comma = std::min(list.find(',', pos), list.size());
    const std::string_view item = list.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    const size_t dash = item.find('-');
    const std::string lo_text(item.substr(0, dash));
    const std::string hi_text(dash == std::string_view::npos ? lo_text : item.substr(dash + 1));
    char* end = nullptr;
    const long lo = std::strtol(lo_text.c_str(), &end, 10);
    if (lo_text.empty() || *end != 0) return bad(item);
    const long hi = std::strtol(hi_text.c_str(), &end, 10);
    if (hi_text.empty() || *end != 0 || lo < 0 || hi > 31 || lo > hi) return bad(item);
    for (long b = lo; b <= hi; ++b) out.push_back(int(b));
  }
  if (out.empty()) return Status::InvalidArgument("--bits: no bit named");
  return out;
}

StatusOr<CampaignResult> RunCampaign(const CampaignOptions& o) {
  const RunConfig& base = o.cfg;
  const int64_t steps = base.train.steps;
  if (o.kinds.empty()) return Status::InvalidArgument("sdc campaign: no injection sites");
  if (o.injections < 1)
    return Status::InvalidArgument(fmt::format("--injections: {} is not positive", o.injections));
  if (o.first_step < 1 || o.first_step > steps)
    return Status::InvalidArgument(fmt::format(
        "--first-step: {} is outside the run's steps 1..{} (train.steps)", o.first_step, steps));
  if (!(o.harm > 0)) return Status::InvalidArgument("--harm: must be positive");
  if (o.clean_steps < 0)
    return Status::InvalidArgument(fmt::format("--clean-steps: {} is negative", o.clean_steps));
  if (o.seed > (uint64_t(1) << 40))
    return Status::InvalidArgument(fmt::format("--seed: {} is above 2^40", o.seed));
  const int sites = int(base.world.sites);
  if (sites > 1 && base.world.strategy != "sync")
    return Status::InvalidArgument(
        "sdc campaign: several sites need world.strategy = sync (the sites run in this process, "
        "without a coordinator)");
  if (sites == 1 && std::find(o.kinds.begin(), o.kinds.end(), FaultKind::kWan) != o.kinds.end())
    return Status::InvalidArgument("--kinds: wan needs world.sites > 1 (a payload between sites)");
  if (base.sdc.on_alarm == "stop")
    return Status::InvalidArgument(
        "sdc campaign: sdc.on_alarm = stop ends a run before its events are written; use warn "
        "or redo");
  if (base.train.eval_batches < 1)
    return Status::InvalidArgument(
        "sdc campaign: train.eval_batches must be positive (harm is measured on validation)");
  if (base.train.checkpoint_every < 0)
    return Status::InvalidArgument(
        "sdc campaign: train.checkpoint_every = -1 writes no final model, which the campaign "
        "compares (use 0)");
  if (!base.faults.inject.empty())
    return Status::InvalidArgument("sdc campaign: the config already injects faults");
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(base));
  ATOLL_RETURN_IF_ERROR(MakeDirs(o.dir));

  CampaignResult result;
  result.harm = o.harm;
  result.ranks = RanksOf(base);
  result.dp = base.parallel.dp;
  result.zero = base.parallel.zero && base.parallel.dp > 1;
  result.memory = base.sdc.memory;
  const ParallelConfig& pc = base.parallel;
  result.layout = result.ranks == 1 ? std::string("one process")
                                    : fmt::format("dp {} x tp {} x pp {}{}", pc.dp, pc.tp, pc.pp,
                                                  pc.zero ? " (ZeRO-1)" : "");
  if (sites > 1)
    result.layout = fmt::format("{} sites (sync, WAN on loopback) of {}", sites, result.layout);
  const std::string run_dir = o.dir + "/run";

  // The clean reference (and, when asked, a longer clean run for false positives).
  ATOLL_RETURN_IF_ERROR(TrainLocalWorld(base, run_dir));
  ATOLL_ASSIGN_OR_RETURN(RunRecord clean, ReadRun(base, run_dir));
  if (!std::isfinite(clean.val_loss) || clean.model.empty())
    return Status::Internal("sdc campaign: the clean run wrote no validation loss or checkpoint");
  result.clean_val_loss = clean.val_loss;
  result.clean_run_steps = clean.steps;
  result.clean_run = FindingsBefore(clean.events, std::numeric_limits<int64_t>::max());
  const std::set<std::string> clean_keys = KeysOf(clean.events);
  const std::string clean_log = o.dir + "/clean_events.jsonl";
  std::remove(clean_log.c_str());
  for (int s = 0; s < sites; ++s) KeepEventLines(LocalSiteDir(base, run_dir, s), clean_log);
  if (o.clean_steps > 0) {
    RunConfig long_cfg = base;
    long_cfg.train.steps = o.clean_steps;
    long_cfg.train.eval_every = 0;
    ATOLL_RETURN_IF_ERROR(TrainLocalWorld(long_cfg, run_dir));
    ATOLL_ASSIGN_OR_RETURN(RunRecord long_run, ReadRun(long_cfg, run_dir));
    result.clean_run_steps += long_run.steps;
    const FalseFindings found =
        FindingsBefore(long_run.events, std::numeric_limits<int64_t>::max());
    result.clean_run += found;
    for (int s = 0; s < sites; ++s) KeepEventLines(LocalSiteDir(base, run_dir, s), clean_log);
    if (o.progress)
      o.progress(
          0, o.injections,
          fmt::format("clean run of {} steps: {} steps with guard alarms ({} reproduced by a "
                      "replay), {} with corruption found",
                      long_run.steps, found.alarm_steps, found.reproduced, found.verdict_steps));
  }

  std::vector<int> bits = o.bits;
  if (bits.empty())
    for (int b = 0; b < 32; ++b) bits.push_back(b);
  for (int b : bits)
    if (b < 0 || b > 31) return Status::InvalidArgument(fmt::format("--bits: {} is not 0..31", b));
  const int64_t n_bits = int64_t(bits.size());

  std::ofstream log(o.dir + "/injections.jsonl", std::ios::trunc);
  const int64_t span = steps - o.first_step + 1;
  for (int64_t i = 0; i < o.injections; ++i) {
    FaultSpec f;
    f.kind = o.kinds[size_t(i / n_bits) % o.kinds.size()];
    f.bit = bits[size_t(i % n_bits)];
    f.step = o.first_step +
             int64_t(RandomBelow(o.seed, uint64_t(i), RngPurpose::kFault, 1, uint64_t(span)));
    f.rank =
        f.kind == FaultKind::kWan  // the leader sends the site's payloads
            ? 0
            : int(RandomBelow(o.seed, uint64_t(i), RngPurpose::kFault, 2, uint64_t(result.ranks)));
    f.site = int(RandomBelow(o.seed, uint64_t(i), RngPurpose::kFault, 4, uint64_t(sites)));
    f.moment = RandomBelow(o.seed, uint64_t(i), RngPurpose::kFault, 3, 2) == 0 ? 'm' : 'v';
    RunConfig cfg = base;
    cfg.faults.inject = FormatSpec(f);
    cfg.faults.seed = int64_t(o.seed * 1000003 + uint64_t(i));

    Outcome out;
    out.spec = cfg.faults.inject;
    out.kind = f.kind;
    out.bit = f.bit;
    out.moment = f.kind == FaultKind::kMoment ? f.moment : 0;
    if (Status st = TrainLocalWorld(cfg, run_dir); !st.ok()) {
      // Bad input (exit 2) is the campaign's to report; a run that stopped is an outcome.
      if (st.code() == StatusCode::kInvalidArgument || st.code() == StatusCode::kNotFound ||
          st.code() == StatusCode::kCorruption)
        return st;
      out.error = st.ToString();
    }
    const std::vector<FaultRecord> fired = ReadFired(cfg, run_dir);
    if (!fired.empty()) {
      out.fired = true;
      out.truth = fired.front();
      out.truth.kind = f.kind;
      if (!IsCompute(f.kind) && f.kind != FaultKind::kWan)  // a wan elem is a chunk's word
        out.tensor = TensorOf(cfg, f.kind, out.truth.elem);
    }
    ATOLL_ASSIGN_OR_RETURN(RunRecord run, ReadRun(cfg, run_dir));
    Score(run, clean, clean_keys, &out);
    log << out.ToJson() << "\n";
    log.flush();
    if (o.progress) {
      std::string what = !out.fired           ? "did not fire"
                         : !out.error.empty() ? "stopped: " + out.error
                         : out.detected() ? fmt::format("detected after {} step(s){}{}", out.delay,
                                                        out.localized ? ", localized" : "",
                                                        out.recovered ? ", recovered" : "")
                         : out.harm > o.harm ? fmt::format("MISSED, harm {:.3g}", out.harm)
                                             : fmt::format("missed, harm {:.3g}", out.harm);
      o.progress(i + 1, o.injections, out.spec + ": " + what);
    }
    result.outcomes.push_back(std::move(out));
  }
  std::filesystem::remove_all(run_dir);
  if (!log) return Status::Internal(o.dir + "/injections.jsonl: write failed");
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(o.dir + "/bits.csv", CampaignBitsCsv(result)));
  return result;
}

}  // namespace atl
