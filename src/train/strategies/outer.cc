#include "train/strategies/outer.h"

#include <algorithm>

// No fused multiply-add contraction in this file (see outer.h).
#include "core/fp_exact.h"

namespace atl {

void OuterNesterov(std::span<float> global, std::span<const float> d, std::span<float> momentum,
                   float lr, float mu) {
  const size_t n = global.size();
  float* __restrict g = global.data();
  const float* __restrict x = d.data();
  float* __restrict m = momentum.data();
  for (size_t i = 0; i < n; ++i) {
    const float mi = mu * m[i] + x[i];
    m[i] = mi;
    g[i] = g[i] - lr * (x[i] + mu * mi);
  }
}

void MergeLocal(std::span<float> local, std::span<const float> global, float alpha) {
  if (alpha == 0.0f) {
    std::copy(global.begin(), global.end(), local.begin());
    return;
  }
  const float beta = 1.0f - alpha;
  float* __restrict l = local.data();
  const float* __restrict g = global.data();
  for (size_t i = 0; i < local.size(); ++i) l[i] = alpha * l[i] + beta * g[i];
}

void SubtractInto(std::span<float> out, std::span<const float> global,
                  std::span<const float> mean_delta) {
  for (size_t i = 0; i < out.size(); ++i) out[i] = global[i] - mean_delta[i];
}

}  // namespace atl
