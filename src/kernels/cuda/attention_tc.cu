// Causal attention on the tensor cores (bf16 operands, float accumulation and softmax), for
// SetBf16Matmul runs and head sizes up to 64: the algorithm of attention.cu (FlashAttention-2's
// forward with its online softmax; a backward of two kernels, one per query block for dQ and one
// per key block for dK and dV, so that every gradient element is one thread's sum and no atomic
// is needed), with the products done by mma.sync (mma.cuh) instead of one thread's loop.
//
// A block is 4 warps; each warp owns 16 rows (queries, or keys in the dK/dV kernel) and works
// on 64 rows of the other side at a time, staged by the block in shared memory as bf16 pairs,
// rows padded by 4 words so that a fragment's 32 reads hit 32 banks. Its own rows' operands
// (Q and dO, or K and V) stay in registers as A fragments for the whole kernel. The head's
// dimensions are padded with zeros to D (32 or 64). Every sum is in a fixed order: the tensor
// core's within a product, the products in k order, the row sums by a fixed butterfly over the
// 4 lanes that hold a row. Two runs give the same bits. A block's rows and the staged tiles are
// both 64 long and aligned, so every tile a block stages has its first row at or before the
// block's (key 0 of a query's first tile is unmasked: the running maximum is finite from there
// on), and the diagonal tile runs whole, its upper triangle masked.
#include <cmath>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // a block's own rows
constexpr int kTile = 64;           // rows of the other side staged at a time
constexpr int kPad = 4;             // words a staged row is padded by
constexpr int kTileWords = kTile / 2 + kPad;
// Blocks an SM must hold at head size 64 (__launch_bounds__'s second argument): the forward
// capped at 128 registers (4 blocks, was 139 and 3) and dQ at 168 (3, was 200 and 2), a few bytes
// spilled each; on an H100, gpt2-124m's bf16 step went from 35.9 to 34.0 ms. dK/dV needs its 255
// (capping it at 168 spilled 470 bytes). At 32 the kernels fit as they are (no bound: the
// forward's 128 registers would spill under one).
template <int D>
constexpr int kForwardBlocks = D == 64 ? 4 : 1;
template <int D>
constexpr int kQueryBlocks = D == 64 ? 3 : 1;

// A row-major tile: row r's dimensions 2j, 2j + 1 in word [r][j].
template <int D>
using Rows = uint32_t[kTile][D / 2 + kPad];
// A transposed tile: dimension d of rows 2j, 2j + 1 in word [d][j].
template <int D>
using Cols = uint32_t[D][kTileWords];

// The lane's place in its warp's fragments (mma.cuh) and the warp's 16 rows from `first`.
struct Lane {
  int warp, g, t, first;
  __device__ Lane(int block_first)
      : warp(int(threadIdx.x) / 32),
        g(int(threadIdx.x) % 32 / 4),
        t(int(threadIdx.x) % 4),
        first(block_first + 16 * warp) {}
  __device__ int row(int i) const { return first + g + (i >= 2 ? 8 : 0); }  // of accumulator i
  __device__ int col(int i) const { return 2 * t + (i & 1); }               // in its 8 columns
};

// src[r * stride + d] for rows r < count and d < hs, 0 beyond.
__device__ inline float At(const float* src, int64_t stride, int r, int d, int count, int hs) {
  return r < count && d < hs ? src[int64_t(r) * stride + d] : 0.0f;
}

// tile rows j = src rows first + j, as bf16 pairs.
template <int D>
__device__ inline void StageRows(Rows<D>& tile, const float* src, int64_t stride, int first,
                                 int count, int hs) {
  for (int i = threadIdx.x; i < kTile * D / 2; i += kThreads) {
    const int j = i / (D / 2), w = i % (D / 2);
    tile[j][w] = PackBf16(At(src, stride, first + j, 2 * w, count, hs),
                          At(src, stride, first + j, 2 * w + 1, count, hs));
  }
}

// tile transposed: word [d][j] holds dimension d of src rows first + 2j, first + 2j + 1.
template <int D>
__device__ inline void StageCols(Cols<D>& tile, const float* src, int64_t stride, int first,
                                 int count, int hs) {
  for (int i = threadIdx.x; i < D * kTile / 2; i += kThreads) {
    const int d = i % D, j = i / D;  // neighbouring threads read neighbouring dimensions
    tile[d][j] = PackBf16(At(src, stride, first + 2 * j, d, count, hs),
                          At(src, stride, first + 2 * j + 1, d, count, hs));
  }
}

// The warp's 16 rows of src (from lane.first) as A fragments over D columns.
template <int D>
__device__ inline void LoadA(uint32_t (&a)[D / 16][4], const float* src, int64_t stride,
                             const Lane& lane, int count, int hs) {
  const int r0 = lane.first + lane.g, r1 = r0 + 8;
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const int c = 16 * k + 2 * lane.t;
    a[k][0] = PackBf16(At(src, stride, r0, c, count, hs), At(src, stride, r0, c + 1, count, hs));
    a[k][1] = PackBf16(At(src, stride, r1, c, count, hs), At(src, stride, r1, c + 1, count, hs));
    a[k][2] =
        PackBf16(At(src, stride, r0, c + 8, count, hs), At(src, stride, r0, c + 9, count, hs));
    a[k][3] =
        PackBf16(At(src, stride, r1, c + 8, count, hs), At(src, stride, r1, c + 9, count, hs));
  }
}

// acc[n] = A (the warp's 16 rows, D columns) times the tile's rows 8n..8n+7, transposed: the
// warp's rows against the tile's 64, in 8 accumulators of 8 columns.
template <int D>
__device__ inline void TimesRows(float (&acc)[kTile / 8][4], const uint32_t (&a)[D / 16][4],
                                 const Rows<D>& tile, const Lane& lane) {
#pragma unroll
  for (int n = 0; n < kTile / 8; ++n) {
    acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < D / 16; ++k) {
      const uint32_t b[2] = {tile[8 * n + lane.g][8 * k + lane.t],
                             tile[8 * n + lane.g][8 * k + 4 + lane.t]};
      MmaBf16(acc[n], a[k], b);
    }
  }
}

// acc (16 x D, in D / 8 accumulators) += P (16 x 64, the accumulators p) times the tile (64 rows
// x D, stored transposed).
template <int D>
__device__ inline void AddTimesTile(float (&acc)[D / 8][4], const float (&p)[kTile / 8][4],
                                    const Cols<D>& tile, const Lane& lane) {
#pragma unroll
  for (int k = 0; k < kTile / 16; ++k) {
    uint32_t a[4];
    AFromAccumulators(a, p[2 * k], p[2 * k + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      const uint32_t b[2] = {tile[8 * n + lane.g][8 * k + lane.t],
                             tile[8 * n + lane.g][8 * k + 4 + lane.t]};
      MmaBf16(acc[n], a, b);
    }
  }
}

// Over the 4 lanes holding a row (t = 0..3), by a fixed butterfly: each gets the same bits.
__device__ inline float RowSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}
__device__ inline float RowMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// dst[r][d] (+)= acc's elements (rows of the warp, d < hs, rows < T), times row_scale[0 or 1];
// and what it wrote rounded to bf16 at the same place of dst16 (when not null).
template <int D>
__device__ inline void StoreRows(float* dst, __nv_bfloat16* dst16, int64_t stride,
                                 const float (&acc)[D / 8][4], const Lane& lane, int T, int hs,
                                 const float (&row_scale)[2], bool add) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int r = lane.row(i), d = 8 * n + lane.col(i);
      if (r >= T || d >= hs) continue;
      const int64_t at = int64_t(r) * stride + d;
      const float v = acc[n][i] * row_scale[i >> 1];
      const float stored = add ? dst[at] + v : v;
      dst[at] = stored;
      if (dst16 != nullptr) dst16[at] = __float2bfloat16_rn(stored);
    }
}

// p + offset, or null for a null p.
__device__ inline __nv_bfloat16* At(__nv_bfloat16* p, int64_t offset) {
  return p != nullptr ? p + offset : nullptr;
}

// The block's head (PlaceBlock, attention_tc.cuh: bh = b * NH + h): its size, where it starts in
// qkv [B, T, 3C] (row stride s3) and in a [B, T, C] tensor; and the block's first own row.
struct Head {
  BlockPlace at;
  int hs;
  int64_t s3, qkv, bt;
  int first;
  __device__ Head(int T, int C, int NH, bool descending)
      : at(PlaceBlock((T + kRows - 1) / kRows, descending)),
        hs(C / NH),
        s3(3 * int64_t(C)),
        qkv(int64_t(at.bh / NH) * T * 3 * C + int64_t(at.bh % NH) * hs),
        bt(int64_t(at.bh / NH) * T * C + int64_t(at.bh % NH) * hs),
        first(at.block * kRows) {}
};

// grid: Grid (heads of ceil(T / 64) query blocks). out [B, T, C]; lse [B, NH, T].
template <int D>
__global__ void __launch_bounds__(kThreads, kForwardBlocks<D>)
    TcForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int T, int C, int NH,
              float scale) {
  __shared__ Rows<D> ks;
  __shared__ Cols<D> vt;
  const Head head(T, C, NH, /*descending=*/true);
  const int hs = head.hs, block_first = head.first;
  const int64_t s3 = head.s3;
  const Lane lane(block_first);
  uint32_t q[D / 16][4];
  LoadA<D>(q, qkv + head.qkv, s3, lane, T, hs);
  float o[D / 8][4] = {};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows g, g + 8; l: this lane's part
  const int last = min(block_first + kRows, T) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();  // the previous tile is consumed
    StageRows<D>(ks, qkv + head.qkv + C, s3, k0, T, hs);
    StageCols<D>(vt, qkv + head.qkv + 2 * C, s3, k0, T, hs);
    __syncthreads();
    float s[kTile / 8][4];
    TimesRows<D>(s, q, ks, lane);
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + 8 * n + lane.col(i);
        s[n][i] = key <= lane.row(i) && key < T ? s[n][i] * scale : -INFINITY;
        mx[i >> 1] = fmaxf(mx[i >> 1], s[n][i]);
      }
    // Key 0 is in every row's first tile, so m is finite from the first tile on.
    float corr[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float m_new = fmaxf(m[h], RowMax(mx[h]));
      corr[h] = expf(m[h] - m_new);
      m[h] = m_new;
      l[h] *= corr[h];
    }
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        s[n][i] = expf(s[n][i] - m[i >> 1]);
        l[i >> 1] += s[n][i];
      }
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[n][i] *= corr[i >> 1];
    AddTimesTile<D>(o, s, vt, lane);
  }
  const float sum[2] = {RowSum(l[0]), RowSum(l[1])};
  const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
  StoreRows<D>(out + head.bt, At(out16, head.bt), C, o, lane, T, hs, inv, /*add=*/false);
  if (lane.t == 0)
    for (int h = 0; h < 2; ++h) {
      const int r = lane.first + lane.g + 8 * h;
      if (r < T) lse[int64_t(head.at.bh) * T + r] = m[h] + logf(sum[h]);
    }
}

// dq (+)= Σ_j ds_ij k_j over keys j ≤ i, ds_ij = p_ij (dO_i · v_j - D_i) scale; writes
// D_i = dO_i · O_i (in float) to dsum [B, NH, T] for the dK/dV kernel. grid: Grid. kAdd: dq is
// added to dqkv, else written over it (a template argument: as a run-time flag it costs the dK/dV
// kernel registers it has not got, and spills).
template <int D, bool kAdd>
__global__ void __launch_bounds__(kThreads, kQueryBlocks<D>)
    TcBackwardQuery(float* dqkv, __nv_bfloat16* dqkv16, float* dsum, const float* dout,
                    const float* out, const float* qkv, const float* lse, int T, int C, int NH,
                    float scale) {
  __shared__ Rows<D> ks, vs;
  __shared__ Cols<D> kt;
  const Head head(T, C, NH, /*descending=*/true);
  const int hs = head.hs, block_first = head.first;
  const int64_t s3 = head.s3;
  const Lane lane(block_first);
  uint32_t q[D / 16][4], dO[D / 16][4];
  LoadA<D>(q, qkv + head.qkv, s3, lane, T, hs);
  LoadA<D>(dO, dout + head.bt, C, lane, T, hs);
  float Di[2], row_lse[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = lane.first + lane.g + 8 * h;
    float part = 0.0f;  // this lane's dimensions: 8n + 2t, 8n + 2t + 1
    for (int n = 0; n < D / 8; ++n)
      for (int e = 0; e < 2; ++e) {
        const int d = 8 * n + 2 * lane.t + e;
        // dO as the products see it (bf16), so that Σ_j p_ij dp_ij - D_i is 0 as it should be
        const float g = Bf16Lo(PackBf16(At(dout + head.bt, C, r, d, T, hs), 0.0f));
        part += g * At(out + head.bt, C, r, d, T, hs);
      }
    Di[h] = RowSum(part);
    row_lse[h] = r < T ? lse[int64_t(head.at.bh) * T + r] : 0.0f;
    if (r < T && lane.t == 0) dsum[int64_t(head.at.bh) * T + r] = Di[h];
  }
  float dq[D / 8][4] = {};
  const int last = min(block_first + kRows, T) - 1;
  for (int k0 = 0; k0 <= last; k0 += kTile) {
    __syncthreads();
    StageRows<D>(ks, qkv + head.qkv + C, s3, k0, T, hs);
    StageRows<D>(vs, qkv + head.qkv + 2 * C, s3, k0, T, hs);
    StageCols<D>(kt, qkv + head.qkv + C, s3, k0, T, hs);
    __syncthreads();
    float s[kTile / 8][4], dp[kTile / 8][4];
    TimesRows<D>(s, q, ks, lane);
    TimesRows<D>(dp, dO, vs, lane);
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int key = k0 + 8 * n + lane.col(i), h = i >> 1;
        const float p = key <= lane.row(i) && key < T ? expf(s[n][i] * scale - row_lse[h]) : 0.0f;
        s[n][i] = p * (dp[n][i] - Di[h]) * scale;  // ds
      }
    AddTimesTile<D>(dq, s, kt, lane);
  }
  const float one[2] = {1.0f, 1.0f};
  StoreRows<D>(dqkv + head.qkv, At(dqkv16, head.qkv), s3, dq, lane, T, hs, one, kAdd);
}

// dk (+)= Σ_i ds_ij q_i and dv (+)= Σ_i p_ij dO_i over queries i ≥ j. grid: Grid, a block's
// rows being keys. kAdd as above.
template <int D, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    TcBackwardKeyValue(float* dqkv, __nv_bfloat16* dqkv16, const float* dsum, const float* dout,
                       const float* qkv, const float* lse, int T, int C, int NH, float scale) {
  __shared__ Rows<D> qs, dos;
  __shared__ Cols<D> qt, dot;
  __shared__ float lses[kTile], dsums[kTile];
  const Head head(T, C, NH, /*descending=*/false);
  const int hs = head.hs, block_first = head.first;
  const int64_t s3 = head.s3;
  const Lane lane(block_first);
  uint32_t k[D / 16][4], v[D / 16][4];
  LoadA<D>(k, qkv + head.qkv + C, s3, lane, T, hs);
  LoadA<D>(v, qkv + head.qkv + 2 * C, s3, lane, T, hs);
  float dk[D / 8][4] = {}, dv[D / 8][4] = {};
  // Queries before the block's first key see none of its keys.
  for (int q0 = block_first; q0 < T; q0 += kTile) {
    __syncthreads();
    StageRows<D>(qs, qkv + head.qkv, s3, q0, T, hs);
    StageRows<D>(dos, dout + head.bt, C, q0, T, hs);
    StageCols<D>(qt, qkv + head.qkv, s3, q0, T, hs);
    StageCols<D>(dot, dout + head.bt, C, q0, T, hs);
    for (int i = threadIdx.x; i < kTile; i += kThreads) {
      const bool in = q0 + i < T;
      lses[i] = in ? lse[int64_t(head.at.bh) * T + q0 + i] : 0.0f;
      dsums[i] = in ? dsum[int64_t(head.at.bh) * T + q0 + i] : 0.0f;
    }
    __syncthreads();
    float p[kTile / 8][4], ds[kTile / 8][4];
    TimesRows<D>(p, k, qs, lane);    // s, transposed
    TimesRows<D>(ds, v, dos, lane);  // dp, transposed
#pragma unroll
    for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int j = 8 * n + lane.col(i), query = q0 + j;
        p[n][i] = query >= lane.row(i) && query < T ? expf(p[n][i] * scale - lses[j]) : 0.0f;
        ds[n][i] = p[n][i] * (ds[n][i] - dsums[j]) * scale;
      }
    AddTimesTile<D>(dv, p, dot, lane);
    AddTimesTile<D>(dk, ds, qt, lane);
  }
  const float one[2] = {1.0f, 1.0f};
  StoreRows<D>(dqkv + head.qkv + C, At(dqkv16, head.qkv + C), s3, dk, lane, T, hs, one, kAdd);
  StoreRows<D>(dqkv + head.qkv + 2 * C, At(dqkv16, head.qkv + 2 * C), s3, dv, lane, T, hs, one,
               kAdd);
}

// B * NH heads of ceil(T / 64) blocks (HeadBlocks, attention_tc.cuh).
dim3 Grid(int B, int T, int NH) {
  int row_blocks = 0;
  return HeadBlocks(B, NH, T, kRows, &row_blocks);
}

// The backward's two kernels for head size D, adding to dqkv or writing it (kAdd).
template <int D, bool kAdd>
void Backward(float* dqkv, __nv_bfloat16* dqkv16, float* dsum, const float* dout, const float* out,
              const float* qkv, const float* lse, int B, int T, int C, int NH, float scale) {
  const dim3 grid = Grid(B, T, NH);
  ATL_LAUNCH((TcBackwardQuery<D, kAdd>), grid, kThreads, dqkv, dqkv16, dsum, dout, out, qkv, lse, T,
             C, NH, scale);
  ATL_LAUNCH((TcBackwardKeyValue<D, kAdd>), grid, kThreads, dqkv, dqkv16,
             static_cast<const float*>(dsum), dout, qkv, lse, T, C, NH, scale);
}

}  // namespace

bool TensorCoreAttention(int C, int NH) {
  static const bool has_mma = Probe().cc_major >= 8;  // mma.sync's bf16 shape: Ampere on
  return Bf16Matmul() && C / NH <= 64 && has_mma;
}

void TcAttentionForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int B,
                        int T, int C, int NH) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  if (C / NH <= 32)
    ATL_LAUNCH(TcForward<32>, Grid(B, T, NH), kThreads, out, out16, lse, qkv, T, C, NH, scale);
  else
    ATL_LAUNCH(TcForward<64>, Grid(B, T, NH), kThreads, out, out16, lse, qkv, T, C, NH, scale);
}

void TcAttentionBackward(float* dqkv, __nv_bfloat16* dqkv16, float* dsum, const float* dout,
                         const float* out, const float* qkv, const float* lse, int B, int T, int C,
                         int NH, bool add) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const bool small = C / NH <= 32;
  auto* const launch = small ? (add ? Backward<32, true> : Backward<32, false>)
                             : (add ? Backward<64, true> : Backward<64, false>);
  launch(dqkv, dqkv16, dsum, dout, out, qkv, lse, B, T, C, NH, scale);
}

}  // namespace atl::kernels::cuda
