// Model shape and scaling rules of the data-movement model (Erdil & Schneider-Joseph, arXiv
// 2411.01137; reference code optimal_parallelism.ipynb, "Scaling functions" cell).
//
// Only the MLP weights are counted, as in the paper: a layer holds two d_model x d_ff matrices,
// d_ff = 4 d_model, and a mixture of experts multiplies them by the sparsity factor E:
//   N = 2 d_model d_ff L E,  D = 20 N (Chinchilla),  C = 6 (N / E) D.
// Depth, sparsity and batch size are rounded to numbers of the form f * 2^i, f in {1,3,5,7,9},
// so that parallel degrees that are powers of two divide them.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl::plan {

// Critical batch size rule.
enum class BatchRule {
  kDefault,   // B = sqrt(E) (C / 3e23)^(1/6) x 4 Mi tokens   (the paper's baseline)
  kFixed,     // B = 4 Mi tokens                              ("no scaling")
  kDeepSeek,  // B = sqrt(E) x 0.2920 C^0.3271 tokens         (DeepSeek LLM's fit)
};
StatusOr<BatchRule> ParseBatchRule(std::string_view name);
std::string BatchRuleName(BatchRule rule);

struct ShapeRules {
  BatchRule batch = BatchRule::kDefault;
  bool sparse = false;           // mixture of experts with the paper's sparsity rule
  int64_t seq_len = 2048;        // tokens per sequence
  double tokens_per_param = 20;  // Chinchilla
};

// The number in {f * 2^i : f in {1,3,5,7,9}, 0 <= i < 60} closest to x; ties go to the smaller.
// (optimal_parallelism.ipynb: rounding_list and take_closest.)
int64_t RoundToSmooth(double x);

// L = 0.10056 (d_model d_ff)^0.3751, rounded: a power-law fit to Hoffmann et al. (2022) shapes.
int64_t LayersFor(int64_t d_model, int64_t d_ff);
// E = 8 sqrt(d_model d_ff / (4 * 12288^2)), rounded: the paper's sparse-model rule.
int64_t SparsityFor(int64_t d_model, int64_t d_ff);
// Critical batch size in sequences for a run of `compute` FLOP (reference:
// critical_batch_size, critical_batch_size_deepseek; the fixed rule is 2^22 / seq_len).
int64_t CriticalBatchSequences(double compute, int64_t seq_len, int64_t sparsity, BatchRule rule);

// A model and its compute-optimal training run.
struct ModelShape {
  int64_t d_model = 0;
  int64_t d_ff = 0;
  int64_t layers = 0;
  int64_t experts = 1;  // sparsity factor E (1 = dense)
  int64_t seq_len = 2048;
  int64_t batch_sequences = 0;
  double params = 0;         // N, all experts
  double active_params = 0;  // N / E
  double tokens = 0;         // D
  double compute = 0;        // C = 6 (N/E) D, FLOP

  int64_t batch_tokens() const { return batch_sequences * seq_len; }
  double steps() const { return tokens / static_cast<double>(batch_tokens()); }
};

// The shape for a given width (d_ff = 4 d_model) under the rules.
ModelShape ShapeForWidth(int64_t d_model, const ShapeRules& rules);
// A width, a multiple of 1024, whose shape has the parameter count closest to `params`.
StatusOr<ModelShape> ShapeForParams(double params, const ShapeRules& rules);
// Widths swept by the frontier: {f * 2^i : f odd in 1..15, i >= 8} in [lo, hi], sorted: eight
// per octave from 2048 up (the reference's d_model_list takes i >= 11, which thins it below
// 2^14).
std::vector<int64_t> WidthGrid(int64_t lo, int64_t hi);

// Continuous (unrounded) versions of the rules, used by the closed forms: for a model width
// product X = d_model d_ff, the layers, sparsity, params, compute and batch in tokens.
struct SmoothShape {
  double layers, experts, params, tokens, compute, batch_tokens;
};
SmoothShape SmoothShapeForWidthProduct(double x, const ShapeRules& rules);

}  // namespace atl::plan
