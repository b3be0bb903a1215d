// The arithmetic of the low-communication strategies that every site must compute to the same
// bits: the outer Nesterov step on the global parameters and the merge into a site's replica.
// Compiled without floating-point contraction (outer.cc): under -march=native the compiler would
// fuse a * b + c into one FMA, whose single rounding differs from a multiply then an add, so two
// sites built for different CPUs would hold different global parameters after the same exchange.
// Each expression below is evaluated as written, every operation rounded to float32.
//
// Thread-safety: functions.
#pragma once

#include <span>

namespace atl {

// One outer Nesterov step per element (PyTorch SGD, nesterov=True, dampening 0):
//   m = mu * m + d;  global = global - lr * (d + mu * m).
// REQUIRES: the three spans have the same size.
void OuterNesterov(std::span<float> global, std::span<const float> d, std::span<float> momentum,
                   float lr, float mu);

// Streaming DiLoCo's merge of a fragment into a site's replica:
//   local = alpha * local + (1 - alpha) * global   (alpha = 0: local = global exactly).
// REQUIRES: local.size() == global.size().
void MergeLocal(std::span<float> local, std::span<const float> global, float alpha);

// The plain average that ends a run: out = global - mean_delta, the mean of the sites' replicas
// (the final exchange averages delta = global - local). out may be global.
void SubtractInto(std::span<float> out, std::span<const float> global,
                  std::span<const float> mean_delta);

}  // namespace atl
