// Time of one matmul on one GPU: the slowest of moving its data through each level of the memory
// hierarchy and doing its arithmetic, plus a fixed latency.
//
// A port of GPU.matmul_time_seconds in gpu/gpu_model.py of Erdil & Schneider-Joseph's code
// (github ege-erdil/limits_to_distributed_training): the kernel is tiled on the weight matrix
// d1 x d2 at every level (HBM -> L2 -> SM shared memory -> registers), each level keeps 75% of
// its capacity for tiles, the activation matrix (d2 x b, or d1 x b) is streamed once per tile
// row (or column), and Hopper's distributed shared memory lets SMs of a cluster share loads
// instead of each reading L2 (a multicast: one send, a receive per other SM). Arithmetic is
// padded to 8x8x8 tensor-core tiles. As gpu_model.py is at b1f771c.
//
//   time = max(HBM bytes / HBM BW, L2 bytes / L2 BW, SMEM bytes / SMEM BW,
//              padded FLOP / (peak x effective utilization)) + latency_per_matmul
//
// Thread-safety: pure functions.
#pragma once

#include "plan/hardware.h"

namespace atl::plan {

// Bytes moved at each level and FLOP of one matmul.
struct MatmulTraffic {
  double hbm_bytes = 0;     // global memory <-> L2
  double l2_bytes = 0;      // L2 <-> SMs, plus the HBM traffic L2 also serves
  double shared_bytes = 0;  // SM shared memory: L2 <-> SM, SM <-> SM (DSMEM), SM <-> registers
  double flop = 0;          // padded to tensor-core tiles
};

// The matmul Y = W X with W of d1 x d2 and X of d2 x b (also W^T dY); with weight_grads it is
// dW = dY X^T (d1 x b by b x d2), which reads and writes the gradient accumulator instead.
MatmulTraffic MatmulBytes(const Gpu& gpu, double d1, double d2, double b, bool weight_grads);

// Seconds for that matmul (see the formula above).
double MatmulSeconds(const Gpu& gpu, double d1, double d2, double b, bool weight_grads = false);

}  // namespace atl::plan
