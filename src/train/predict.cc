#include "train/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "data/tokenizer.h"
#include "plan/calibrate.h"
#include "world/codec.h"

namespace atl {
namespace {

using json = nlohmann::json;

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return 0;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return *end == '\0' && x > 0 && x < 1000000 ? int(x) : 0;
}

// The exposed WAN time per step (seconds) of the configured world, for a compute step of
// `step_s` seconds. The world's slowest link and longest latency (one way) over every pair of
// sites bound each exchange (every pair carries its share; a ring's order is chosen at connect
// time).
double WanWait(const RunConfig& cfg, double step_s) {
  const WorldConfig& w = cfg.world;
  const int D = int(w.sites);
  if (D <= 1) return 0;
  double mbps = 0, latency_s = 0;
  for (int a = 0; a < D; ++a)
    for (int b = a + 1; b < D; ++b) {
      const LinkProfile l = w.Link(a, b);
      if (l.bandwidth_mbps > 0)
        mbps = mbps > 0 ? std::min(mbps, l.bandwidth_mbps) : l.bandwidth_mbps;
      latency_s = std::max(latency_s, l.latency_ms * 1e-3);
    }
  const auto transfer = [&](double bytes) { return mbps > 0 ? bytes * 8 / (mbps * 1e6) : 0.0; };
  const double params = double(NumParameters(cfg.model));
  if (w.strategy == "sync") {
    // The ring all-reduce of the gradient (int64 words in the reproducible mode), 2 (D - 1) / D
    // of it through each link, 2 (D - 1) hops; then the losses' all-reduce, 2 (D - 1) more hops.
    const double word = cfg.parallel.reproducible ? 8 : 4;
    return 4.0 * (D - 1) * latency_s + transfer(2.0 * (D - 1) / D * params * word);
  }
  // diloco, streaming: every site sends each peer its piece of the (encoded) exchange and gets
  // the reduced piece back: two one-way trips, 2 x the encoding of n / D floats per link.
  auto codec = ParseCodec(w.codec);
  const Codec c = codec.ok() ? *codec : Codec::kNone;
  const double n = w.strategy == "streaming" ? params / double(w.streaming.fragments) : params;
  const double exchange_s =
      2 * latency_s + transfer(2.0 * double(EncodedBytes(c, size_t(std::ceil(n / D)))));
  const double H = double(std::max<int64_t>(1, w.diloco.inner_steps));
  if (w.strategy == "diloco") return exchange_s / H;
  // streaming: a fragment every H / P steps, overlapped with tau steps of compute.
  const double every = std::max(1.0, H / double(w.streaming.fragments));
  const double hidden = double(w.streaming.overlap_steps) * step_s;
  return std::max(0.0, exchange_s - hidden) / every;
}

// The calibration's seconds per FLOP, per matmul, per parameter and its thread count, or why it
// cannot be used.
bool ReadCalibration(const std::string& path, double coef[3], int* threads, std::string* why) {
  auto text = ReadFile(path);
  const json cal = text.ok() ? json::parse(*text, nullptr, false) : json();
  const std::string fix = fmt::format(
      "fit one with `atoll plan calibrate --metrics RUN/metrics.jsonl ... --save {} --threads N`",
      path);
  if (!text.ok()) {
    *why = fmt::format("no calibration at {}: {}", path, fix);
    return false;
  }
  bool ok =
      cal.is_object() && cal.contains("coef") && cal["coef"].is_array() && cal["coef"].size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    ok = cal["coef"][i].is_number() && cal["coef"][i].get<double>() >= 0 &&
         std::isfinite(cal["coef"][i].get<double>());
    if (ok) coef[i] = cal["coef"][i].get<double>();
  }
  *threads = 1;
  if (ok && cal.contains("threads")) {
    ok = cal["threads"].is_number_integer() && cal["threads"].get<int64_t>() >= 1 &&
         cal["threads"].get<int64_t>() <= 4096;
    if (ok) *threads = int(cal["threads"].get<int64_t>());
  }
  if (!ok) *why = fmt::format("{} is not a calibration (coef, threads): {}", path, fix);
  return ok;
}

}  // namespace

std::string DefaultCalibrationPath() { return CacheDir() + "/calibration.json"; }

std::array<double, 3> RankStepFeatures(const RunConfig& cfg) {
  // The rank's tokens per step: the global batch split over the sites and data-parallel
  // replicas (with world.balance, or after a site is lost, a site's share differs).
  const double replicas = double(cfg.world.sites * cfg.parallel.dp);
  plan::CalibrationRun shape;
  shape.n_layer = cfg.model.n_layer;
  shape.n_head = cfg.model.n_head;
  shape.n_embd = cfg.model.n_embd;
  shape.seq_len = cfg.model.seq_len;
  shape.vocab_size = cfg.model.vocab_size;
  shape.micro_batch_tokens = cfg.train.micro_batch_size * cfg.model.seq_len;
  return plan::StepFeatures(shape, double(cfg.train.batch_size) / replicas * cfg.model.seq_len);
}

int ProcsOnHost() {
  if (const int n = EnvInt("ATOLL_LOCAL_PROCS")) return n;
  if (const int n = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE")) return n;
  return 1;
}

StepPrediction PredictStep(const RunConfig& cfg, int threads, int procs_on_host, int cores,
                           const std::string& calibration_path) {
  StepPrediction p;
  double coef[3] = {0, 0, 0};
  int cal_threads = 1;
  if (cfg.parallel.tp > 1 || cfg.parallel.pp > 1) {
    p.basis =
        "not predicted for tensor- or pipeline-parallel ranks (their share of the model, "
        "the bubble and the point-to-point waits are not in the fit)";
  } else if (ReadCalibration(calibration_path, coef, &cal_threads, &p.basis)) {
    const auto f = RankStepFeatures(cfg);
    const double alone = coef[0] * f[0] + coef[1] * f[1] + coef[2] * f[2];
    // Cores this rank gets: its threads, unless the host's processes want more than it has.
    const double want = double(procs_on_host) * threads;
    const double share = want > cores ? double(threads) * cores / want : double(threads);
    p.parts.compute_s = alone / (share / double(cal_threads));
    p.have_compute = true;
    p.basis = fmt::format(
        "calibration {} ({} thread{}; {:.3g} FLOP/s); this rank: {} thread{}, {} process{} on "
        "{} cores",
        calibration_path, cal_threads, cal_threads == 1 ? "" : "s", coef[0] > 0 ? 1 / coef[0] : 0.0,
        threads, threads == 1 ? "" : "s", procs_on_host, procs_on_host == 1 ? "" : "es", cores);
  }
  // Async pushes are not modelled; streaming's hiding needs the compute part.
  p.have_wan = cfg.world.sites <= 1 || (cfg.world.strategy != "async" &&
                                        (cfg.world.strategy != "streaming" || p.have_compute));
  if (p.have_wan) p.parts.wan_s = WanWait(cfg, p.parts.compute_s);
  return p;
}

StepParts MeasuredParts(const std::vector<double>& step_ms, const std::vector<double>& wan_ms,
                        double in_site_s, int skip) {
  StepParts m;
  std::vector<double> compute;
  double wan_sum = 0;
  size_t wan_n = 0;
  const size_t n = std::min(step_ms.size(), wan_ms.size());
  for (size_t i = size_t(std::max(0, skip)); i < n; ++i) {
    compute.push_back((step_ms[i] - wan_ms[i]) * 1e-3);
    // The WAN wait lands on the exchange steps only: its mean spreads it as the prediction does.
    // The last step also carries the final whole-model exchange: not a step's share.
    if (i + 1 < n || n - size_t(std::max(0, skip)) == 1) {
      wan_sum += wan_ms[i] * 1e-3;
      ++wan_n;
    }
  }
  m.in_site_s = in_site_s;
  m.compute_s = std::max(0.0, Median(compute) - in_site_s);
  m.wan_s = wan_n > 0 ? wan_sum / double(wan_n) : 0.0;
  return m;
}

std::string DescribePrediction(const StepPrediction& p) {
  if (!p.have_compute)
    return p.have_wan ? fmt::format(
                            "predicted WAN wait {:.1f} ms per step; compute not "
                            "predicted: {}",
                            p.parts.wan_s * 1e3, p.basis)
                      : fmt::format("step time not predicted: {}", p.basis);
  return fmt::format(
      "predicted step {:.1f} ms = compute {:.1f} + in-site communication {:.1f} + WAN wait "
      "{:.1f} ({})",
      p.parts.total() * 1e3, p.parts.compute_s * 1e3, p.parts.in_site_s * 1e3, p.parts.wan_s * 1e3,
      p.basis);
}

std::string DescribeComparison(const StepPrediction& p, const StepParts& m) {
  std::string out =
      "step time, predicted against measured (per step: compute, the median; WAN wait, the mean):";
  const auto line = [&](const char* part, double pred, double meas, bool have) {
    out += fmt::format("\n  {:<24} {:>10} {:>10.1f} ms {:>8}", part,
                       have ? fmt::format("{:.1f} ms", pred * 1e3) : "-", meas * 1e3,
                       have && pred > 0 ? fmt::format("x{:.2f}", meas / pred) : "");
  };
  line("compute", p.parts.compute_s, m.compute_s, p.have_compute);
  line("in-site communication", p.parts.in_site_s, m.in_site_s, true);
  line("WAN wait", p.parts.wan_s, m.wan_s, p.have_wan);
  line("total", p.parts.total(), m.total(), p.have_compute && p.have_wan);
  return out;
}

std::string ComparisonJson(const StepPrediction& p, const StepParts& m) {
  const auto row = [](const char* part, double pred, double meas, bool have) {
    return json{{"part", part},
                {"predicted_ms", have ? json(pred * 1e3) : json(nullptr)},
                {"measured_ms", meas * 1e3}};
  };
  json rows = json::array({row("compute", p.parts.compute_s, m.compute_s, p.have_compute),
                           row("in-site communication", p.parts.in_site_s, m.in_site_s, true),
                           row("WAN wait", p.parts.wan_s, m.wan_s, p.have_wan),
                           row("total", p.parts.total(), m.total(), p.have_compute && p.have_wan)});
  return rows.dump(2) + "\n";
}

}  // namespace atl
