#include "plan/calibrate.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <sstream>

#include "core/file.h"
#include "plan/table.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Fills shape fields from RUN/config.json (HF GPT-2) if present, else RUN/config.toml.
Status ReadShapeFiles(const std::string& dir, CalibrationRun* run) {
  const std::string json_path = dir + "/config.json";
  const std::string toml_path = dir + "/config.toml";
  if (FileExists(json_path)) {
    ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(json_path));
    nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::Corruption(json_path + ": not a JSON object");
    }
    auto get = [&](const char* key, int64_t* out) {
      if (j.contains(key) && j[key].is_number_integer()) *out = j[key].get<int64_t>();
    };
    get("n_layer", &run->n_layer);
    get("n_head", &run->n_head);
    get("n_embd", &run->n_embd);
    get("n_positions", &run->seq_len);
    if (run->seq_len == 0) get("n_ctx", &run->seq_len);
    get("vocab_size", &run->vocab_size);
  }
  if (FileExists(toml_path)) {
    ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(toml_path));
    toml::table t;
    try {
      t = toml::parse(text, toml_path);
    } catch (const toml::parse_error& e) {
      return Status::Corruption(fmt::format("{}: {}", toml_path, e.description()));
    }
    auto get = [&](const char* section, const char* key, int64_t* out) {
      if (*out != 0) return;  // config.json wins
      if (auto v = t[section][key].value<int64_t>()) *out = *v;
    };
    get("model", "n_layer", &run->n_layer);
    get("model", "n_head", &run->n_head);
    get("model", "n_embd", &run->n_embd);
    get("model", "seq_len", &run->seq_len);
    get("model", "vocab_size", &run->vocab_size);
    int64_t micro = 0;
    get("train", "micro_batch_size", &micro);
    if (micro > 0 && run->seq_len > 0 && run->micro_batch_tokens == 0) {
      run->micro_batch_tokens = micro * run->seq_len;
    }
  }
  return Status::Ok();
}

// Least squares on the chosen columns, rows weighted by 1/y (relative error), by normal
// equations (at most 3 unknowns). Returns false if singular or any coefficient is negative.
bool SolveSubset(const std::vector<CalibrationRun>& runs, const std::array<bool, 3>& use,
                 std::array<double, 3>* coef) {
  std::vector<int> cols;
  for (int c = 0; c < 3; ++c) {
    if (use[c]) cols.push_back(c);
  }
  const size_t k = cols.size();
  // Scale columns to unit size for conditioning.
  std::array<double, 3> scale{1, 1, 1};
  for (int c : cols) {
    double m = 0;
    for (const auto& r : runs) m = std::max(m, std::fabs(r.features[c] / r.step_s));
    scale[c] = m > 0 ? m : 1;
  }
  double a[3][4] = {};
  for (const auto& r : runs) {
    double x[3];
    for (size_t i = 0; i < k; ++i) x[i] = r.features[cols[i]] / r.step_s / scale[cols[i]];
    for (size_t i = 0; i < k; ++i) {
      for (size_t j = 0; j < k; ++j) a[i][j] += x[i] * x[j];
      a[i][k] += x[i];  // y / y = 1
    }
  }
  for (size_t i = 0; i < k; ++i) {  // Gauss-Jordan with partial pivoting
    size_t p = i;
    for (size_t r = i + 1; r < k; ++r) {
      if (std::fabs(a[r][i]) > std::fabs(a[p][i])) p = r;
    }
    if (std::fabs(a[p][i]) < 1e-12) return false;
    for (size_t c = 0; c <= k; ++c) std::swap(a[i][c], a[p][c]);
    for (size_t r = 0; r < k; ++r) {
      if (r == i) continue;
      double f = a[r][i] / a[i][i];
      for (size_t c = i; c <= k; ++c) a[r][c] -= f * a[i][c];
    }
  }
  *coef = {0, 0, 0};
  for (size_t i = 0; i < k; ++i) {
    double v = a[i][k] / a[i][i] / scale[cols[i]];
    if (!(v >= 0)) return false;
    (*coef)[cols[i]] = v;
  }
  return true;
}

double RmsRelative(const std::vector<CalibrationRun>& runs, const std::array<double, 3>& coef) {
  double sum = 0;
  for (const auto& r : runs) {
    double pred = coef[0] * r.features[0] + coef[1] * r.features[1] + coef[2] * r.features[2];
    double e = (pred - r.step_s) / r.step_s;
    sum += e * e;
  }
  return std::sqrt(sum / static_cast<double>(runs.size()));
}

}  // namespace

std::array<double, 3> StepFeatures(const CalibrationRun& r, double tokens) {
  const double l = static_cast<double>(r.n_layer), d = static_cast<double>(r.n_embd);
  const double v = static_cast<double>(r.vocab_size), s = static_cast<double>(r.seq_len);
  const double matmul_params = 12 * l * d * d + d * v;
  const double flop = tokens * (6 * matmul_params + 12 * l * d * s);
  const double micro =
      r.micro_batch_tokens > 0 ? static_cast<double>(r.micro_batch_tokens) : tokens;
  const double microbatches = std::max(1.0, std::round(tokens / micro));
  const double matmuls = microbatches * 3 * (6 * l + 1);
  const double params = v * d + s * d + l * (12 * d * d + 13 * d) + 2 * d;
  return {flop, matmuls, params};
}

StatusOr<CalibrationRun> LoadCalibrationRun(const std::string& metrics_path,
                                            const ShapeOverrides& o, int skip) {
  CalibrationRun run;
  run.metrics_path = metrics_path;
  if (!FileExists(metrics_path)) {
    return Status::NotFound(fmt::format("{}: no such metrics file", metrics_path));
  }
  const std::filesystem::path parent = std::filesystem::path(metrics_path).parent_path();
  const std::string dir = parent.empty() ? std::string(".") : parent.string();
  ATOLL_RETURN_IF_ERROR(ReadShapeFiles(dir, &run));
  if (o.n_layer) run.n_layer = *o.n_layer;
  if (o.n_head) run.n_head = *o.n_head;
  if (o.n_embd) run.n_embd = *o.n_embd;
  if (o.seq_len) run.seq_len = *o.seq_len;
  if (o.vocab_size) run.vocab_size = *o.vocab_size;
  if (o.micro_batch_tokens) run.micro_batch_tokens = *o.micro_batch_tokens;
  std::string missing;
  auto need = [&](int64_t v, const char* name) {
    if (v <= 0) missing += fmt::format("{}{}", missing.empty() ? "" : ", ", name);
  };
  need(run.n_layer, "n_layer (--n-layer)");
  need(run.n_head, "n_head (--n-head)");
  need(run.n_embd, "n_embd (--n-embd)");
  need(run.seq_len, "n_positions (--seq-len)");
  need(run.vocab_size, "vocab_size (--vocab-size)");
  if (!missing.empty()) {
    return Status::InvalidArgument(fmt::format(
        "{}: model shape unknown: {} not found in {}/config.json or config.toml; give the flags",
        metrics_path, missing, dir));
  }

  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(metrics_path));
  std::istringstream in(text);
  std::string line;
  int lineno = 0;
  std::vector<double> times, tokens;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) {
      return Status::Corruption(fmt::format("{}:{}: not a JSON object", metrics_path, lineno));
    }
    for (const char* key : {"step", "tokens_per_s", "step_ms"}) {
      if (!j.contains(key) || !j[key].is_number()) {
        return Status::Corruption(
            fmt::format("{}:{}: missing numeric '{}'", metrics_path, lineno, key));
      }
    }
    if (j["step"].get<double>() <= skip) continue;
    double ms = j["step_ms"].get<double>();
    double tps = j["tokens_per_s"].get<double>();
    if (!(ms > 0) || !(tps > 0)) continue;
    times.push_back(ms / 1000.0);
    tokens.push_back(tps * ms / 1000.0);
  }
  if (times.empty()) {
    return Status::InvalidArgument(fmt::format(
        "{}: no steps after the first {} (warm-up) with positive step_ms and tokens_per_s",
        metrics_path, skip));
  }
  run.steps_used = static_cast<int>(times.size());
  run.step_s = Median(times);
  run.tokens_per_step = std::round(Median(tokens));
  run.features = StepFeatures(run, run.tokens_per_step);
  return run;
}

StatusOr<CalibrationFit> FitCalibration(std::vector<CalibrationRun>* runs) {
  if (runs->empty()) return Status::InvalidArgument("calibration needs at least one run");
  // Distinct runs bound how many constants the data can identify.
  std::vector<std::array<double, 3>> distinct;
  for (const auto& r : *runs) {
    bool seen = false;
    for (const auto& f : distinct) {
      seen = seen || (std::fabs(f[0] / r.features[0] - 1) < 1e-9 &&
                      std::fabs(f[1] / r.features[1] - 1) < 1e-9 &&
                      std::fabs(f[2] / r.features[2] - 1) < 1e-9);
    }
    if (!seen) distinct.push_back(r.features);
  }
  const size_t max_k = std::min<size_t>(3, distinct.size());
  CalibrationFit best;
  double best_rms = -1;
  for (size_t k = 1; k <= max_k; ++k) {
    CalibrationFit size_best;
    double size_rms = -1;
    for (int mask = 1; mask < 8; ++mask) {
      std::array<bool, 3> use = {(mask & 1) != 0, (mask & 2) != 0, (mask & 4) != 0};
      if (static_cast<size_t>(use[0] + use[1] + use[2]) != k) continue;
      if (!use[0]) continue;  // arithmetic is always part of the model
      std::array<double, 3> coef;
      if (!SolveSubset(*runs, use, &coef)) continue;
      double rms = RmsRelative(*runs, coef);
      if (size_rms < 0 || rms < size_rms) {
        size_rms = rms;
        size_best.coef = coef;
        size_best.used = use;
      }
    }
    if (size_rms < 0) continue;
    if (best_rms < 0 || size_rms < 0.75 * best_rms) {
      best = size_best;
      best_rms = size_rms;
    }
  }
  if (best_rms < 0) return Status::Internal("calibration: no non-negative fit found");
  best.rms_relative_error = best_rms;
  for (auto& r : *runs) {
    r.predicted_s =
        best.coef[0] * r.features[0] + best.coef[1] * r.features[1] + best.coef[2] * r.features[2];
    best.max_relative_error =
        std::max(best.max_relative_error, std::fabs(r.predicted_s - r.step_s) / r.step_s);
  }
  return best;
}

std::string CalibrationReport(const std::vector<CalibrationRun>& runs, const CalibrationFit& f) {
  TextTable t;
  t.AddColumn("run", TextTable::Align::kLeft);
  for (const char* h :
       {"layers", "n_embd", "seq", "tokens/step", "steps", "measured", "predicted", "error"}) {
    t.AddColumn(h);
  }
  for (const auto& r : runs) {
    t.AddRow({r.metrics_path, std::to_string(r.n_layer), std::to_string(r.n_embd),
              std::to_string(r.seq_len), FormatCount(r.tokens_per_step),
              std::to_string(r.steps_used), FormatSeconds(r.step_s), FormatSeconds(r.predicted_s),
              fmt::format("{:+.1f}%", (r.predicted_s - r.step_s) / r.step_s * 100)});
  }
  std::string out = t.Render();
  out += "\nfitted constants (step = FLOP / F + matmuls x t_matmul + params x t_param):\n";
  out += fmt::format("  effective FLOP/s F:      {}\n",
                     f.used[0] ? fmt::format("{:.4g} GFLOP/s", f.flops_per_s() / 1e9) : "-");
  out += fmt::format("  overhead per matmul:     {}\n",
                     f.used[1] ? FormatSeconds(f.coef[1]) : "not identifiable from these runs");
  out += fmt::format(
      "  time per parameter/step: {}\n",
      f.used[2] ? fmt::format("{:.3g} ns", f.coef[2] * 1e9) : "not identifiable from these runs");
  out += fmt::format(
      "RMS error {:.1f}%, worst {:.1f}% -> {}\n", f.rms_relative_error * 100,
      f.max_relative_error * 100,
      f.max_relative_error <= 0.15 ? "every run within 15%" : "some runs off by more than 15%");
  return out;
}

nlohmann::json CalibrationJson(const std::vector<CalibrationRun>& runs, const CalibrationFit& f) {
  nlohmann::json rs = nlohmann::json::array();
  for (const auto& r : runs) {
    rs.push_back({{"metrics", r.metrics_path},
                  {"n_layer", r.n_layer},
                  {"n_head", r.n_head},
                  {"n_embd", r.n_embd},
                  {"seq_len", r.seq_len},
                  {"vocab_size", r.vocab_size},
                  {"micro_batch_tokens", r.micro_batch_tokens},
                  {"tokens_per_step", r.tokens_per_step},
                  {"steps_used", r.steps_used},
                  {"measured_step_s", r.step_s},
                  {"predicted_step_s", r.predicted_s},
                  {"flop_per_step", r.features[0]},
                  {"matmuls_per_step", r.features[1]},
                  {"params", r.features[2]}});
  }
  auto maybe = [&](int i, double v) -> nlohmann::json {
    return f.used[i] ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  return {{"runs", rs},
          {"effective_flops_per_s", maybe(0, f.flops_per_s())},
          {"matmul_overhead_s", maybe(1, f.coef[1])},
          {"per_param_s", maybe(2, f.coef[2])},
          {"rms_relative_error", f.rms_relative_error},
          {"max_relative_error", f.max_relative_error}};
}

}  // namespace atl::plan
