#include "plan/shape.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

namespace atl::plan {
namespace {

// Sorted {f * 2^i : f in {1,3,5,7,9}, 0 <= i < 60}; duplicates (e.g. 1*2^3 and ... none, since f
// is odd) cannot occur, so the list has 300 distinct entries.
const std::vector<int64_t>& SmoothList() {
  static const std::vector<int64_t> list = [] {
    std::vector<int64_t> v;
    for (int64_t f : {1, 3, 5, 7, 9}) {
      for (int i = 0; i < 60; ++i) v.push_back(f << i);
    }
    std::sort(v.begin(), v.end());
    return v;
  }();
  return list;
}

constexpr double kFourMi = 2048.0 * 2048.0;  // 4 Mi tokens: the paper's reference batch

}  // namespace

StatusOr<BatchRule> ParseBatchRule(std::string_view name) {
  if (name == "default") return BatchRule::kDefault;
  if (name == "fixed") return BatchRule::kFixed;
  if (name == "deepseek") return BatchRule::kDeepSeek;
  return Status::InvalidArgument(
      fmt::format("unknown batch rule '{}' (expected default, fixed or deepseek)", name));
}

std::string BatchRuleName(BatchRule rule) {
  switch (rule) {
    case BatchRule::kDefault:
      return "default";
    case BatchRule::kFixed:
      return "fixed";
    case BatchRule::kDeepSeek:
      return "deepseek";
  }
  return "?";
}

int64_t RoundToSmooth(double x) {
  const auto& list = SmoothList();
  // bisect_left, then the nearer neighbour; on a tie the smaller (reference take_closest).
  auto it = std::lower_bound(list.begin(), list.end(), x,
                             [](int64_t a, double b) { return static_cast<double>(a) < b; });
  if (it == list.begin()) return list.front();
  if (it == list.end()) return list.back();
  int64_t after = *it;
  int64_t before = *(it - 1);
  return (static_cast<double>(after) - x < x - static_cast<double>(before)) ? after : before;
}

int64_t LayersFor(int64_t d_model, int64_t d_ff) {
  double x = static_cast<double>(d_model) * static_cast<double>(d_ff);
  return RoundToSmooth(0.10056 * std::pow(x, 0.3751));
}

int64_t SparsityFor(int64_t d_model, int64_t d_ff) {
  double x = static_cast<double>(d_model) * static_cast<double>(d_ff);
  return RoundToSmooth(8.0 * std::sqrt(x / (4.0 * 12288.0 * 12288.0)));
}

int64_t CriticalBatchSequences(double compute, int64_t seq_len, int64_t sparsity, BatchRule rule) {
  double e = static_cast<double>(sparsity);
  double len = static_cast<double>(seq_len);
  switch (rule) {
    case BatchRule::kFixed:
      // "No scaling": 2^22 // seq_len sequences whatever the sparsity.
      return std::max<int64_t>(1, (int64_t{1} << 22) / seq_len);
    case BatchRule::kDeepSeek: {
      double bs = (1.0 / len) * std::sqrt(e) * 0.2920 * std::pow(compute, 0.3271);
      return sparsity * RoundToSmooth(bs / e);
    }
    case BatchRule::kDefault:
    default: {
      double bs = std::sqrt(e) * std::pow(compute / 3e23, 1.0 / 6.0) * kFourMi / len;
      return sparsity * RoundToSmooth(bs / e);
    }
  }
}

ModelShape ShapeForWidth(int64_t d_model, const ShapeRules& rules) {
  ModelShape s;
  s.d_model = d_model;
  s.d_ff = 4 * d_model;
  s.layers = LayersFor(s.d_model, s.d_ff);
  s.experts = rules.sparse ? SparsityFor(s.d_model, s.d_ff) : 1;
  s.seq_len = rules.seq_len;
  s.params = 2.0 * static_cast<double>(s.d_model) * static_cast<double>(s.d_ff) *
             static_cast<double>(s.layers) * static_cast<double>(s.experts);
  s.active_params = s.params / static_cast<double>(s.experts);
  s.tokens = rules.tokens_per_param * s.params;
  s.compute = 6.0 * s.active_params * s.tokens;
  s.batch_sequences = CriticalBatchSequences(s.compute, s.seq_len, s.experts, rules.batch);
  return s;
}

StatusOr<ModelShape> ShapeForParams(double params, const ShapeRules& rules) {
  if (!(params >= 1e6) || !std::isfinite(params)) {
    return Status::InvalidArgument(
        fmt::format("parameter count must be at least 1M, got {}", params));
  }
  // Start from the continuous solution, then try nearby multiples of 1024.
  double lo = 1, hi = 1e9;
  for (int it = 0; it < 200; ++it) {
    double mid = std::sqrt(lo * hi);
    double p = SmoothShapeForWidthProduct(4 * mid * mid, rules).params;
    (p < params ? lo : hi) = mid;
  }
  int64_t guess = std::max<int64_t>(1, static_cast<int64_t>(std::llround(lo / 1024.0)));
  ModelShape best;
  double best_err = -1;
  for (int64_t k = std::max<int64_t>(1, guess - 8); k <= guess + 8; ++k) {
    ModelShape s = ShapeForWidth(k * 1024, rules);
    double err = std::fabs(std::log(s.params / params));
    if (best_err < 0 || err < best_err) {
      best = s;
      best_err = err;
    }
  }
  return best;
}

std::vector<int64_t> WidthGrid(int64_t lo, int64_t hi) {
  std::vector<int64_t> v;
  for (int64_t f = 1; f <= 15; f += 2) {
    for (int i = 8; i < 40; ++i) {
      int64_t d = f << i;
      if (d >= lo && d <= hi) v.push_back(d);
    }
  }
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  return v;
}

SmoothShape SmoothShapeForWidthProduct(double x, const ShapeRules& rules) {
  SmoothShape s;
  s.layers = 0.10056 * std::pow(x, 0.3751);
  s.experts = rules.sparse ? 8.0 * std::sqrt(x / (4.0 * 12288.0 * 12288.0)) : 1.0;
  s.params = 2.0 * x * s.layers * s.experts;
  s.tokens = rules.tokens_per_param * s.params;
  s.compute = 6.0 * (s.params / s.experts) * s.tokens;
  switch (rules.batch) {
    case BatchRule::kFixed:
      s.batch_tokens = kFourMi;
      break;
    case BatchRule::kDeepSeek:
      s.batch_tokens = std::sqrt(s.experts) * 0.2920 * std::pow(s.compute, 0.3271);
      break;
    case BatchRule::kDefault:
    default:
      s.batch_tokens = std::sqrt(s.experts) * std::pow(s.compute / 3e23, 1.0 / 6.0) * kFourMi;
  }
  return s;
}

}  // namespace atl::plan
