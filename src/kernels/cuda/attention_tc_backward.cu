// The tensor-core attention's backward (the data path of attention_tc.cu's comment): dQ by a
// kernel over query blocks, dK and dV by a kernel over key blocks, so that every gradient element
// is one thread's sum in a fixed order and no atomic is needed.
#include <cmath>

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
  (BlockRows().query == 2 * kRows ? Query<D, kAdd, 2> : Query<D, kAdd, 1>)(dqkv, dqkv16, ops, B, T,
                                                                           C, NH, scale);
  (BlockRows().key == 2 * kRows ? KeyValue<D, kAdd, 8> : KeyValue<D, kAdd, 4>)(dqkv, dqkv16, ops, B,
                                                                               T, C, NH, scale);
}

}  // namespace
}  // namespace atl::kernels::cuda::tc

namespace atl::kernels::cuda {

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
