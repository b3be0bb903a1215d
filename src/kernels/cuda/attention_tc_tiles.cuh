// The pieces the tensor-core attention kernels share (attention_tc.cu's forward,
// attention_tc_backward.cu's backward): a block's shape, the tiles in shared memory, a lane's
// place in the fragments, the staging of tiles by cp.async, the products over them and the
// stores (the data path of attention_tc.cu's comment). Internal to kernels/cuda/.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention_blocks.h"
#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atl::kernels::cuda::tc {

constexpr int kWarps = 4;
constexpr int kThreads = 32 * kWarps;
constexpr int kRows = 16 * kWarps;  // a block's own rows
constexpr int kTile = kAttentionRows;
static_assert(kRows == kTile, "a block's rows and the tiles align (the diagonal tile)");

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

// dst[at] (+)= v, and what it wrote rounded to bf16 at dst16[at] (when dst16 is not null).
__device__ inline void StoreElement(float* dst, __nv_bfloat16* dst16, int64_t at, float v,
                                    bool add) {
  const float stored = add ? dst[at] + v : v;
  dst[at] = stored;
  if (dst16 != nullptr) dst16[at] = __float2bfloat16_rn(stored);
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
      StoreElement(dst, dst16, int64_t(r) * stride + d, acc[n][i] * row_scale[i >> 1], add);
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

// B * NH heads of ceil(T / (64 kM)) blocks (HeadBlocks, attention_tc.cuh).
template <int kM = 1>
dim3 Grid(int B, int T, int NH) {
  int row_blocks = 0;
  return HeadBlocks(B, NH, T, kM * kRows, &row_blocks);
}

// The block rows set (SetAttentionBlockRows, attention_tc.cu).
AttentionBlockRows BlockRows();

}  // namespace atl::kernels::cuda::tc
