// The tied LM head with softmax cross-entropy. Forward: logits by one GEMM (float, or bf16 under
// bf16 products when the caller gives room), then one block per row for its log-sum-exp and loss
// (one read of the row), then one block for the mean. Backward:
// the gradient of the logits is formed a tile of rows at a time (bounded scratch, however large N *
// V) and multiplied into dx and dwte, the tiles in row order, so dwte's accumulation order is
// fixed.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kThreads = 256;

// A running softmax denominator: s = the sum of exp(x - m) over the values seen, m their maximum
// (-inf, s 0: none seen).
struct MaxSum {
  float m, s;
};
__device__ inline MaxSum Combine(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return {m, 0.0f};
  // __fadd_rn: no product fused into the add, so Combine(a, b) and Combine(b, a) (a butterfly's
  // two lanes) give the same bits.
  return {m, __fadd_rn(a.s * expf(a.m - m), b.s * expf(b.m - m))};
}

__device__ inline float Load(const float* p) { return *p; }
__device__ inline float Load(const __nv_bfloat16* p) { return __bfloat162float(*p); }

// One block per row: lse[n] = log sum_j exp(logits[n, j]), losses[n] = lse[n] - logits[n, target],
// reading the row once (an online softmax: each thread's running maximum and sum over its columns
// in order, then combined by the block's fixed tree). Logits float or bf16, rows ld apart.
template <class L>
__global__ void RowLossKernel(float* lse, float* losses, const L* logits, int64_t ld,
                              const int32_t* targets, int V) {
  __shared__ MaxSum shared[32];
  const int64_t n = blockIdx.x;
  const L* l = logits + n * ld;
  MaxSum t{-INFINITY, 0.0f};
  for (int j = threadIdx.x; j < V; j += blockDim.x) {
    const float x = Load(l + j);
    if (x > t.m) {
      t.s = t.s * expf(t.m - x) + 1.0f;
      t.m = x;
    } else if (t.m != -INFINITY) {
      t.s += expf(x - t.m);
    }
  }
  t = BlockReduce(t, shared, MaxSum{-INFINITY, 0.0f}, [](MaxSum v) {
    for (int o = 16; o > 0; o >>= 1)
      v = Combine(
          v, MaxSum{__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)});
    return v;
  });
  if (threadIdx.x == 0) {
    const float row_lse = t.m + logf(t.s);
    lse[n] = row_lse;
    losses[n] = row_lse - Load(l + targets[n]);
  }
}

// *mean = sum of losses / N (one block; each thread a fixed stride, then the block's tree).
__global__ void MeanKernel(float* mean, const float* losses, int N) {
  __shared__ double shared[32];
  double s = 0.0;
  for (int i = threadIdx.x; i < N; i += blockDim.x) s += double(losses[i]);
  s = BlockSum(s, shared);
  if (threadIdx.x == 0) *mean = float(s / double(N));
}

__device__ inline void Store(float* p, float x) { *p = x; }
__device__ inline void Store(__nv_bfloat16* p, float x) { *p = __float2bfloat16_rn(x); }

// d[r, v] = dloss * (exp(logits[r0 + r, v] - lse[r0 + r]) - [v == target]) for the tile's rows,
// in float, stored as T (bf16: rounded as Gemm would round it); logits float or bf16; rows of d
// ldd apart, of logits ldl.
template <class T, class L>
__global__ void LogitGradKernel(T* d, int64_t ldd, const L* logits, int64_t ldl, const float* lse,
                                const int32_t* targets, float dloss, int64_t r0, int rows, int V) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(rows) * V) return;
  const int64_t r = i / V;
  const int v = int(i % V);
  const int64_t n = r0 + r;
  const float p = expf(Load(logits + n * ldl + v) - lse[n]);
  Store(d + r * ldd + v, dloss * (p - (v == targets[n] ? 1.0f : 0.0f)));
}

// Rows per backward tile: at most ~256 MiB of logit gradient at a time (64 M floats, 128 M bf16),
// rows ld elements apart.
int TileRows(int N, int64_t ld, size_t elem_bytes) {
  const int64_t rows = (int64_t(256) << 20) / int64_t(elem_bytes) / std::max<int64_t>(1, ld);
  return int(std::clamp<int64_t>(rows, 1, N));
}

// ClassifierBackward's tiles in float: each tile's gradient multiplied by Gemm.
void FloatTiles(float* dx, float* dwte, const float* logits, const float* lse, const float* x,
                const float* wte, const int32_t* targets, float dloss, int N, int C, int V,
                float beta_dx) {
  const int tile = TileRows(N, V, sizeof(float));
  auto* d = static_cast<float*>(Scratch(kScratchOp, size_t(tile) * size_t(V) * sizeof(float)));
  for (int r0 = 0; r0 < N; r0 += tile) {
    const int rows = std::min(tile, N - r0);
    const size_t n = size_t(rows) * size_t(V);
    ATL_LAUNCH((LogitGradKernel<float, float>), Blocks(n, kThreads), kThreads, d, int64_t(V),
               logits, int64_t(V), lse, targets, dloss, r0, rows, V);
    // dx[rows,C] (+)= d[rows,V] · wte[V,C]
    if (dx != nullptr)
      Gemm(false, false, rows, C, V, 1.0f, d, V, wte, C, beta_dx, dx + size_t(r0) * C, C);
    // dwte[V,C] += d[rows,V]ᵀ · x[rows,C]
    if (dwte != nullptr)
      Gemm(true, false, V, C, rows, 1.0f, d, V, x + size_t(r0) * C, C, 1.0f, dwte, C);
  }
}

// The same with bf16 products: each tile's gradient written in bf16 by its kernel; wte from its
// bf16 copy wte16, or rounded once for every tile; x from its bf16 copy x16, or each tile's rows of
// x rounded into one 256-byte aligned place (the alignment cuBLASLt's fastest kernels want,
// whatever C is). Tiles are whole multiples of 128 / gcd(C, 128) rows, so that every tile of x16
// (256-byte aligned) starts 256-byte aligned too: the same plans, hence the same bits, either way.
// The gradient's rows are LogitsRowStride(V) apart (128-byte aligned, as the products want).
// Logits float or bf16 (L), rows ldl apart.
template <class L>
void Bf16Tiles(float* dx, float* dwte, const L* logits, int64_t ldl, const float* lse,
               const float* x, const __nv_bfloat16* x16, const float* wte,
               const __nv_bfloat16* wte16, const int32_t* targets, float dloss, int N, int C, int V,
               float beta_dx) {
  const int step = 128 / std::gcd(C, 128);
  const int64_t ldd = LogitsRowStride(V);
  int tile = TileRows(N, ldd, sizeof(__nv_bfloat16));
  if (tile < N) tile = std::max(step, tile / step * step);
  auto* d = static_cast<__nv_bfloat16*>(
      Scratch(kScratchOp, size_t(tile) * size_t(ldd) * sizeof(__nv_bfloat16)));
  const int64_t nw = int64_t(V) * C;
  Bf16Operands ops({dx != nullptr && wte16 == nullptr ? nw : 0,
                    dwte != nullptr && x16 == nullptr ? int64_t(tile) * C : 0});
  const __nv_bfloat16* w = dx == nullptr      ? nullptr
                           : wte16 != nullptr ? wte16
                                              : ops.Round(0, wte, nw);
  for (int r0 = 0; r0 < N; r0 += tile) {
    const int rows = std::min(tile, N - r0);
    const size_t n = size_t(rows) * size_t(V);
    ATL_LAUNCH((LogitGradKernel<__nv_bfloat16, L>), Blocks(n, kThreads), kThreads, d, ldd, logits,
               ldl, lse, targets, dloss, r0, rows, V);
    if (dx != nullptr)
      GemmBf16(false, false, rows, C, V, 1.0f, d, ldd, w, C, beta_dx, dx + size_t(r0) * C, C);
    if (dwte != nullptr) {
      const __nv_bfloat16* xt = x16 != nullptr
                                    ? x16 + size_t(r0) * C
                                    : ops.Round(1, x + size_t(r0) * C, int64_t(rows) * C);
      GemmBf16(true, false, V, C, rows, 1.0f, d, ldd, xt, C, 1.0f, dwte, C);
    }
  }
}

}  // namespace

float ClassifierForward(float* logits, float* lse, float* losses, const float* x, const float* wte,
                        const int32_t* targets, int N, int C, int V, const Bf16Copies& copies,
                        uint16_t* logits_bf16) {
  if (N <= 0) return 0.0f;
  __nv_bfloat16* l16 = Bf16Copy(logits_bf16);
  const int64_t ld = l16 != nullptr ? LogitsRowStride(V) : V;
  // logits[N,V] = x[N,C] · wte[V,C]ᵀ
  GemmWithCopies(false, true, N, V, C, 1.0f, x, copies.inp, C, wte, copies.weight, C, 0.0f, logits,
                 ld, nullptr, l16);
  if (targets == nullptr) return 0.0f;
  if (l16 != nullptr)
    ATL_LAUNCH(RowLossKernel<__nv_bfloat16>, unsigned(N), kThreads, lse, losses, l16, ld, targets,
               V);
  else
    ATL_LAUNCH(RowLossKernel<float>, unsigned(N), kThreads, lse, losses, logits, ld, targets, V);
  auto* mean = static_cast<float*>(Scratch(kScratchReduce, sizeof(float)));
  ATL_LAUNCH(MeanKernel, 1, 1024, mean, losses, N);
  float host = 0.0f;
  CopyToHost(&host, mean, sizeof(float));
  return host;
}

void ClassifierBackward(float* dx, float* dwte, const float* logits, const float* lse,
                        const float* x, const float* wte, const int32_t* targets, float dloss,
                        int N, int C, int V, const Bf16Copies& copies, GradInto into,
                        const uint16_t* logits_bf16) {
  if (N <= 0 || (dx == nullptr && dwte == nullptr)) return;
  const float beta_dx = into == GradInto::kAdd ? 1.0f : 0.0f;  // each tile's rows of dx, once
  if (logits_bf16 != nullptr && !Bf16Matmul())
    ThrowCuda("ClassifierBackward", __FILE__, __LINE__,
              "bf16 logits, but bf16 products were switched off after the forward");
  if (logits_bf16 != nullptr)
    Bf16Tiles(dx, dwte, Bf16Copy(logits_bf16), LogitsRowStride(V), lse, x, Bf16Copy(copies.inp),
              wte, Bf16Copy(copies.weight), targets, dloss, N, C, V, beta_dx);
  else if (Bf16Matmul())
    Bf16Tiles(dx, dwte, logits, int64_t(V), lse, x, Bf16Copy(copies.inp), wte,
              Bf16Copy(copies.weight), targets, dloss, N, C, V, beta_dx);
  else
    FloatTiles(dx, dwte, logits, lse, x, wte, targets, dloss, N, C, V, beta_dx);
}

}  // namespace atl::kernels::cuda
