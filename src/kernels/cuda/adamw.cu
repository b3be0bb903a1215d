// The optimizer's kernels: AdamW over the flat buffers (with what each step moved), the
// gradient's sum of squares, and sums of squares over segments.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kSquareChunk = int64_t(1) << 16;  // elements per block of GradSquaredSum

// One thread per state element: finds its segment (binary search on the segments' ends), then
// the update of train/optimizer.h.
__global__ void AdamWKernel(float* params, const float* grads, float* m, float* v, float* deltas,
                            const AdamSegment* segments, int num_segments, uint64_t n,
                            AdamScalars s) {
  const uint64_t i = uint64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  int lo = 0, hi = num_segments;  // the first segment whose end is above i
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (segments[mid].end <= i)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo == num_segments || i < segments[lo].begin) return;  // outside every tensor
  const AdamSegment seg = segments[lo];
  const float g = grads[i] * s.grad_scale;
  const float mi = s.beta1 * m[i] + s.one_minus_beta1 * g;
  const float vi = s.beta2 * v[i] + s.one_minus_beta2 * (g * g);
  m[i] = mi;
  v[i] = vi;
  const float denom = sqrtf(vi) * s.inv_bc2_sqrt + s.eps;
  float* p = params + (i + seg.shift);  // unsigned: shift may wrap
  const float keep = seg.decay ? s.decay_factor : 1.0f;
  const float before = *p;
  const float after = before * keep - s.step_size * (mi / denom);
  *p = after;
  if (deltas != nullptr) deltas[i] = float(double(after) - double(before));
}

__global__ void SquareChunkKernel(double* partial, const float* g, int64_t n) {
  __shared__ double shared[32];
  const int64_t b = int64_t(blockIdx.x) * kSquareChunk;
  const int64_t e = min(n, b + kSquareChunk);
  double s = 0.0;
  for (int64_t i = b + threadIdx.x; i < e; i += blockDim.x) s += double(g[i]) * double(g[i]);
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

// Block j: the sum of x[i]^2 over segment j's state elements, in double.
__global__ void SegmentSquaresKernel(double* out, const float* x, const AdamSegment* segments) {
  __shared__ double shared[32];
  const AdamSegment seg = segments[blockIdx.x];
  double s = 0.0;
  for (uint64_t i = seg.begin + threadIdx.x; i < seg.end; i += blockDim.x)
    s += double(x[i]) * double(x[i]);
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void SumKernel(double* out, const double* partial, int64_t count) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int64_t i = threadIdx.x; i < count; i += blockDim.x) s += partial[i];
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) *out = s;
}

}  // namespace

void AdamWStep(float* params, const float* grads, float* m, float* v, const AdamSegment* segments,
               int num_segments, uint64_t n, const AdamScalars& s, float* deltas) {
  if (n == 0 || num_segments == 0) return;
  ATL_LAUNCH(AdamWKernel, Blocks(n, kThreads), kThreads, params, grads, m, v, deltas, segments,
             num_segments, n, s);
}

void SegmentSquaredSums(double* host_out, const float* x, const AdamSegment* segments,
                        int num_segments) {
  if (num_segments <= 0) return;
  auto* sums = static_cast<double*>(Scratch(kScratchReduce, size_t(num_segments) * sizeof(double)));
  ATL_LAUNCH(SegmentSquaresKernel, unsigned(num_segments), kThreads, sums, x, segments);
  CopyToHost(host_out, sums, size_t(num_segments) * sizeof(double));
}

double GradSquaredSum(const float* grads, size_t n) {
  if (n == 0) return 0.0;
  const int64_t chunks = (int64_t(n) + kSquareChunk - 1) / kSquareChunk;
  auto* partial =
      static_cast<double*>(Scratch(kScratchReduce, size_t(chunks + 1) * sizeof(double)));
  ATL_LAUNCH(SquareChunkKernel, unsigned(chunks), kThreads, partial, grads, int64_t(n));
  ATL_LAUNCH(SumKernel, 1, 1024, partial + chunks, partial, chunks);
  double total = 0.0;
  CopyToHost(&total, partial + chunks, sizeof(double));
  return total;
}

}  // namespace atl::kernels::cuda
