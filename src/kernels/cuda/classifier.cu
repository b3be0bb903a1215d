// The tied LM head with softmax cross-entropy. Forward: logits by one GEMM (float, or bf16 under
// bf16 products when the caller gives room), then one block per row for its log-sum-exp and loss
// (one read of the row), then one block for the mean. Backward:
// the gradient of the logits is formed a tile of rows at a time (bounded scratch, however large N *
// V) and multiplied into dx and dwte, the tiles in row order, so dwte's accumulation order is
// fixed.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
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

// Adds k values x to the running t: rescaled once to their maximum if it is larger, then each
// value's exp added in order.
template <int k>
__device__ inline void Accumulate(MaxSum& t, const float (&x)[k]) {
  float m = x[0];
#pragma unroll
  for (int i = 1; i < k; ++i) m = fmaxf(m, x[i]);
  if (m > t.m) {
    t.s = t.m == -INFINITY ? 0.0f : t.s * expf(t.m - m);
    t.m = m;
  }
  if (t.m == -INFINITY) return;
#pragma unroll
  for (int i = 0; i < k; ++i) t.s += expf(x[i] - t.m);
}

// Whether rows of bf16 from p, ld apart, all start 16-byte aligned: the loss and the logit gradient
// then read them 8 at a time.
inline bool EightWide(const void* p, int64_t ld) { return ld % 8 == 0 && Alignment(p) >= 16; }

// 8 bf16 from a 16-byte aligned p, as floats (one 16-byte load).
__device__ inline void Load8(float (&x)[8], const __nv_bfloat16* p) {
  const uint4 raw = Load16(p);
  const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    x[2 * i] = Bf16Lo(w[i]);
    x[2 * i + 1] = Bf16Hi(w[i]);
  }
}

// One block per row: lse[n] = log sum_j exp(logits[n, j]), losses[n] = lse[n] - logits[n, target],
// reading the row once (an online softmax: each thread's running maximum and sum over its columns
// in order, then combined by the block's fixed tree). Logits float or bf16, rows ld apart. kVec
// (bf16, rows 16-byte aligned): a thread takes 8 adjacent columns a load.
template <class L, bool kVec>
__global__ void RowLossKernel(float* lse, float* losses, const L* logits, int64_t ld,
                              const int32_t* targets, int V) {
  __shared__ MaxSum shared[32];
  const int64_t n = blockIdx.x;
  const L* l = logits + n * ld;
  MaxSum t{-INFINITY, 0.0f};
  int j = threadIdx.x;
  if constexpr (kVec) {
    const int v8 = V / 8 * 8;
    for (int j8 = 8 * threadIdx.x; j8 < v8; j8 += 8 * blockDim.x) {
      float x[8];
      Load8(x, l + j8);
      Accumulate(t, x);
    }
    j = v8 + threadIdx.x;
  }
  for (; j < V; j += blockDim.x) {
    const float x[1] = {Load(l + j)};
    Accumulate(t, x);
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

__device__ inline float LogitGrad(float logit, float lse, bool target, float dloss) {
  return dloss * (expf(logit - lse) - (target ? 1.0f : 0.0f));
}

// d[r, v] = dloss * (exp(logits[r0 + r, v] - lse[r0 + r]) - [v == target]) for the tile's rows,
// in float, stored as T (bf16: rounded as Gemm would round it), and d[r, v] = 0 for V <= v < cols
// (the padding the products read); logits float or bf16; rows of d ldd apart, of logits ldl.
// Grid: RowsGrid.
template <class T, class L>
__global__ void LogitGradKernel(T* d, int64_t ldd, const L* logits, int64_t ldl, const float* lse,
                                const int32_t* targets, float dloss, int64_t r0, int rows, int V,
                                int cols) {
  const int v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const int64_t n = r0 + r;
    Store(d + r * ldd + v,
          v < V ? LogitGrad(Load(logits + n * ldl + v), lse[n], v == targets[n], dloss) : 0.0f);
  }
}

// LogitGradKernel8's columns v0..v0 + 7 of tile row r (logits row n).
__device__ inline void LogitGradRow8(__nv_bfloat16* d, int64_t ldd, const __nv_bfloat16* logits,
                                     int64_t ldl, const float* lse, const int32_t* targets,
                                     float dloss, int64_t n, int64_t r, int v0, int V) {
  const float row_lse = lse[n];
  const int target = targets[n];
  float x[8];
  if (v0 + 8 <= V) {
    Load8(x, logits + n * ldl + v0);
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = v0 + i < V ? Load(logits + n * ldl + v0 + i) : 0.0f;
  }
  uint32_t w[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int v = v0 + 2 * i;
    w[i] = PackBf16(v < V ? LogitGrad(x[2 * i], row_lse, v == target, dloss) : 0.0f,
                    v + 1 < V ? LogitGrad(x[2 * i + 1], row_lse, v + 1 == target, dloss) : 0.0f);
  }
  Store16(d + r * ldd + v0, uint4{w[0], w[1], w[2], w[3]});
}

// The same, bf16 to bf16, 8 adjacent columns a thread (ldd, ldl multiples of 8, rows 16-byte
// aligned, cols a multiple of 8). Grid: RowsGrid.
__global__ void LogitGradKernel8(__nv_bfloat16* d, int64_t ldd, const __nv_bfloat16* logits,
                                 int64_t ldl, const float* lse, const int32_t* targets, float dloss,
                                 int64_t r0, int rows, int V, int cols) {
  const int v0 = 8 * (blockIdx.x * blockDim.x + threadIdx.x);
  if (v0 >= cols) return;
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y)
    LogitGradRow8(d, ldd, logits, ldl, lse, targets, dloss, r0 + r, r, v0, V);
}

// wte's rows in bf16 (its copy wte16, or wte rounded) followed by zero rows up to
// LogitsRowStride(V) rows, into dst: the classifier's bf16 products run on a whole multiple of 64
// vocabulary rows, so that every operand's rows and the product's are 16-byte aligned and cuBLASLt
// takes its vectorized kernels (an odd V, as gpt2's 50257, got 1-element alignment, ~6x slower).
void PaddedWeight(__nv_bfloat16* dst, const float* wte, const __nv_bfloat16* wte16, int V, int C) {
  const size_t n = size_t(V) * size_t(C);
  if (wte16 != nullptr)
    CopyOnDevice(dst, wte16, n * sizeof(__nv_bfloat16));
  else
    RoundToBf16(reinterpret_cast<uint16_t*>(dst), wte, n);
  Zero(dst + n, size_t(LogitsRowStride(V) - V) * size_t(C) * sizeof(__nv_bfloat16));
}

// Elements of a padded bf16 weight, rounded up to keep what follows it 256-byte aligned.
int64_t PaddedWeightRoom(int V, int C) { return (LogitsRowStride(V) * C + 127) / 128 * 128; }

// Rows per backward tile: at most ~256 MiB of logit gradient at a time (64 M floats, 128 M bf16),
// rows ld elements apart.
int TileRows(int N, int64_t ld, size_t elem_bytes) {
  const int64_t rows = (int64_t(256) << 20) / int64_t(elem_bytes) / std::max<int64_t>(1, ld);
  return int(std::clamp<int64_t>(rows, 1, N));
}

// The gradient kernels' grid: column blocks of `threads` threads (`per` columns a thread) by the
// tile's rows, at most 65535 (CUDA's limit on grid.y; the blocks then stride over the rows).
dim3 RowsGrid(int64_t cols, int per, int rows) {
  return dim3(Blocks(size_t((cols + per - 1) / per), kThreads), unsigned(std::min(rows, 65535)));
}

// ClassifierBackward's tiles in float: each tile's gradient multiplied by Gemm.
void FloatTiles(float* dx, float* dwte, const float* logits, const float* lse, const float* x,
                const float* wte, const int32_t* targets, float dloss, int N, int C, int V,
                float beta_dx) {
  const int tile = TileRows(N, V, sizeof(float));
  auto* d = static_cast<float*>(Scratch(kScratchOp, size_t(tile) * size_t(V) * sizeof(float)));
  for (int r0 = 0; r0 < N; r0 += tile) {
    const int rows = std::min(tile, N - r0);
    ATL_LAUNCH((LogitGradKernel<float, float>), RowsGrid(V, 1, rows), kThreads, d, int64_t(V),
               logits, int64_t(V), lse, targets, dloss, r0, rows, V, V);
    // dx[rows,C] (+)= d[rows,V] · wte[V,C]
    if (dx != nullptr)
      Gemm(false, false, rows, C, V, 1.0f, d, V, wte, C, beta_dx, dx + size_t(r0) * C, C);
    // dwte[V,C] += d[rows,V]ᵀ · x[rows,C]
    if (dwte != nullptr)
      Gemm(true, false, V, C, rows, 1.0f, d, V, x + size_t(r0) * C, C, 1.0f, dwte, C);
  }
}

// The same with bf16 products: each tile's gradient written in bf16 by its kernel, with zero
// columns up to Vp = LogitsRowStride(V) (rows Vp apart); wte's bf16 rows padded to Vp
// (PaddedWeight) for dx's product, which so sums over Vp; x from its bf16 copy x16, or each tile's
// rows of x rounded into one 256-byte aligned place (the alignment cuBLASLt's fastest kernels
// want, whatever C is). Tiles are whole multiples of 128 / gcd(C, 128) rows, so that every tile of
// x16 (256-byte aligned) starts 256-byte aligned too: the same plans, hence the same bits, either
// way. Logits float or bf16 (L), rows ldl apart.
template <class L>
void Bf16Tiles(float* dx, float* dwte, const L* logits, int64_t ldl, const float* lse,
               const float* x, const __nv_bfloat16* x16, const float* wte,
               const __nv_bfloat16* wte16, const int32_t* targets, float dloss, int N, int C, int V,
               float beta_dx) {
  const int step = 128 / std::gcd(C, 128);
  const int64_t ldd = LogitsRowStride(V);
  int tile = TileRows(N, ldd, sizeof(__nv_bfloat16));
  if (tile < N) tile = std::max(step, tile / step * step);
  const int64_t room_w = dx != nullptr ? PaddedWeightRoom(V, C) : 0;
  auto* w = static_cast<__nv_bfloat16*>(
      Scratch(kScratchOp, (size_t(room_w) + size_t(tile) * size_t(ldd)) * sizeof(__nv_bfloat16)));
  __nv_bfloat16* d = w + room_w;
  if (dx != nullptr) PaddedWeight(w, wte, wte16, V, C);
  Bf16Operands ops({dwte != nullptr && x16 == nullptr ? int64_t(tile) * C : 0});
  // bf16 logits in aligned rows: 8 columns a thread.
  constexpr bool kVec = std::is_same_v<L, __nv_bfloat16>;
  const bool vec = kVec && EightWide(logits, ldl);
  for (int r0 = 0; r0 < N; r0 += tile) {
    const int rows = std::min(tile, N - r0);
    if constexpr (kVec) {
      if (vec)
        ATL_LAUNCH(LogitGradKernel8, RowsGrid(ldd, 8, rows), kThreads, d, ldd, logits, ldl, lse,
                   targets, dloss, r0, rows, V, int(ldd));
    }
    if (!vec)
      ATL_LAUNCH((LogitGradKernel<__nv_bfloat16, L>), RowsGrid(ldd, 1, rows), kThreads, d, ldd,
                 logits, ldl, lse, targets, dloss, r0, rows, V, int(ldd));
    if (dx != nullptr)
      GemmBf16(false, false, rows, C, int(ldd), 1.0f, d, ldd, w, C, beta_dx, dx + size_t(r0) * C,
               C);
    if (dwte != nullptr) {
      const __nv_bfloat16* xt = x16 != nullptr
                                    ? x16 + size_t(r0) * C
                                    : ops.Round(0, x + size_t(r0) * C, int64_t(rows) * C);
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
  if (l16 != nullptr) {
    // logits16[N,Vp] = x[N,C] · wte16[Vp,C]ᵀ, wte's rows padded (PaddedWeight): every row aligned
    auto* w = static_cast<__nv_bfloat16*>(
        Scratch(kScratchOp, size_t(PaddedWeightRoom(V, C)) * sizeof(__nv_bfloat16)));
    PaddedWeight(w, wte, Bf16Copy(copies.weight), V, C);
    GemmWithCopies(false, true, N, int(ld), C, 1.0f, x, copies.inp, C, wte,
                   reinterpret_cast<const uint16_t*>(w), C, 0.0f, logits, ld, nullptr, l16);
  } else {
    // logits[N,V] = x[N,C] · wte[V,C]ᵀ
    GemmWithCopies(false, true, N, V, C, 1.0f, x, copies.inp, C, wte, copies.weight, C, 0.0f,
                   logits, V);
  }
  if (targets == nullptr) return 0.0f;
  // The 8-wide loss sums a row in another order than the scalar one: the bits depend on whether
  // the bf16 logits are 16-byte aligned (GPT's always are), and on nothing else.
  if (l16 != nullptr && EightWide(l16, ld))
    ATL_LAUNCH((RowLossKernel<__nv_bfloat16, true>), unsigned(N), kThreads, lse, losses, l16, ld,
               targets, V);
  else if (l16 != nullptr)
    ATL_LAUNCH((RowLossKernel<__nv_bfloat16, false>), unsigned(N), kThreads, lse, losses, l16, ld,
               targets, V);
  else
    ATL_LAUNCH((RowLossKernel<float, false>), unsigned(N), kThreads, lse, losses, logits, ld,
               targets, V);
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
