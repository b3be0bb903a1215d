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
#include "kernels/cuda/attention_tc_tiles.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda::tc {
namespace {

constexpr float kLn2 = 0.6931471805599453f;
// Blocks an SM must hold at head size 64 (__launch_bounds__'s second argument), for kM row
// tiles a warp (the forward's 64 kM rows a block, SetAttentionBlockRows). At kM = 1 it fits 4
// blocks' 128 registers by spilling 40 bytes (7 spill loads a key tile in its SASS); at 3 blocks
// (168) it would spill none. 4 was the faster when last timed (an earlier forward, the twelfth
// session).
template <int D, int kM>
constexpr int kForwardBlocks = D != 64   ? 1
                               : kM == 1 ? 4
                                         : 2;

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

// The forward for head size D, kM row tiles a warp.
template <int D, int kM>
void Forward(float* out, __nv_bfloat16* out16, float* lse, const Operands& ops, int B, int T, int C,
             int NH, float scale) {
  ATL_LAUNCH((TcForward<D, kM>), Grid<kM>(B, T, NH), kThreads, out, out16, lse, ops.q, ops.k, ops.v,
             T, C, NH, scale * kLog2e);
}

AttentionBlockRows block_rows;  // SetAttentionBlockRows

}  // namespace

AttentionBlockRows BlockRows() { return block_rows; }

}  // namespace atl::kernels::cuda::tc

namespace atl::kernels::cuda {

AttentionBlockRows SetAttentionBlockRows(AttentionBlockRows rows) {
  CheckAttentionBlockRows(rows);
  return std::exchange(tc::block_rows, rows);
}

bool TensorCoreAttention(int C, int NH) {
  static const bool has_mma = Probe().cc_major >= 8;  // mma.sync's bf16 shape: Ampere on
  return Bf16Matmul() && C / NH <= 64 && has_mma;
}

void TcAttentionForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int B,
                        int T, int C, int NH, uint16_t* keep) {
  const float scale = 1.0f / std::sqrt(float(C / NH));
  const Operands ops = ForwardOperands(qkv, B, T, C, NH, keep);
  const bool two = tc::BlockRows().query == 2 * tc::kRows;
  auto* const launch = ops.D == 32 ? (two ? tc::Forward<32, 2> : tc::Forward<32, 1>)
                                   : (two ? tc::Forward<64, 2> : tc::Forward<64, 1>);
  launch(out, out16, lse, ops, B, T, C, NH, scale);
}

}  // namespace atl::kernels::cuda
