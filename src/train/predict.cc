#include "train/predict.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "data/tokenizer.h"
#include "plan/calibrate.h"

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
// `step_s` seconds.
double WanWait(const RunConfig& cfg, double step_s) {
  const WorldConfig& w = cfg.world;
  const int D = int(w.sites);
  if (D <= 1 || w.strategy == "async") return 0;
  // The ring's slowest link and largest latency (one way).
  double mbps = 0, latency_ms = 0;
  for (int a = 0; a < D; ++a) {
    const LinkProfile l = w.Link(a, (a + 1) % D);
    if (l.bandwidth_mbps > 0) mbps = mbps > 0 ? std::min(mbps, l.bandwidth_mbps) : l.bandwidth_mbps;
    latency_ms = std::max(latency_ms, l.latency_ms);
  }
  const double params = double(NumParameters(cfg.model));
  const bool sync = w.strategy == "sync";
  const double bits = sync || w.codec == "none" ? 32
                      : w.codec == "bf16"       ? 16
                      : w.codec == "int8"       ? 8
                                                : 4;
  const double fragment = w.strategy == "streaming" ? 1.0 / double(w.streaming.fragments) : 1.0;
  const double bytes = 2.0 * (D - 1) / D * params * fragment * bits / 8;
  const double exchange_s =
      2.0 * (D - 1) * latency_ms * 1e-3 + (mbps > 0 ? bytes * 8 / (mbps * 1e6) : 0);
  if (sync) return exchange_s;
  const double H = double(std::max<int64_t>(1, w.diloco.inner_steps));
  if (w.strategy == "diloco") return exchange_s / H;
  // streaming: a fragment every H / P steps, overlapped with tau steps of compute.
  const double every = std::max(1.0, H / double(w.streaming.fragments));
  const double hidden = double(w.streaming.overlap_steps) * step_s;
  return std::max(0.0, exchange_s - hidden) / every;
}

}  // namespace

std::string DefaultCalibrationPath() { return CacheDir() + "/calibration.json"; }

int ProcsOnHost() {
  if (const int n = EnvInt("ATOLL_LOCAL_PROCS")) return n;
  if (const int n = EnvInt("OMPI_COMM_WORLD_LOCAL_SIZE")) return n;
  return 1;
}

StepPrediction PredictStep(const RunConfig& cfg, int threads, int procs_on_host, int cores,
                           const std::string& calibration_path) {
  StepPrediction p;
  auto text = ReadFile(calibration_path);
  json cal = text.ok() ? json::parse(*text, nullptr, false) : json();
  if (!cal.is_object() || !cal.contains("coef") || !cal["coef"].is_array() ||
      cal["coef"].size() != 3) {
    p.basis = fmt::format(
        "no calibration at {}: fit one with `atoll plan calibrate --save --metrics "
        "RUN/metrics.jsonl "
        "...`",
        calibration_path);
  } else {
    // The rank's tokens per step: the global batch split over the sites and data-parallel
    // replicas (tensor and pipeline ranks share theirs).
    const double replicas = double(cfg.world.sites * cfg.parallel.dp);
    const double seq = double(cfg.model.seq_len);
    plan::CalibrationRun shape;
    shape.n_layer = cfg.model.n_layer;
    shape.n_head = cfg.model.n_head;
    shape.n_embd = cfg.model.n_embd;
    shape.seq_len = cfg.model.seq_len;
    shape.vocab_size = cfg.model.vocab_size;
    shape.micro_batch_tokens = cfg.train.micro_batch_size * cfg.model.seq_len;
    const auto f = plan::StepFeatures(shape, double(cfg.train.batch_size) / replicas * seq);
    double alone = 0;
    for (int i = 0; i < 3; ++i) alone += cal["coef"][size_t(i)].get<double>() * f[size_t(i)];
    const int cal_threads = cal.value("threads", 1);
    // Cores this rank gets: its threads, unless the host's processes want more than it has.
    const double want = double(procs_on_host) * threads;
    const double share = want > cores ? double(threads) * cores / want : double(threads);
    const double speedup = share / double(cal_threads);
    p.parts.compute_s = alone / speedup;
    p.have_compute = true;
    p.basis = fmt::format(
        "calibration {} ({} thread{}; {:.3g} FLOP/s); this rank: {} thread{}, {} process{} on "
        "{} cores",
        calibration_path, cal_threads, cal_threads == 1 ? "" : "s",
        cal["coef"][0].get<double>() > 0 ? 1 / cal["coef"][0].get<double>() : 0.0, threads,
        threads == 1 ? "" : "s", procs_on_host, procs_on_host == 1 ? "" : "es", cores);
  }
  p.parts.wan_s = WanWait(cfg, p.parts.compute_s);
  return p;
}

StepParts MeasuredParts(const std::vector<double>& step_ms, const std::vector<double>& wan_ms,
                        double in_site_s, int skip) {
  StepParts m;
  std::vector<double> compute, wan;
  for (size_t i = size_t(std::max(0, skip)); i < step_ms.size() && i < wan_ms.size(); ++i) {
    compute.push_back((step_ms[i] - wan_ms[i]) * 1e-3);
    wan.push_back(wan_ms[i] * 1e-3);
  }
  m.in_site_s = in_site_s;
  m.compute_s = std::max(0.0, Median(compute) - in_site_s);
  m.wan_s = Median(wan);
  return m;
}

std::string DescribePrediction(const StepPrediction& p) {
  if (!p.have_compute)
    return fmt::format("predicted WAN wait {:.1f} ms per step; compute not predicted: {}",
                       p.parts.wan_s * 1e3, p.basis);
  return fmt::format(
      "predicted step {:.1f} ms = compute {:.1f} + in-site communication {:.1f} + WAN wait "
      "{:.1f} ({})",
      p.parts.total() * 1e3, p.parts.compute_s * 1e3, p.parts.in_site_s * 1e3, p.parts.wan_s * 1e3,
      p.basis);
}

std::string DescribeComparison(const StepPrediction& p, const StepParts& m) {
  std::string out = "step time, predicted against measured (median per step):";
  const auto line = [&](const char* part, double pred, double meas, bool have) {
    out += fmt::format("\n  {:<24} {:>10} {:>10.1f} ms {:>8}", part,
                       have ? fmt::format("{:.1f} ms", pred * 1e3) : "-", meas * 1e3,
                       have && pred > 0 ? fmt::format("x{:.2f}", meas / pred) : "");
  };
  line("compute", p.parts.compute_s, m.compute_s, p.have_compute);
  line("in-site communication", p.parts.in_site_s, m.in_site_s, true);
  line("WAN wait", p.parts.wan_s, m.wan_s, true);
  line("total", p.parts.total(), m.total(), p.have_compute);
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
                           row("WAN wait", p.parts.wan_s, m.wan_s, true),
                           row("total", p.parts.total(), m.total(), p.have_compute)});
  return rows.dump(2) + "\n";
}

}  // namespace atl
