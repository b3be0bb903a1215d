// Causal multi-head self-attention, flash-style (FlashAttention-2's algorithm, Dao 2023): no
// [T, T] matrix is ever stored. Forward keeps, per query row, a running maximum and sum of the
// exponentials over tiles of keys staged in shared memory (the online softmax), and saves the
// row's log-sum-exp; backward recomputes the probabilities from it. Memory is O(T) per head, not
// O(T²).
//
// Determinism without atomics (FlashAttention-2's own backward adds dQ atomically): backward is
// two kernels. The dQ kernel gives each query row to one thread group, which walks the keys in
// order; it also forms D_i = dO_i · O_i. The dK/dV kernel gives each key row to one thread group,
// which walks the queries in order. So every gradient element is one thread's sum in a fixed
// order.
//
// Threads: R threads per row (R = 1, 2, 4 for head sizes up to 32, 64, 128), kThreads / R rows per
// block. Part r of a row owns the dimensions e * R + r, e < 32 (interleaved, so the R parts read
// neighbouring words of shared memory, not one bank); dimensions ≥ hs are zero. A dot product is
// each part's 32 products in order, then the parts summed by a fixed butterfly (RowSum), which
// gives every part the same bits. Loops over a tile are uniform across the block (rows past T
// and keys past the causal edge are masked, not skipped), so the shuffles meet.
//
// In bf16 mode (SetBf16Matmul), heads up to 64 go to the tensor cores instead (attention_tc.cu).
#include <cmath>
#include <stdexcept>
#include <string>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kThreads = 128;  // per block
constexpr int kTile = 32;      // keys (forward, dQ) or queries (dK/dV) staged per step
constexpr int kPart = 32;      // dimensions per thread

template <int R>
__device__ inline float RowSum(float v) {
  if constexpr (R >= 2) v += __shfl_xor_sync(0xffffffffu, v, 1);
  if constexpr (R >= 4) v += __shfl_xor_sync(0xffffffffu, v, 2);
  return v;
}

template <int R>
struct Row;

// x[e] = row[e * R + part] for the row's first hs dimensions, 0 beyond (and for a dead row).
template <int R>
__device__ inline void LoadPart(float (&x)[kPart], const float* row, const Row<R>& at) {
#pragma unroll
  for (int e = 0; e < kPart; ++e) {
    const int d = e * R + at.part;
    x[e] = at.live && d < at.hs ? row[d] : 0.0f;
  }
}

// row[e * R + part] (+)= scale * x[e] for the first hs dimensions.
template <int R>
__device__ inline void StorePart(float* row, const float (&x)[kPart], float scale, const Row<R>& at,
                                 bool add) {
#pragma unroll
  for (int e = 0; e < kPart; ++e) {
    const int d = e * R + at.part;
    if (d < at.hs) row[d] = add ? row[d] + x[e] * scale : x[e] * scale;
  }
}

// tile[j][d] = src[(first + j) * stride + d], zero past `count` rows or hs columns.
template <int R>
__device__ inline void LoadTile(float (&tile)[kTile][kPart * R], const float* src, int64_t stride,
                                int first, int count, int hs) {
  for (int i = threadIdx.x; i < kTile * kPart * R; i += blockDim.x) {
    const int j = i / (kPart * R), d = i % (kPart * R);
    tile[j][d] = first + j < count && d < hs ? src[int64_t(first + j) * stride + d] : 0.0f;
  }
}

// The dot product of a row part with row j of a tile, over the whole row.
template <int R>
__device__ inline float Dot(const float (&x)[kPart], const float (&tile)[kTile][kPart * R], int j,
                            int part) {
  float s = 0.0f;
#pragma unroll
  for (int e = 0; e < kPart; ++e) s += x[e] * tile[j][e * R + part];
  return RowSum<R>(s);
}

// x[e] += a * tile[j][e * R + part].
template <int R>
__device__ inline void Axpy(float (&x)[kPart], float a, const float (&tile)[kTile][kPart * R],
                            int j, int part) {
#pragma unroll
  for (int e = 0; e < kPart; ++e) x[e] += a * tile[j][e * R + part];
}

// What a thread of a grid of B * NH heads of ceil(T / rows) blocks (HeadBlocks; PlaceBlock,
// attention_tc.cuh, says which block is where, `descending` as there) works on: row `row` (a
// query; a key in the dK/dV kernel) of head bh, as part `part` of its R threads; the block's rows
// are [first, last] (rows past T are not live).
template <int R>
struct Row {
  BlockPlace place;
  int C, hs, bh, part, first, row, last;
  bool live;
  int64_t qkv, bt;  // where the head starts in qkv [B, T, 3C] and in a [B, T, C] tensor
  __device__ Row(int T, int C_, int NH, bool descending)
      : place(PlaceBlock((T + kThreads / R - 1) / (kThreads / R), descending)),
        C(C_),
        hs(C / NH),
        bh(place.bh),
        part(threadIdx.x % R),
        first(place.block * (kThreads / R)),
        row(first + threadIdx.x / R),
        last(min(first + kThreads / R, T) - 1),
        live(row < T),
        qkv(int64_t(bh / NH) * T * 3 * C + int64_t(bh % NH) * hs),
        bt(int64_t(bh / NH) * T * C + int64_t(bh % NH) * hs) {}
  __device__ int64_t stride() const { return 3 * int64_t(C); }
  // The head's q (which 0), k (1) or v (2) in qkv, from token 0, and this row's.
  template <class P>
  __device__ P* Qkv0(P* base, int which) const {
    return base + qkv + int64_t(which) * C;
  }
  template <class P>
  __device__ P* Qkv(P* base, int which) const {
    return Qkv0(base, which) + int64_t(row) * stride();
  }
  // This row of the head in a [B, T, C] tensor.
  template <class P>
  __device__ P* Bt(P* base) const {
    return base + bt + int64_t(row) * C;
  }
};

// grid: Grid. out [B, T, C]; lse [B, NH, T].
template <int R>
__global__ void __launch_bounds__(kThreads)
    FlashForward(float* out, float* lse, const float* qkv, int T, int C, int NH, float scale) {
  __shared__ float ks[kTile][kPart * R], vs[kTile][kPart * R];
  const Row<R> at(T, C, NH, /*descending=*/true);
  float q[kPart], o[kPart];
  LoadPart<R>(q, at.Qkv(qkv, 0), at);
#pragma unroll
  for (int e = 0; e < kPart; ++e) o[e] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  for (int k0 = 0; k0 <= at.last; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    LoadTile<R>(ks, at.Qkv0(qkv, 1), at.stride(), k0, T, at.hs);
    LoadTile<R>(vs, at.Qkv0(qkv, 2), at.stride(), k0, T, at.hs);
    __syncthreads();
    float s[kTile];
    float tile_max = -INFINITY;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const float dot = Dot<R>(q, ks, j, at.part);
      s[j] = k0 + j <= at.row ? dot * scale : -INFINITY;
      tile_max = fmaxf(tile_max, s[j]);
    }
    // Key 0 is in every row's first tile, so m is finite from the first tile on.
    const float m_new = fmaxf(m, tile_max);
    const float correction = expf(m - m_new);
    l *= correction;
#pragma unroll
    for (int e = 0; e < kPart; ++e) o[e] *= correction;
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const float p = expf(s[j] - m_new);
      l += p;
      Axpy<R>(o, p, vs, j, at.part);
    }
    m = m_new;
  }
  if (!at.live) return;
  StorePart<R>(at.Bt(out), o, 1.0f / l, at, /*add=*/false);
  if (at.part == 0) lse[int64_t(at.bh) * T + at.row] = m + logf(l);
}

// dq (+)= Σ_j ds_ij k_j over keys j ≤ i, ds_ij = p_ij (dO_i · v_j - D_i) scale, p_ij from lse;
// writes D_i = dO_i · O_i to dsum [B, NH, T] for the dK/dV kernel. grid: Grid.
template <int R>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQuery(float* dqkv, float* dsum, const float* dout, const float* out,
                       const float* qkv, const float* lse, int T, int C, int NH, float scale,
                       bool add) {
  __shared__ float ks[kTile][kPart * R], vs[kTile][kPart * R];
  const Row<R> at(T, C, NH, /*descending=*/true);
  float q[kPart], dO[kPart], dq[kPart];
  LoadPart<R>(q, at.Qkv(qkv, 0), at);
  LoadPart<R>(dq, at.Bt(out), at);  // O, briefly
  LoadPart<R>(dO, at.Bt(dout), at);
  float D = 0.0f;
#pragma unroll
  for (int e = 0; e < kPart; ++e) D += dO[e] * dq[e];
  D = RowSum<R>(D);
#pragma unroll
  for (int e = 0; e < kPart; ++e) dq[e] = 0.0f;
  const float row_lse = at.live ? lse[int64_t(at.bh) * T + at.row] : 0.0f;
  if (at.live && at.part == 0) dsum[int64_t(at.bh) * T + at.row] = D;
  for (int k0 = 0; k0 <= at.last; k0 += kTile) {
    __syncthreads();
    LoadTile<R>(ks, at.Qkv0(qkv, 1), at.stride(), k0, T, at.hs);
    LoadTile<R>(vs, at.Qkv0(qkv, 2), at.stride(), k0, T, at.hs);
    __syncthreads();
#pragma unroll
    for (int j = 0; j < kTile; ++j) {
      const float s = Dot<R>(q, ks, j, at.part) * scale;
      const float dp = Dot<R>(dO, vs, j, at.part);
      const float p = k0 + j <= at.row ? expf(s - row_lse) : 0.0f;
      Axpy<R>(dq, p * (dp - D) * scale, ks, j, at.part);
    }
  }
  if (at.live) StorePart<R>(at.Qkv(dqkv, 0), dq, 1.0f, at, add);
}

// dk (+)= Σ_i ds_ij q_i and dv (+)= Σ_i p_ij dO_i over queries i ≥ j. grid: Grid, a block's
// rows being keys.
template <int R>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKeyValue(float* dqkv, const float* dsum, const float* dout, const float* qkv,
                          const float* lse, int T, int C, int NH, float scale, bool add) {
  __shared__ float qs[kTile][kPart * R], dos[kTile][kPart * R];
  __shared__ float lses[kTile], dsums[kTile];
  const Row<R> at(T, C, NH, /*descending=*/false);
  float k[kPart], v[kPart], dk[kPart], dv[kPart];
  LoadPart<R>(k, at.Qkv(qkv, 1), at);
  LoadPart<R>(v, at.Qkv(qkv, 2), at);
#pragma unroll
  for (int e = 0; e < kPart; ++e) dk[e] = dv[e] = 0.0f;
  // Queries before the block's first key see none of its keys.
  for (int q0 = at.first; q0 < T; q0 += kTile) {
    __syncthreads();
    LoadTile<R>(qs, at.Qkv0(qkv, 0), at.stride(), q0, T, at.hs);
    LoadTile<R>(dos, dout + at.bt, C, q0, T, at.hs);
    for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
      const bool in = q0 + i < T;
      lses[i] = in ? lse[int64_t(at.bh) * T + q0 + i] : 0.0f;
      dsums[i] = in ? dsum[int64_t(at.bh) * T + q0 + i] : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kTile; ++i) {
      const float s = Dot<R>(k, qs, i, at.part) * scale;
      const float dp = Dot<R>(v, dos, i, at.part);
      const int query = q0 + i;
      const float p = query >= at.row && query < T ? expf(s - lses[i]) : 0.0f;
      Axpy<R>(dv, p, dos, i, at.part);
      Axpy<R>(dk, p * (dp - dsums[i]) * scale, qs, i, at.part);
    }
  }
  if (!at.live) return;
  StorePart<R>(at.Qkv(dqkv, 1), dk, 1.0f, at, add);
  StorePart<R>(at.Qkv(dqkv, 2), dv, 1.0f, at, add);
}

// B * NH heads of ceil(T / rows) blocks (HeadBlocks, attention_tc.cuh).
dim3 Grid(int R, int B, int T, int NH) {
  int row_blocks = 0;
  return HeadBlocks(B, NH, T, kThreads / R, &row_blocks);
}

// Threads per row for head size hs.
int PartsFor(int C, int NH) {
  const int hs = C / NH;
  if (hs <= kPart) return 1;
  if (hs <= 2 * kPart) return 2;
  if (hs <= 4 * kPart) return 4;
  throw std::invalid_argument("GPU attention: head size " + std::to_string(hs) +
                              " is over the kernel's 128");
}

template <int R>
void Forward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH, float scale) {
  ATL_LAUNCH(FlashForward<R>, Grid(R, B, T, NH), kThreads, out, lse, qkv, T, C, NH, scale);
}

template <int R>
void Backward(float* dqkv, float* dsum, const float* dout, const float* out, const float* qkv,
              const float* lse, int B, int T, int C, int NH, float scale, bool add) {
  ATL_LAUNCH(FlashBackwardQuery<R>, Grid(R, B, T, NH), kThreads, dqkv, dsum, dout, out, qkv, lse, T,
             C, NH, scale, add);
  ATL_LAUNCH(FlashBackwardKeyValue<R>, Grid(R, B, T, NH), kThreads, dqkv,
             static_cast<const float*>(dsum), dout, qkv, lse, T, C, NH, scale, add);
}

}  // namespace

void AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                      uint16_t* out_bf16, uint16_t* keep) {
  if (B <= 0 || T <= 0) return;
  __nv_bfloat16* out16 = Bf16Copy(out_bf16);
  if (TensorCoreAttention(C, NH))
    return TcAttentionForward(out, out16, lse, qkv, B, T, C, NH, keep);
  const int R = PartsFor(C, NH);
  const float scale = 1.0f / std::sqrt(float(C / NH));
  if (R == 1) Forward<1>(out, lse, qkv, B, T, C, NH, scale);
  if (R == 2) Forward<2>(out, lse, qkv, B, T, C, NH, scale);
  if (R == 4) Forward<4>(out, lse, qkv, B, T, C, NH, scale);
  // Heads over 64 under bf16 products: the copy in a pass of its own.
  if (out16 != nullptr) RoundToBf16(out_bf16, out, size_t(B) * size_t(T) * size_t(C));
}

void AttentionBackward(float* dqkv, const float* dout, const float* out, const float* qkv,
                       const float* lse, int B, int T, int C, int NH, uint16_t* dqkv_bf16,
                       GradInto into, const uint16_t* kept) {
  if (B <= 0 || T <= 0) return;
  const int R = PartsFor(C, NH);
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const bool add = into == GradInto::kAdd;
  __nv_bfloat16* dqkv16 = Bf16Copy(dqkv_bf16);
  if (TensorCoreAttention(C, NH))
    return TcAttentionBackward(dqkv, dqkv16, dout, out, qkv, lse, B, T, C, NH, add, kept);
  auto* dsum = static_cast<float*>(Scratch(kScratchOp, size_t(B) * NH * T * sizeof(float)));
  if (R == 1) Backward<1>(dqkv, dsum, dout, out, qkv, lse, B, T, C, NH, scale, add);
  if (R == 2) Backward<2>(dqkv, dsum, dout, out, qkv, lse, B, T, C, NH, scale, add);
  if (R == 4) Backward<4>(dqkv, dsum, dout, out, qkv, lse, B, T, C, NH, scale, add);
  if (dqkv16 != nullptr) RoundToBf16(dqkv_bf16, dqkv, size_t(B) * size_t(T) * 3 * size_t(C));
}

size_t AttentionKeptElements(int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || !TensorCoreAttention(C, NH)) return 0;
  return OperandElements(B, T, C, NH);
}

}  // namespace atl::kernels::cuda
