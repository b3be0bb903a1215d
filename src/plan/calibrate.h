// Calibration: fit this machine's constants from atoll's own measured training steps, then
// predict each run's step time from its shape (invariant 5: plan/ and the engine speak the same
// vocabulary, so the planner can be checked against what the engine measured).
//
// Inputs per run: RUN/metrics.jsonl (one JSON object per step: step, loss, lr, grad_norm,
// tokens (cumulative), tokens_per_s, step_ms) and the model shape from RUN/config.json (Hugging
// Face GPT-2: n_layer, n_head, n_embd, n_positions, vocab_size), else RUN/config.toml (the
// trainer's [model] and [train] tables), else flags. Per run we take the median step time and
// tokens per step after `skip` warm-up steps, and three features of one step:
//   FLOP    = tokens x (6 P_matmul + 12 L d S)      P_matmul = 12 L d^2 + d V (lm head)
//   matmuls = microbatches x 3 (6 L + 1)             6 per block forward, and the lm head
//   params  = V d + S d + L (12 d^2 + 13 d) + 2 d    (optimizer and gradient passes)
// and fit   step_s = FLOP / F_eff + matmuls x t_matmul + params x t_param
// by non-negative least squares on relative error. A feature joins the fit only if the runs can
// identify it (no more features than distinct runs) and it cuts the RMS error by a quarter.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl::plan {

// Shape values given on the command line take precedence over the run's files.
struct ShapeOverrides {
  std::optional<int64_t> n_layer, n_head, n_embd, seq_len, vocab_size, micro_batch_tokens;
};

struct CalibrationRun {
  std::string metrics_path;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0, vocab_size = 0;
  int64_t micro_batch_tokens = 0;  // tokens per forward/backward
  int steps_used = 0;
  double tokens_per_step = 0;        // median
  double step_s = 0;                 // median measured
  std::array<double, 3> features{};  // FLOP, matmuls, params per step
  double predicted_s = 0;
};

struct CalibrationFit {
  std::array<double, 3> coef{};  // seconds per FLOP, per matmul, per parameter
  std::array<bool, 3> used{};
  double rms_relative_error = 0;
  double max_relative_error = 0;
  double flops_per_s() const { return used[0] && coef[0] > 0 ? 1.0 / coef[0] : 0; }
};

// Reads one run: metrics.jsonl at `metrics_path`, the shape from files beside it or overrides.
StatusOr<CalibrationRun> LoadCalibrationRun(const std::string& metrics_path,
                                            const ShapeOverrides& overrides, int skip);
// The three features of a step of the run's shape with `tokens` tokens.
std::array<double, 3> StepFeatures(const CalibrationRun& run, double tokens);

// Fits the constants and fills each run's prediction.
StatusOr<CalibrationFit> FitCalibration(std::vector<CalibrationRun>* runs);

std::string CalibrationReport(const std::vector<CalibrationRun>& runs, const CalibrationFit& fit);
nlohmann::json CalibrationJson(const std::vector<CalibrationRun>& runs, const CalibrationFit& fit);

}  // namespace atl::plan
