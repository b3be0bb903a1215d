// Causal multi-head self-attention with the probabilities stored (the layout of ops.h, which
// backward and the CPU reference share): heads are gathered into [B, NH, T, hs] blocks, the
// products are strided-batched cuBLASLt GEMMs over the B * NH heads, and the causal softmax runs
// one warp per row. (A flash-style kernel that keeps no [T, T] matrix is the next step.)
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// Element i of `count` head-major blocks [B, NH, T, hs] (block `which` = i / (B T C)) sits at
// this offset of a token-major tensor [B, T, row_stride] whose block `which` starts at column
// which * C, head h at column h * hs of it.
__device__ inline int64_t TokenMajorOffset(int64_t i, int64_t row_stride, int B, int T, int C,
                                           int NH) {
  const int64_t x = int64_t(B) * T * C;
  const int64_t which = i / x, r = i % x;
  const int hs = C / NH;
  const int64_t d = r % hs, t = (r / hs) % T, bh = r / (int64_t(hs) * T);
  const int64_t h = bh % NH, b = bh / NH;
  return (b * T + t) * row_stride + which * C + h * hs + d;
}

// dst[which][b, h, t, d] = src[b, t, which * C + h * hs + d]: q, k, v of qkv (count 3, row
// stride 3C) or one [B, T, C] tensor (count 1).
__global__ void GatherHeads(float* dst, const float* src, int64_t row_stride, int count, int B,
                            int T, int C, int NH) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(B) * T * C * count) return;
  dst[i] = src[TokenMajorOffset(i, row_stride, B, T, C, NH)];
}

// The inverse: dst[b, t, which * C + h * hs + d] (+)= src[which][b, h, t, d].
__global__ void ScatterHeads(float* dst, const float* src, int64_t row_stride, int count, int B,
                             int T, int C, int NH, bool add) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(B) * T * C * count) return;
  float* o = dst + TokenMajorOffset(i, row_stride, B, T, C, NH);
  *o = add ? *o + src[i] : src[i];
}

// In place over each row of att [rows = B*NH*T, T]: softmax of the causal prefix (t + 1 entries),
// zero above the diagonal. One warp per row.
__global__ void CausalSoftmax(float* att, int64_t rows, int T) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int len = int(row % T) + 1;
  float* p = att + row * T;
  float mx = -INFINITY;
  for (int j = lane; j < len; j += 32) mx = fmaxf(mx, p[j]);
  mx = WarpMax(mx);
  float sum = 0.0f;
  for (int j = lane; j < len; j += 32) {
    const float e = expf(p[j] - mx);
    p[j] = e;
    sum += e;
  }
  const float inv = 1.0f / WarpSum(sum);
  for (int j = lane; j < T; j += 32) p[j] = j < len ? p[j] * inv : 0.0f;
}

// In place: datt becomes d(pre-softmax scores) * scale: att * (datt - sum(att * datt)) * scale on
// the causal prefix, zero above.
__global__ void CausalSoftmaxBackward(float* datt, const float* att, int64_t rows, int T,
                                      float scale) {
  const int lane = threadIdx.x & 31;
  const int64_t row = int64_t(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;
  const int len = int(row % T) + 1;
  float* d = datt + row * T;
  const float* a = att + row * T;
  float dot = 0.0f;
  for (int j = lane; j < len; j += 32) dot += a[j] * d[j];
  dot = WarpSum(dot);
  for (int j = lane; j < T; j += 32) d[j] = j < len ? a[j] * (d[j] - dot) * scale : 0.0f;
}

constexpr int kWarps = 8;

void Gather(float* dst, const float* src, int64_t row_stride, int count, int B, int T, int C,
            int NH) {
  const size_t n = size_t(count) * B * T * C;
  ATL_LAUNCH(GatherHeads, Blocks(n, 256), 256, dst, src, row_stride, count, B, T, C, NH);
}

void Scatter(float* dst, const float* src, int64_t row_stride, int count, int B, int T, int C,
             int NH, bool add) {
  const size_t n = size_t(count) * B * T * C;
  ATL_LAUNCH(ScatterHeads, Blocks(n, 256), 256, dst, src, row_stride, count, B, T, C, NH, add);
}

}  // namespace

void AttentionForward(float* out, float* att, const float* qkv, int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int hs = C / NH, BH = B * NH;
  const int64_t X = int64_t(B) * T * C;
  auto* s = static_cast<float*>(Scratch(kScratchOp, size_t(4 * X) * sizeof(float)));
  float *q = s, *k = s + X, *v = s + 2 * X, *y = s + 3 * X;
  Gather(q, qkv, 3 * C, 3, B, T, C, NH);
  const float scale = 1.0f / std::sqrt(float(hs));
  const int64_t th = int64_t(T) * hs, tt = int64_t(T) * T;
  // att = scale * q · kᵀ per head, then the causal softmax in place.
  Gemm(false, true, T, T, hs, scale, q, hs, k, hs, 0.0f, att, T, BH, th, th, tt);
  const int64_t rows = int64_t(BH) * T;
  ATL_LAUNCH(CausalSoftmax, Blocks(size_t(rows), kWarps), 32 * kWarps, att, rows, T);
  // y = att · v per head; then heads side by side into out.
  Gemm(false, false, T, hs, T, 1.0f, att, T, v, hs, 0.0f, y, hs, BH, tt, th, th);
  Scatter(out, y, C, 1, B, T, C, NH, /*add=*/false);
}

void AttentionBackward(float* dqkv, const float* dout, const float* qkv, const float* att, int B,
                       int T, int C, int NH) {
  if (B <= 0 || T <= 0) return;
  const int hs = C / NH, BH = B * NH;
  const int64_t X = int64_t(B) * T * C, th = int64_t(T) * hs, tt = int64_t(T) * T;
  auto* s =
      static_cast<float*>(Scratch(kScratchOp, size_t(7 * X + int64_t(BH) * tt) * sizeof(float)));
  float *q = s, *k = s + X, *v = s + 2 * X, *dy = s + 3 * X;
  float *dq = s + 4 * X, *dk = s + 5 * X, *dv = s + 6 * X, *datt = s + 7 * X;
  Gather(q, qkv, 3 * C, 3, B, T, C, NH);
  Gather(dy, dout, C, 1, B, T, C, NH);
  // datt = dy · vᵀ; dv = attᵀ · dy.
  Gemm(false, true, T, T, hs, 1.0f, dy, hs, v, hs, 0.0f, datt, T, BH, th, th, tt);
  Gemm(true, false, T, hs, T, 1.0f, att, T, dy, hs, 0.0f, dv, hs, BH, tt, th, th);
  const int64_t rows = int64_t(BH) * T;
  const float scale = 1.0f / std::sqrt(float(hs));
  ATL_LAUNCH(CausalSoftmaxBackward, Blocks(size_t(rows), kWarps), 32 * kWarps, datt, att, rows, T,
             scale);
  // dq = dscores · k; dk = dscoresᵀ · q (dscores already carries the scale).
  Gemm(false, false, T, hs, T, 1.0f, datt, T, k, hs, 0.0f, dq, hs, BH, tt, th, th);
  Gemm(true, false, T, hs, T, 1.0f, datt, T, q, hs, 0.0f, dk, hs, BH, tt, th, th);
  // dq, dk, dv are contiguous in q, k, v order: one scatter adds all three into dqkv.
  Scatter(dqkv, dq, 3 * C, 3, B, T, C, NH, /*add=*/true);
}

}  // namespace atl::kernels::cuda
