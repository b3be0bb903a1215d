// Causal attention on the tensor cores (bf16 operands, float accumulation and softmax), for
// SetBf16Matmul runs and head sizes up to 64: the algorithm of attention.cu (FlashAttention-2's
// forward with its online softmax; a backward of two kernels, one per query block for dQ and one
// per key block for dK and dV, so that every gradient element is one thread's sum and no atomic
// is needed), with the products done by mma.sync (mma.cuh) and FlashAttention-2's data path:
//
//   - a pass first rounds the operands to bf16 in a layout of their own (attention_tc_prep.cu):
//     each head's Q, K, V (and dO) rows contiguous, [B * NH][Tp][D], D = 32 or 64 (the head size
//     padded with zeros), Tp = T rounded up to 64 (rows past T zero), so that a 64-row tile is
//     one contiguous run of whole 16-byte chunks and no load needs a bound;
//   - a block of 4 warps owns 64 rows (16 a warp: queries, or keys in the dK/dV kernel), whose
//     operands (Q and dO, or K and V) stay in registers as A fragments for the whole kernel;
//   - the tiles of the other side (64 rows) are copied into shared memory by cp.async, two
//     buffers, the next tile's copy in flight while the current one is multiplied;
//   - the B fragments are read from shared memory by ldmatrix, transposed by ldmatrix.trans
//     where a product needs the tile's columns (P V, dS K, P^T dO, dS^T Q): no staging through
//     registers, no transposed copy. A staged row is padded by 16 bytes, so that the 8 rows an
//     8x8 matrix reads fall in 8 different bank groups.
//
// Every sum is in a fixed order: the tensor core's within a product, the products in k order,
// the row sums by a fixed butterfly over the 4 lanes that hold a row. Two runs give the same bits.
// A block's rows and the tiles are both 64 long and aligned, so only the diagonal tile is masked
// (key 0 of a query's first tile is unmasked: the running maximum is finite from there on), and
// a row past T is zero in every operand, its lse +infinity (its probabilities 0 in the backward).
// The softmax runs in base 2 (the scale times log2 e folded into the scores; the backward's
// exponentials by Exp2, mma.cuh).
#include <cmath>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // a block's own rows
constexpr int kTile = kAttentionRows;
static_assert(kRows == kTile, "a block's rows and the tiles align (the diagonal tile)");
constexpr float kLn2 = 0.6931471805599453f;
// Blocks an SM must hold at head size 64 (__launch_bounds__'s second argument), for kM row
// tiles a warp (the forward's and dQ's 64 kM rows a block, SetAttentionBlockRows). The forward
// at kM = 1 fits 4 blocks' 128 registers by spilling 40 bytes (7 spill loads a key tile in its
// SASS); at 3 blocks (168) it would spill none. 4 was the faster when last timed (an earlier
// forward, the twelfth session).
template <int D, int kM>
constexpr int kForwardBlocks = D != 64   ? 1
                               : kM == 1 ? 4
                                         : 2;
template <int D, int kM>
constexpr int kQueryBlocks = D != 64   ? 1
                             : kM == 1 ? 3
                                       : 2;

// A tile in shared memory: 64 rows of D bf16, padded by 8 (16 bytes), 16-byte aligned.
template <int D>
struct alignas(16) Tile {
  uint16_t row[kTile][D + 8];
};
// The lse2 and dsum of a tile's 64 rows (Operands, attention_tc.cuh).
struct alignas(16) RowStats {
  float lse2[kTile], dsum[kTile];
};

// The lane's place in its warp's fragments (mma.cuh) and the warp's 16 rows from `first`.
struct Lane {
  int warp, lane, g, t, first;
  __device__ Lane(int block_first)
      : warp(int(threadIdx.x) / 32),
        lane(int(threadIdx.x) % 32),
        g(lane / 4),
        t(lane % 4),
        first(block_first + 16 * warp) {}
  __device__ int row(int i) const { return first + g + (i >= 2 ? 8 : 0); }  // of accumulator i
  __device__ int col(int i) const { return 2 * t + (i & 1); }               // in its 8 columns
  // The same lane in the warp's row tile m (of 16 rows, 64 m rows below the first).
  __device__ Lane InRowTile(int m) const {
    Lane l = *this;
    l.first += kTile * m;
    return l;
  }
};

// The block's head and rows: its operands' place in the [B * NH][Tp][D] copies, and the first of
// its own 64 kM rows (kM row tiles of 64, each warp 16 rows of each).
struct Place {
  BlockPlace at;
  int Tp, first;
  int64_t base;  // the head's row 0 in a copy
  template <int D, int kM = 1>
  __device__ static Place Of(int T, bool descending) {
    Place p;
    p.at = PlaceBlock((T + kM * kRows - 1) / (kM * kRows), descending);
    p.Tp = (T + kRows - 1) / kRows * kRows;
    p.first = p.at.block * kM * kRows;
    p.base = int64_t(p.at.bh) * p.Tp * D;
    return p;
  }
  __device__ int tiles() const { return Tp / kTile; }
  // The block's first row tile (of 64), and how many of its kM are rows of the head (< Tp).
  __device__ int tile() const { return first / kTile; }
  template <int kM>
  __device__ int own() const {
    return kM == 1 ? 1 : min(kM, tiles() - tile());
  }
};

// Starts the copy of the 64 rows from src (rows D apart) into tile, by a block of kT threads.
template <int D, int kT = kThreads>
__device__ inline void StageTile(Tile<D>& tile, const uint16_t* src) {
  constexpr int kChunks = D / 8;  // 16 bytes each
  static_assert(kTile * kChunks % kT == 0, "whole chunks a thread");
#pragma unroll
  for (int c = 0; c < kTile * kChunks / kT; ++c) {
    const int i = c * kT + int(threadIdx.x), r = i / kChunks, x = i % kChunks;
    Copy16(&tile.row[r][8 * x], src + int64_t(r) * D + 8 * x);
  }
}

// Starts the copies of tile j of two operands (a head's rows from ah and bh) into buffer j & 1.
template <int D, int kT = kThreads>
__device__ inline void StageTiles(Tile<D> (&a)[2], Tile<D> (&b)[2], const uint16_t* ah,
                                  const uint16_t* bh, int j) {
  StageTile<D, kT>(a[j & 1], ah + int64_t(j) * kTile * D);
  StageTile<D, kT>(b[j & 1], bh + int64_t(j) * kTile * D);
}

// The stage of the kernels that walk key tiles (forward, dQ): starts the copies of tile j of a
// head's K and V (from k and v) into buffer j & 1, one group.
template <int D>
__device__ inline auto KeyValueStage(Tile<D> (&ks)[2], Tile<D> (&vs)[2], const uint16_t* k,
                                     const uint16_t* v) {
  return [&ks, &vs, k, v](int j) {
    StageTiles<D>(ks, vs, k, v, j);
    CopyCommit();
  };
}

// The key tiles a forward or dQ block walks, in order, by step(j, lo) (lo: a
// std::integral_constant, the first of the kM row tiles that sees tile j): 0 .. f, row tile 0's
// diagonal, with every row tile; then, with two row tiles both the head's (own == 2), f + 1 for
// row tile 1 alone. So no branch sits around the products.
template <int kM, class Step>
__device__ inline void ForKeyTiles(int f, int own, const Step& step) {
  for (int j = 0; j <= f; ++j) step(j, std::integral_constant<int, 0>());
  if constexpr (kM == 2)
    if (own == 2) step(f + 1, std::integral_constant<int, 1>());
}

// The head of a loop over tiles j < end: starts the copies of tile j + 1 (stage) when there is
// one, then waits for tile j's, the thread's and (the barrier) every thread's.
template <class Stage>
__device__ inline void AwaitTile(int j, int end, const Stage& stage) {
  if (j + 1 < end) {
    stage(j + 1);
    CopyWait<1>();
  } else {
    CopyWait<0>();
  }
  __syncthreads();
}

// The warp's 16 rows of src (a head's rows, D apart, from lane.first) as A fragments.
template <int D>
__device__ inline void LoadA(uint32_t (&a)[D / 16][4], const uint16_t* src, const Lane& lane) {
  const uint16_t* r0 = src + int64_t(lane.first + lane.g) * D;
  const uint16_t* r1 = r0 + 8 * D;  // row g + 8
#pragma unroll
  for (int k = 0; k < D / 16; ++k) {
    const int c = 16 * k + 2 * lane.t;
    a[k][0] = Load4(r0 + c);
    a[k][1] = Load4(r1 + c);
    a[k][2] = Load4(r0 + c + 8);
    a[k][3] = Load4(r1 + c + 8);
  }
}

// acc[mt][n] = A (row tile mt's 16 rows, D columns) times the tile's rows r0 + 8n .. r0 + 8n + 7,
// transposed: kN accumulators of 8 columns, for the row tiles kLo <= mt < kM (those before kLo
// see none of the tile's keys: left alone), which share each B fragment read. An ldmatrix gives
// two k steps' B fragments. Each accumulator sums in k order whatever kM is: the same bits.
template <int D, int kN, int kM, int kLo = 0>
__device__ inline void TimesRows(float (&acc)[kM][kN][4], const uint32_t (&a)[kM][D / 16][4],
                                 const Tile<D>& tile, int r0, const Lane& lane) {
#pragma unroll
  for (int n = 0; n < kN; ++n) {
#pragma unroll
    for (int mt = kLo; mt < kM; ++mt)
      acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
#pragma unroll
    for (int k = 0; k < D / 16; k += 2) {
      uint32_t b[4];  // matrix m: rows r0 + 8n + (0..7), columns 16k + 8m ..
      LdMatrix4<false>(b, &tile.row[r0 + 8 * n + lane.lane % 8][16 * k + 8 * (lane.lane / 8)]);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = kLo; mt < kM; ++mt) {
        MmaBf16(acc[mt][n], a[mt][k], b0);
        MmaBf16(acc[mt][n], a[mt][k + 1], b1);
      }
    }
  }
}

// acc[mt] (16 x D, in D / 8 accumulators) += P (16 x 16 kK, the accumulators p[mt]) times the
// tile's rows r0 .. r0 + 16 kK - 1 (D columns), for the row tiles kLo <= mt < kM. An
// ldmatrix.trans gives two column blocks' B fragments.
template <int D, int kK, int kM, int kLo = 0>
__device__ inline void AddTimesTile(float (&acc)[kM][D / 8][4], const float (&p)[kM][2 * kK][4],
                                    const Tile<D>& tile, int r0, const Lane& lane) {
  const int m = lane.lane / 8;  // matrix m: rows 16k + 8 (m & 1) + (0..7), columns 8 (n + m / 2)
#pragma unroll
  for (int k = 0; k < kK; ++k) {
    uint32_t a[kM][4];
#pragma unroll
    for (int mt = kLo; mt < kM; ++mt) AFromAccumulators(a[mt], p[mt][2 * k], p[mt][2 * k + 1]);
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
      uint32_t b[4];
      LdMatrix4<true>(b, &tile.row[r0 + 16 * k + 8 * (m & 1) + lane.lane % 8][8 * (n + m / 2)]);
      const uint32_t b0[2] = {b[0], b[1]}, b1[2] = {b[2], b[3]};
#pragma unroll
      for (int mt = kLo; mt < kM; ++mt) {
        MmaBf16(acc[mt][n], a[mt], b0);
        MmaBf16(acc[mt][n + 1], a[mt], b1);
      }
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

// dst[r][d] (+)= acc's elements (rows of the warp, r < T, d < hs), times row_scale[0 or 1], for
// dst a head's [T, ·] rows `stride` apart; and what it wrote rounded to bf16 at the same place of
// dst16 (when not null).
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

// Where head bh's rows start in a [B, T, width] tensor whose head h is columns h hs .. .
__device__ inline int64_t HeadStart(int bh, int T, int NH, int hs, int64_t width) {
  return int64_t(bh / NH) * T * width + int64_t(bh % NH) * hs;
}

// grid: Grid<kM> (heads of Tp / (64 kM) query blocks). out [B, T, C]; lse [B, NH, T]. Each warp
// has kM row tiles of 16 rows (its rows of each 64 of the block's), which share the B fragments
// of K and V read from shared memory (kM = 2 reads half as many per product, and the block's
// 128 rows take each K, V tile from memory once for 128 rows). Each row's arithmetic is the same
// whatever kM is: the same bits.
template <int D, int kM>
__global__ void __launch_bounds__(kThreads, kForwardBlocks<D, kM>)
    TcForward(float* out, __nv_bfloat16* out16, float* lse, const uint16_t* q16,
              const uint16_t* k16, const uint16_t* v16, int T, int C, int NH, float scale_log2) {
  __shared__ Tile<D> ks[2], vs[2];
  const Place place = Place::Of<D, kM>(T, /*descending=*/true);
  const Lane lane(place.first);
  const auto stage = KeyValueStage<D>(ks, vs, k16 + place.base, v16 + place.base);
  stage(0);
  const int f = place.tile(), own = place.own<kM>();  // row tile mt sees key tiles up to f + mt
  // A row tile past the head's rows (mt >= own) multiplies zeros, and is not stored.
  uint32_t q[kM][D / 16][4] = {};
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
    if (mt < own) LoadA<D>(q[mt], q16 + place.base, lane.InRowTile(mt));
  float o[kM][D / 8][4] = {};
  // rows g, g + 8 of each row tile; l: this lane's part
  float m[kM][2], l[kM][2] = {};
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) m[mt][0] = m[mt][1] = -INFINITY;
  const int tiles = f + own;  // the keys up to the block's last row
  // Key tile j for the row tiles from lo (a std::integral_constant: no branch in the products).
  const auto step = [&](int j, auto lo) {
    constexpr int kLo = decltype(lo)::value;
    AwaitTile(j, tiles, stage);
    float s[kM][kTile / 8][4];
    TimesRows<D, kTile / 8, kM, kLo>(s, q, ks[j & 1], 0, lane);
#pragma unroll
    for (int mt = kLo; mt < kM; ++mt) {
      const bool diagonal = j == f + mt;
      const Lane at = lane.InRowTile(mt);
      // The maximum of the unscaled scores: times the scale (> 0) it is the maximum of the
      // scaled ones, bit for bit (rounding is monotonic), and each probability is then one
      // multiply-add and one ex2 (Exp2: the .ftz form, one instruction; exp2f's takes four).
      float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          const int key = j * kTile + 8 * n + at.col(i);
          if (diagonal && key > at.row(i)) s[mt][n][i] = -INFINITY;
          mx[i >> 1] = fmaxf(mx[i >> 1], s[mt][n][i]);
        }
      float corr[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        // finite: key 0 is in every row's first tile
        const float m_new = fmaxf(m[mt][h], RowMax(mx[h]) * scale_log2);
        corr[h] = Exp2(m[mt][h] - m_new);
        m[mt][h] = m_new;
        l[mt][h] *= corr[h];
      }
#pragma unroll
      for (int n = 0; n < kTile / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          s[mt][n][i] = Exp2(fmaf(s[mt][n][i], scale_log2, -m[mt][i >> 1]));
          l[mt][i >> 1] += s[mt][n][i];
        }
#pragma unroll
      for (int n = 0; n < D / 8; ++n)
#pragma unroll
        for (int i = 0; i < 4; ++i) o[mt][n][i] *= corr[i >> 1];
    }
    AddTimesTile<D, kTile / 16, kM, kLo>(o, s, vs[j & 1], 0, lane);
    __syncthreads();  // tile j is consumed before the next iteration copies over it
  };
  ForKeyTiles<kM>(f, own, step);
  const int hs = C / NH;
  const int64_t bt = HeadStart(place.at.bh, T, NH, hs, C);
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    if (mt >= own) continue;
    const Lane at = lane.InRowTile(mt);
    const float sum[2] = {RowSum(l[mt][0]), RowSum(l[mt][1])};
    const float inv[2] = {1.0f / sum[0], 1.0f / sum[1]};
    StoreRows<D>(out + bt, At(out16, bt), C, o[mt], at, T, hs, inv, /*add=*/false);
    if (at.t == 0)
      for (int h = 0; h < 2; ++h) {
        const int r = at.first + at.g + 8 * h;
        if (r < T) lse[int64_t(place.at.bh) * T + r] = (m[mt][h] + log2f(sum[h])) * kLn2;
      }
  }
}

// dq (+)= Σ_j ds_ij k_j over keys j ≤ i, ds_ij = p_ij (dO_i · v_j - D_i) scale, the scale taken
// once, by the sum as it is stored (so, not by every ds: one multiply a score fewer; the same
// bits at a power-of-two scale, head sizes 16 and 64). grid: Grid<kM>, kM row tiles a warp as
// the forward's. kAdd: dq is added to dqkv, else written over it (a
// template argument: as a run-time flag it costs the dK/dV kernel registers it has not got). A
// 64-key tile is taken in parts of 32 / kM keys, which bounds the scores' registers; dq sums
// the parts' products in key order whatever kM is: the same bits.
template <int D, bool kAdd, int kM>
__global__ void __launch_bounds__(kThreads, kQueryBlocks<D, kM>)
    TcBackwardQuery(float* dqkv, __nv_bfloat16* dqkv16, const uint16_t* q16, const uint16_t* k16,
                    const uint16_t* v16, const uint16_t* do16, const float* dsum, const float* lse2,
                    int T, int C, int NH, float scale, float scale_log2) {
  constexpr int kPart = 32 / kM;  // keys
  __shared__ Tile<D> ks[2], vs[2];
  const Place place = Place::Of<D, kM>(T, /*descending=*/true);
  const Lane lane(place.first);
  const auto stage = KeyValueStage<D>(ks, vs, k16 + place.base, v16 + place.base);
  stage(0);
  const int f = place.tile(), own = place.own<kM>();
  // A row tile past the head's rows (mt >= own) takes row tile 0's operands: its results, not
  // finite maybe, are not stored.
  uint32_t q[kM][D / 16][4], dO[kM][D / 16][4];
  float Di[kM][2], row_lse[kM][2];
#pragma unroll
  for (int mt = 0; mt < kM; ++mt) {
    const Lane at = lane.InRowTile(mt < own ? mt : 0);
    LoadA<D>(q[mt], q16 + place.base, at);
    LoadA<D>(dO[mt], do16 + place.base, at);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t r = int64_t(place.at.bh) * place.Tp + at.first + at.g + 8 * h;
      Di[mt][h] = dsum[r];
      row_lse[mt][h] = lse2[r];
    }
  }
  float dq[kM][D / 8][4] = {};
  const int tiles = f + own;
  // Key tile j for the row tiles from lo, as the forward's.
  const auto step = [&](int j, auto lo) {
    constexpr int kLo = decltype(lo)::value;
    AwaitTile(j, tiles, stage);
#pragma unroll
    for (int part = 0; part < kTile / kPart; ++part) {
      const int r0 = kPart * part;
      float s[kM][kPart / 8][4], dp[kM][kPart / 8][4];
      TimesRows<D, kPart / 8, kM, kLo>(s, q, ks[j & 1], r0, lane);
      TimesRows<D, kPart / 8, kM, kLo>(dp, dO, vs[j & 1], r0, lane);
#pragma unroll
      for (int mt = kLo; mt < kM; ++mt) {
        const bool diagonal = j == f + mt;
        const Lane at = lane.InRowTile(mt);
#pragma unroll
        for (int n = 0; n < kPart / 8; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int key = j * kTile + r0 + 8 * n + at.col(i), h = i >> 1;
            const float p = diagonal && key > at.row(i)
                                ? 0.0f
                                : Exp2(fmaf(s[mt][n][i], scale_log2, -row_lse[mt][h]));
            s[mt][n][i] = p * (dp[mt][n][i] - Di[mt][h]);  // ds / scale
          }
      }
      AddTimesTile<D, kPart / 16, kM, kLo>(dq, s, ks[j & 1], r0, lane);
    }
    __syncthreads();
  };
  ForKeyTiles<kM>(f, own, step);
  const float scaled[2] = {scale, scale};
  const int64_t at = HeadStart(place.at.bh, T, NH, C / NH, 3 * int64_t(C));
#pragma unroll
  for (int mt = 0; mt < kM; ++mt)
    if (mt < own)
      StoreRows<D>(dqkv + at, At(dqkv16, at), 3 * int64_t(C), dq[mt], lane.InRowTile(mt), T, C / NH,
                   scaled, kAdd);
}

// dk (+)= Σ_i ds_ij q_i (the scale taken by the sum, as dq's) and dv (+)= Σ_i p_ij dO_i over
// queries i ≥ j. grid: Grid<kW / 4>, a block's 16 kW rows being keys, kW warps of 16 (kW = 8:
// the block's two row tiles of 64 share every Q, dO tile staged, read from memory once for 128
// keys). kAdd as above. Query tiles are taken in halves of 32 as above. A key row's sums are the
// same whatever kW is: the same bits.
template <int D, bool kAdd, int kW>
__global__ void __launch_bounds__(32 * kW)
    TcBackwardKeyValue(float* dqkv, __nv_bfloat16* dqkv16, const uint16_t* q16, const uint16_t* k16,
                       const uint16_t* v16, const uint16_t* do16, const float* dsum,
                       const float* lse2, int T, int C, int NH, float scale, float scale_log2) {
  static_assert(kW == 4 || kW == 8, "one or two row tiles of 64 keys a block");
  constexpr int kM = kW / 4;
  __shared__ Tile<D> qs[2], dos[2];
  __shared__ RowStats stats[2];
  const Place place = Place::Of<D, kM>(T, /*descending=*/false);
  const Lane lane(place.first);
  const int64_t head_rows = int64_t(place.at.bh) * place.Tp;
  const auto stage = [&](int j) {
    StageTiles<D, 32 * kW>(qs, dos, q16 + place.base, do16 + place.base, j);
    constexpr int kChunks = kTile / 4;  // of 4 floats
    const int i = int(threadIdx.x);
    if (i < kChunks)
      Copy16(&stats[j & 1].lse2[4 * i], lse2 + head_rows + int64_t(j) * kTile + 4 * i);
    else if (i < 2 * kChunks)
      Copy16(&stats[j & 1].dsum[4 * (i - kChunks)],
             dsum + head_rows + int64_t(j) * kTile + 4 * (i - kChunks));
    CopyCommit();
  };
  // Queries before the block's first key see none of its keys.
  const int f = place.tile();
  stage(f);
  // The warp's row tile: its keys' first query tile, its diagonal. A row tile past the head's
  // rows (kW = 8, mt >= own) loads nothing, multiplies nothing and is not stored.
  const int mt = kM == 1 ? 0 : lane.warp / 4, first = f + mt;
  const bool mine = mt < place.own<kM>();
  uint32_t k[1][D / 16][4] = {}, v[1][D / 16][4] = {};  // one row tile a warp
  if (mine) {
    LoadA<D>(k[0], k16 + place.base, lane);
    LoadA<D>(v[0], v16 + place.base, lane);
  }
  float dk[1][D / 8][4] = {}, dv[1][D / 8][4] = {};
  const int tiles = place.tiles();
  for (int j = f; j < tiles; ++j) {
    AwaitTile(j, tiles, stage);
    if (mine && j >= first) {  // the same for a whole warp
      const bool diagonal = j == first;
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r0 = 32 * half;
        float p[1][4][4], ds[1][4][4];
        TimesRows<D, 4>(p, k, qs[j & 1], r0, lane);    // s, transposed
        TimesRows<D, 4>(ds, v, dos[j & 1], r0, lane);  // dp, transposed
#pragma unroll
        for (int n = 0; n < 4; ++n)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            const int c = r0 + 8 * n + lane.col(i), query = j * kTile + c;
            // A query past T has lse +infinity: p = 0.
            p[0][n][i] = diagonal && query < lane.row(i)
                             ? 0.0f
                             : Exp2(fmaf(p[0][n][i], scale_log2, -stats[j & 1].lse2[c]));
            ds[0][n][i] = p[0][n][i] * (ds[0][n][i] - stats[j & 1].dsum[c]);  // ds / scale
          }
        AddTimesTile<D, 2>(dv, p, dos[j & 1], r0, lane);
        AddTimesTile<D, 2>(dk, ds, qs[j & 1], r0, lane);
      }
    }
    __syncthreads();
  }
  if (!mine) return;
  const float one[2] = {1.0f, 1.0f}, scaled[2] = {scale, scale};
  const int hs = C / NH;
  const int64_t at = HeadStart(place.at.bh, T, NH, hs, 3 * int64_t(C));
  StoreRows<D>(dqkv + at + C, At(dqkv16, at + C), 3 * int64_t(C), dk[0], lane, T, hs, scaled, kAdd);
  StoreRows<D>(dqkv + at + 2 * C, At(dqkv16, at + 2 * C), 3 * int64_t(C), dv[0], lane, T, hs, one,
               kAdd);
}

// B * NH heads of ceil(T / (64 kM)) blocks (HeadBlocks, attention_tc.cuh).
template <int kM = 1>
dim3 Grid(int B, int T, int NH) {
  int row_blocks = 0;
  return HeadBlocks(B, NH, T, kM * kRows, &row_blocks);
}

// The forward for head size D, kM row tiles a warp.
template <int D, int kM>
void Forward(float* out, __nv_bfloat16* out16, float* lse, const Operands& ops, int B, int T, int C,
             int NH, float scale) {
  ATL_LAUNCH((TcForward<D, kM>), Grid<kM>(B, T, NH), kThreads, out, out16, lse, ops.q, ops.k, ops.v,
             T, C, NH, scale * kLog2e);
}

AttentionBlockRows block_rows;  // SetAttentionBlockRows

// The dQ kernel with kM row tiles a warp, and the dK/dV kernel with kW warps: their grids and
// block sizes from the same template arguments as their bounds.
template <int D, bool kAdd, int kM>
void Query(float* dqkv, __nv_bfloat16* dqkv16, const Operands& ops, int B, int T, int C, int NH,
           float scale) {
  ATL_LAUNCH((TcBackwardQuery<D, kAdd, kM>), Grid<kM>(B, T, NH), kThreads, dqkv, dqkv16, ops.q,
             ops.k, ops.v, ops.dout, ops.dsum, ops.lse2, T, C, NH, scale, scale * kLog2e);
}
template <int D, bool kAdd, int kW>
void KeyValue(float* dqkv, __nv_bfloat16* dqkv16, const Operands& ops, int B, int T, int C, int NH,
              float scale) {
  ATL_LAUNCH((TcBackwardKeyValue<D, kAdd, kW>), Grid<kW / 4>(B, T, NH), 32 * kW, dqkv, dqkv16,
             ops.q, ops.k, ops.v, ops.dout, ops.dsum, ops.lse2, T, C, NH, scale, scale * kLog2e);
}

// The backward's two kernels for head size D, adding to dqkv or writing it (kAdd), with the
// block rows set.
template <int D, bool kAdd>
void Backward(float* dqkv, __nv_bfloat16* dqkv16, const Operands& ops, int B, int T, int C, int NH,
              float scale) {
  (block_rows.query == 2 * kRows ? Query<D, kAdd, 2> : Query<D, kAdd, 1>)(dqkv, dqkv16, ops, B, T,
                                                                          C, NH, scale);
  (block_rows.key == 2 * kRows ? KeyValue<D, kAdd, 8> : KeyValue<D, kAdd, 4>)(dqkv, dqkv16, ops, B,
                                                                              T, C, NH, scale);
}

}  // namespace

AttentionBlockRows SetAttentionBlockRows(AttentionBlockRows rows) {
  CheckAttentionBlockRows(rows);
  return std::exchange(block_rows, rows);
}

bool TensorCoreAttention(int C, int NH) {
  static const bool has_mma = Probe().cc_major >= 8;  // mma.sync's bf16 shape: Ampere on
  return Bf16Matmul() && C / NH <= 64 && has_mma;
}

void TcAttentionForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int B,
                        int T, int C, int NH, uint16_t* keep) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const Operands ops = ForwardOperands(qkv, B, T, C, NH, keep);
  const bool two = block_rows.query == 2 * kRows;
  auto* const launch = ops.D == 32 ? (two ? Forward<32, 2> : Forward<32, 1>)
                                   : (two ? Forward<64, 2> : Forward<64, 1>);
  launch(out, out16, lse, ops, B, T, C, NH, scale);
}

void TcAttentionBackward(float* dqkv, __nv_bfloat16* dqkv16, const float* dout, const float* out,
                         const float* qkv, const float* lse, int B, int T, int C, int NH, bool add,
                         const uint16_t* kept) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const Operands ops = BackwardOperands(dout, out, qkv, lse, B, T, C, NH, kept);
  using Launch = void (*)(float*, __nv_bfloat16*, const Operands&, int, int, int, int, float);
  static constexpr Launch kLaunch[2][2] = {// [D == 64][add]
                                           {Backward<32, false>, Backward<32, true>},
                                           {Backward<64, false>, Backward<64, true>}};
  kLaunch[ops.D == 64][add](dqkv, dqkv16, ops, B, T, C, NH, scale);
}

}  // namespace atl::kernels::cuda
