// The tensor-core attention's backward (the data path of attention_tc.cu's comment): dQ by a
// kernel over query blocks, dK and dV by a kernel over key blocks, so that every gradient element
// is one thread's sum in a fixed order and no atomic is needed.
#include <algorithm>
#include <cmath>
#include <type_traits>
#include <utility>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/attention_tc_tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda::tc {
namespace {

// Blocks an SM must hold at head size 64 for the dQ kernel at kM row tiles a warp (its 64 kM
// rows a block, SetAttentionBlockRows).
template <int D, int kM>
constexpr int kQueryBlocks = D != 64   ? 1
                             : kM == 1 ? 3
                                       : 2;

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

// The fused backward's partial sums of dq (AttentionBackwardKind::kFused): for each head, for each
// key block kb of 64 keys, rows 64 kb .. Tp - 1 (the queries that see its keys) of D floats, the
// sums Σ_j ds_ij k_j / scale over its keys j; block kb's rows after the Σ_{i<kb} (Tp - 64 i) rows
// of those before it. PartialRow(kb): where block kb's rows start in a head's; kb = Tp / 64: a
// head's rows.
__host__ __device__ inline int64_t PartialRow(int kb, int Tp) {
  return int64_t(kb) * Tp - int64_t(kRows / 2) * kb * (kb - 1);
}

// The ds of a half tile, transposed (the block's 16 kW keys x 32 queries), bf16, for the fused
// backward's dq products; rows padded by 8 (16 bytes), so that the 8 rows an 8x8 matrix reads
// fall in 8 different bank groups.
template <int kKeys>
struct alignas(16) HalfTileDs {
  uint16_t row[kKeys][32 + 8];
};

// The fused backward's B fragments of K for the dq products: the warp's D / 4 columns (D / 32
// tiles of 8) of its row tile's 64 keys (4 k steps of 16), from `keys` (the row tile's K rows,
// staged).
template <int D>
using KeyFragments = uint32_t[4][D / 32][2];
template <int D>
__device__ inline void LoadKeyFragments(KeyFragments<D>& kf, const Tile<D>& keys,
                                        const Lane& lane) {
  const int m = lane.lane / 8;  // matrix m: keys 16 kk + 8 (m & 1) + (0..7), columns 8 (n + m / 2)
  const int n = D / 32 * (lane.warp % 4);  // at D = 32 the second tile (the next warp's) unused
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) {
    uint32_t b[4];
    LdMatrix4<true>(b, &keys.row[16 * kk + 8 * (m & 1) + lane.lane % 8][8 * (n + m / 2)]);
#pragma unroll
    for (int nn = 0; nn < D / 32; ++nn) {
      kf[kk][nn][0] = b[2 * nn];
      kf[kk][nn][1] = b[2 * nn + 1];
    }
  }
}

// The warp's part of a half tile's dq partial sums: its row tile's ds (the 64 rows of HalfTileDs
// from ds, the half's 32 queries: 2 row tiles of 16) times their K rows (kf: the warp's D / 4
// columns), over the 64 keys in order, stored at `rows` (the partial row of the half's first
// query; D floats a row).
template <int D>
__device__ inline void StoreQueryPartial(float* rows, const uint16_t (*ds)[32 + 8],
                                         const KeyFragments<D>& kf, const Lane& lane) {
  float acc[2][D / 32][4] = {};
  const int m = lane.lane / 8;  // matrix m: keys 8 (m / 2) + (0..7), queries 8 (m & 1) ..
#pragma unroll
  for (int kk = 0; kk < 4; ++kk)
#pragma unroll
    for (int mq = 0; mq < 2; ++mq) {
      uint32_t a[4];  // A = ds (queries x keys): the stored tile read transposed
      LdMatrix4<true>(a, &ds[16 * kk + 8 * (m / 2) + lane.lane % 8][16 * mq + 8 * (m & 1)]);
#pragma unroll
      for (int nn = 0; nn < D / 32; ++nn) MmaBf16(acc[mq][nn], a, kf[kk][nn]);
    }
#pragma unroll
  for (int mq = 0; mq < 2; ++mq)
#pragma unroll
    for (int nn = 0; nn < D / 32; ++nn)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int q = 16 * mq + lane.g + 8 * h, d = D / 4 * (lane.warp % 4) + 8 * nn + 2 * lane.t;
        Store8(rows + int64_t(q) * D + d,
               uint2{__float_as_uint(acc[mq][nn][2 * h]), __float_as_uint(acc[mq][nn][2 * h + 1])});
      }
}

// dk (+)= Σ_i ds_ij q_i (the scale taken by the sum, as dq's) and dv (+)= Σ_i p_ij dO_i over
// queries i ≥ j. grid: Grid<kW / 4>, a block's 16 kW rows being keys, kW warps of 16 (kW = 8:
// the block's two row tiles of 64 share every Q, dO tile staged, read from memory once for 128
// keys). kAdd as above. Query tiles are taken in halves of 32 as above. A key row's sums are the
// same whatever kW is: the same bits.
// kFused: the block also leaves dq's partial sums (PartialRow) in `partial`: each half tile's ds
// goes through shared memory (bf16, as the products take it), where the 4 warps of a row tile
// multiply it by the row tile's K, each warp a quarter of the columns, over the row tile's 64
// keys: a row tile's sums are the same whatever kW is.
template <int D, bool kAdd, int kW, bool kFused>
__global__ void __launch_bounds__(32 * kW)
    TcBackwardKeyValue(float* dqkv, __nv_bfloat16* dqkv16, float* partial, const uint16_t* q16,
                       const uint16_t* k16, const uint16_t* v16, const uint16_t* do16,
                       const float* dsum, const float* lse2, int T, int C, int NH, float scale,
                       float scale_log2) {
  static_assert(kW == 4 || kW == 8, "one or two row tiles of 64 keys a block");
  constexpr int kM = kW / 4;
  __shared__ Tile<D> qs[2], dos[2];
  __shared__ RowStats stats[2];
  __shared__ std::conditional_t<kFused, HalfTileDs<16 * kW>, char> half_ds;
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
  const int f = place.tile(), own = place.own<kM>();
  // The warp's row tile: its keys' first query tile, its diagonal. A row tile past the head's
  // rows (kW = 8, mt >= own) loads nothing, multiplies nothing and is not stored.
  const int mt = kM == 1 ? 0 : lane.warp / 4, first = f + mt;
  const bool mine = mt < own;
  // kFused: the row tiles' K staged in the buffers of tile f + 1 (free until the loop's first
  // step starts its copies, after the barrier below), each warp's fragments read from there.
  const auto keys = [&](int r) -> Tile<D>& { return r == 0 ? qs[(f + 1) & 1] : dos[(f + 1) & 1]; };
  if constexpr (kFused) {
#pragma unroll
    for (int r = 0; r < kM; ++r)
      if (r < own) StageTile<D, 32 * kW>(keys(r), k16 + place.base + int64_t(f + r) * kTile * D);
    CopyCommit();
  }
  stage(f);
  uint32_t k[1][D / 16][4] = {}, v[1][D / 16][4] = {};  // one row tile a warp
  if (mine) {
    LoadA<D>(k[0], k16 + place.base, lane);
    LoadA<D>(v[0], v16 + place.base, lane);
  }
  KeyFragments<D> kf;
  float* rows = nullptr;  // kFused: the row tile's partial rows
  if constexpr (kFused) {
    CopyWait<1>();
    __syncthreads();
    LoadKeyFragments<D>(kf, keys(mt), lane);
    __syncthreads();
    rows = partial + (int64_t(place.at.bh) * PartialRow(place.Tp / kRows, place.Tp) +
                      PartialRow(first, place.Tp) - int64_t(kTile) * first) *
                         D;
  }
  float dk[1][D / 8][4] = {}, dv[1][D / 8][4] = {};
  const int tiles = place.tiles();
  for (int j = f; j < tiles; ++j) {
    AwaitTile(j, tiles, stage);
    const bool active = mine && j >= first;  // the same for a whole warp (and row tile)
    const bool diagonal = j == first;
    // Split: the whole tile under one branch (its loop the shorter); fused: every warp to the
    // barriers, the products under `active`.
    if (kFused || active) {
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int r0 = 32 * half;
        if (!kFused || active) {
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
          if constexpr (kFused) {  // ds, as the dk product rounded it
#pragma unroll
            for (int n = 0; n < 4; ++n)
#pragma unroll
              for (int h = 0; h < 2; ++h)
                StoreVector(&half_ds.row[16 * lane.warp + lane.g + 8 * h][8 * n + 2 * lane.t],
                            PackBf16(ds[0][n][2 * h], ds[0][n][2 * h + 1]));
          }
        }
        if constexpr (kFused) {
          __syncthreads();  // the row tile's ds, every warp's, in half_ds
          if (active)
            StoreQueryPartial<D>(rows + (int64_t(j) * kTile + r0) * D, half_ds.row + kTile * mt, kf,
                                 lane);
          // half_ds read before half 1 writes over it. After half 1's barrier every read of tile
          // j's buffers is done: the next tile's barrier (AwaitTile's) is enough for half_ds.
          if (half == 0) __syncthreads();
        }
      }
    }
    if constexpr (!kFused) __syncthreads();  // tile j consumed before it is copied over
  }
  if (!mine) return;
  const float one[2] = {1.0f, 1.0f}, scaled[2] = {scale, scale};
  const int hs = C / NH;
  const int64_t at = HeadStart(place.at.bh, T, NH, hs, 3 * int64_t(C));
  StoreRows<D>(dqkv + at + C, At(dqkv16, at + C), 3 * int64_t(C), dk[0], lane, T, hs, scaled, kAdd);
  StoreRows<D>(dqkv + at + 2 * C, At(dqkv16, at + 2 * C), 3 * int64_t(C), dv[0], lane, T, hs, one,
               kAdd);
}

// dq (+)= scale Σ_kb partial_kb over the key blocks kb ≤ r / 64 of row r, added in kb order (the
// fused backward's second pass), written with its bf16 copy as StoreRows writes. A thread takes
// 4 columns of a row of a head's Tp. grid: B NH Tp (D / 4) / kThreads blocks.
template <int D, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    SumQueryPartials(float* dqkv, __nv_bfloat16* dqkv16, const float* partial, int T, int Tp, int C,
                     int NH, float scale) {
  constexpr int kQuads = D / 4;
  const int64_t i = int64_t(blockIdx.x) * kThreads + threadIdx.x, row = i / kQuads;
  const int bh = int(row / Tp), r = int(row % Tp), d = 4 * int(i % kQuads), hs = C / NH;
  if (r >= T || d >= hs) return;
  const float* head = partial + int64_t(bh) * PartialRow(Tp / kRows, Tp) * D + d;
  float sum[4] = {};
  for (int kb = 0; kb <= r / kRows; ++kb) {
    const uint4 p = Load16(head + (PartialRow(kb, Tp) + r - int64_t(kRows) * kb) * D);
    sum[0] += __uint_as_float(p.x);
    sum[1] += __uint_as_float(p.y);
    sum[2] += __uint_as_float(p.z);
    sum[3] += __uint_as_float(p.w);
  }
  const int64_t at = HeadStart(bh, T, NH, hs, 3 * int64_t(C)) + int64_t(r) * 3 * C + d;
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if (d + c >= hs) break;
    StoreElement(dqkv, dqkv16, at + c, sum[c] * scale, kAdd);
  }
}

AttentionBackwardKind backward_kind = AttentionBackwardKind::kSplit;  // SetAttentionBackwardKind

// The dQ kernel with kM row tiles a warp, and the dK/dV kernel with kW warps (fused or not):
// their grids and block sizes from the same template arguments as their bounds.
template <int D, bool kAdd, int kM>
void Query(float* dqkv, __nv_bfloat16* dqkv16, const Operands& ops, int B, int T, int C, int NH,
           float scale) {
  ATL_LAUNCH((TcBackwardQuery<D, kAdd, kM>), Grid<kM>(B, T, NH), kThreads, dqkv, dqkv16, ops.q,
             ops.k, ops.v, ops.dout, ops.dsum, ops.lse2, T, C, NH, scale, scale * kLog2e);
}
template <int D, bool kAdd, int kW, bool kFused>
void KeyValue(float* dqkv, __nv_bfloat16* dqkv16, float* partial, const Operands& ops, int B, int T,
              int C, int NH, float scale) {
  ATL_LAUNCH((TcBackwardKeyValue<D, kAdd, kW, kFused>), Grid<kW / 4>(B, T, NH), 32 * kW, dqkv,
             dqkv16, partial, ops.q, ops.k, ops.v, ops.dout, ops.dsum, ops.lse2, T, C, NH, scale,
             scale * kLog2e);
}

// The fused backward's partial sums of one batch row's heads (they grow as NH T²: 27 MB at
// gpt2-124m's heads and T 1024, 409 MB at T 4096).
int64_t RowPartialBytes(int NH, int Tp, int D) {
  return int64_t(NH) * PartialRow(Tp / kRows, Tp) * D * int64_t(sizeof(float));
}
size_t partial_limit = size_t(1) << 30;  // SetAttentionPartialLimit

// The operands of batch rows b.. (their heads' rows follow those of the rows before).
Operands RowsFrom(const Operands& ops, int b, int NH) {
  const int64_t heads = int64_t(b) * NH, rows = heads * ops.Tp, elements = rows * ops.D;
  Operands part = ops;
  for (uint16_t** p : {&part.q, &part.k, &part.v, &part.dout}) *p += elements;
  part.dsum += rows;
  part.lse2 += rows;
  return part;
}

// The backward's kernels for head size D, adding to dqkv or writing it (kAdd), with the block
// rows and the backward set: the dQ kernel then the dK/dV kernel; or, for as many batch rows at
// a time as their partial sums fit in partial_limit, the fused dK/dV kernel then the sum of its
// partials (in Scratch(kScratchReduce): nothing between the two launches takes that slot); the
// split kernels when not one row's fit.
template <int D, bool kAdd>
void Backward(float* dqkv, __nv_bfloat16* dqkv16, const Operands& ops, int B, int T, int C, int NH,
              float scale) {
  const bool wide = BlockRows().key == 2 * kRows;
  const int64_t row_bytes = RowPartialBytes(NH, ops.Tp, D);
  const int rows_a_part = int(std::min<uint64_t>(B, partial_limit / uint64_t(row_bytes)));
  if (backward_kind == AttentionBackwardKind::kSplit || rows_a_part == 0) {
    (BlockRows().query == 2 * kRows ? Query<D, kAdd, 2> : Query<D, kAdd, 1>)(dqkv, dqkv16, ops, B,
                                                                             T, C, NH, scale);
    (wide ? KeyValue<D, kAdd, 8, false> : KeyValue<D, kAdd, 4, false>)(dqkv, dqkv16, nullptr, ops,
                                                                       B, T, C, NH, scale);
    return;
  }
  auto* partial = static_cast<float*>(Scratch(kScratchReduce, size_t(rows_a_part * row_bytes)));
  for (int b = 0; b < B; b += rows_a_part) {
    const int n = std::min(rows_a_part, B - b);
    const Operands part = RowsFrom(ops, b, NH);
    const int64_t first = int64_t(b) * T * 3 * C;  // batch row b's in dqkv
    float* dq = dqkv + first;
    __nv_bfloat16* dq16 = dqkv16 != nullptr ? dqkv16 + first : nullptr;
    (wide ? KeyValue<D, kAdd, 8, true> : KeyValue<D, kAdd, 4, true>)(dq, dq16, partial, part, n, T,
                                                                     C, NH, scale);
    // A thread 4 columns of each of the heads' Tp rows (a multiple of 64): whole blocks.
    const int64_t rows = int64_t(n) * NH * ops.Tp;
    ATL_LAUNCH((SumQueryPartials<D, kAdd>),
               AttentionGrid(rows * (D / 4) / kThreads, "dq partial sums"), kThreads, dq, dq16,
               partial, T, ops.Tp, C, NH, scale);
  }
}

}  // namespace
}  // namespace atl::kernels::cuda::tc

namespace atl::kernels::cuda {

AttentionBackwardKind SetAttentionBackwardKind(AttentionBackwardKind backward) {
  return std::exchange(tc::backward_kind, backward);
}

size_t SetAttentionPartialLimit(size_t bytes) { return std::exchange(tc::partial_limit, bytes); }

size_t AttentionPartialBytes(int B, int T, int C, int NH) {
  if (B <= 0 || T <= 0 || NH <= 0) return 0;
  const Operands shape = OperandShape(T, C, NH);
  return size_t(B) * size_t(tc::RowPartialBytes(NH, shape.Tp, shape.D));
}

void TcAttentionBackward(float* dqkv, __nv_bfloat16* dqkv16, const float* dout, const float* out,
                         const float* qkv, const float* lse, int B, int T, int C, int NH, bool add,
                         const uint16_t* kept) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const Operands ops = BackwardOperands(dout, out, qkv, lse, B, T, C, NH, kept);
  using Launch = void (*)(float*, __nv_bfloat16*, const Operands&, int, int, int, int, float);
  static constexpr Launch kLaunch[2][2] = {// [D == 64][add]
                                           {tc::Backward<32, false>, tc::Backward<32, true>},
                                           {tc::Backward<64, false>, tc::Backward<64, true>}};
  kLaunch[ops.D == 64][add](dqkv, dqkv16, ops, B, T, C, NH, scale);
}

}  // namespace atl::kernels::cuda
