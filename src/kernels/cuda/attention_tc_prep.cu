// The tensor-core attention's operands (attention_tc.cuh's Operands): the float activations
// rounded to bf16 in the kernels' layout, one pass each, a thread per 8 elements (16 bytes
// written); counted in Bf16RoundedElements (ops.h), the elements of the floats read. The backward's
// pass over dO also forms D_i = dO_i · O_i, the sum of a row's 8-element parts by a fixed butterfly
// over the lanes holding the row: the same bits every run.
#include <cmath>

#include "kernels/cuda/attention_tc.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"

namespace atl::kernels::cuda {
namespace {

constexpr int kThreads = 256;  // a multiple of 64 rows' chunks: the grids below are whole blocks

// Where chunk x (8 elements) of row t of head bh starts in a [B, T, width] tensor whose head h
// is columns offset + h hs ..; and how many of its 8 elements are there (0 past T or hs).
struct Chunk {
  int64_t at;
  int count;
};
__device__ inline Chunk ChunkOf(int bh, int t, int x, int T, int NH, int hs, int64_t width,
                                int64_t offset) {
  const int d = 8 * x;
  const int count = t < T ? max(0, min(8, hs - d)) : 0;
  return {(int64_t(bh / NH) * T + t) * width + offset + int64_t(bh % NH) * hs + d, count};
}

// The chunk's floats (0 past count): two 16-byte loads where the chunk is whole and aligned.
__device__ inline void LoadChunk(float (&x)[8], const float* src, int count) {
  if (count == 8 && reinterpret_cast<uintptr_t>(src) % 16 == 0) {
    const uint4 lo = Load16(src), hi = Load16(src + 4);
    const uint32_t w[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = __uint_as_float(w[i]);
    return;
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) x[i] = i < count ? src[i] : 0.0f;
}

// x rounded to bf16 (to nearest, ties to even), packed as 16 bytes.
__device__ inline uint4 Pack(const float (&x)[8]) {
  return uint4{PackBf16(x[0], x[1]), PackBf16(x[2], x[3]), PackBf16(x[4], x[5]),
               PackBf16(x[6], x[7])};
}

// Thread threadIdx.x of block blockIdx.x: chunk x of row t of plane p (a head's Tp rows of one
// operand), planes of Tp D / 8 chunks, a whole number of blocks each (Tp is a multiple of 64): in
// 32-bit arithmetic, a division by a run-time value per thread (64-bit ones cost many more).
template <int D>
struct ChunkPlace {
  unsigned plane;
  int t, x;
  __device__ explicit ChunkPlace(int Tp) {
    constexpr int kChunks = D / 8;
    const unsigned blocks_a_plane = unsigned(Tp) * kChunks / kThreads;
    plane = blockIdx.x / blocks_a_plane;
    const unsigned i = (blockIdx.x % blocks_a_plane) * kThreads + threadIdx.x;
    t = int(i / kChunks);
    x = int(i % kChunks);
  }
  __device__ int64_t at(int Tp) const { return (int64_t(plane) * Tp + t) * D + 8 * x; }
};

// dst [3][B * NH][Tp][D] = Q, K, V of qkv [B, T, 3C]; planes: 3 B NH, operand by operand.
template <int D>
__global__ void RoundQkv(uint16_t* dst, const float* qkv, int T, int Tp, int C, int NH,
                         unsigned heads) {
  const ChunkPlace<D> place(Tp);
  const int which = int(place.plane / heads), bh = int(place.plane % heads);
  const Chunk c = ChunkOf(bh, place.t, place.x, T, NH, C / NH, 3 * int64_t(C), int64_t(which) * C);
  float v[8];
  LoadChunk(v, qkv + c.at, c.count);
  Store16(dst + place.at(Tp), Pack(v));
}

// dst [B * NH][Tp][D] = dout [B, T, C] in bf16; dsum and lse2 (B * NH * Tp floats): Operands'.
// Planes: B NH.
template <int D>
__global__ void RoundDout(uint16_t* dst, float* dsum, float* lse2, const float* dout,
                          const float* out, const float* lse, int T, int Tp, int C, int NH) {
  constexpr int kChunks = D / 8;
  const ChunkPlace<D> place(Tp);
  const int bh = int(place.plane), t = place.t;
  const Chunk c = ChunkOf(bh, t, place.x, T, NH, C / NH, C, 0);
  float g[8], o[8];
  LoadChunk(g, dout + c.at, c.count);
  LoadChunk(o, out + c.at, c.count);
  const uint4 packed = Pack(g);
  Store16(dst + place.at(Tp), packed);
  // dO as the products see it (bf16), so that Σ_j p_ij dp_ij - D_i is 0 as it should be.
  const uint32_t w[4] = {packed.x, packed.y, packed.z, packed.w};
  float part = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    part += Bf16Lo(w[k]) * o[2 * k];
    part += Bf16Hi(w[k]) * o[2 * k + 1];
  }
  // The row's chunks are kChunks neighbouring lanes (32 and kThreads are multiples of it).
#pragma unroll
  for (int m = 1; m < kChunks; m *= 2) part += __shfl_xor_sync(0xffffffffu, part, m);
  if (place.x != 0) return;
  const int64_t row = int64_t(bh) * Tp + t;
  dsum[row] = t < T ? part : 0.0f;
  lse2[row] = t < T ? lse[int64_t(bh) * T + t] * kLog2e : INFINITY;
}

// The grid of one thread per chunk of `rows` rows of D elements (a whole number of blocks: rows
// is a multiple of 64).
dim3 ChunkGrid(int64_t rows, int D) { return AttentionGrid(rows * (D / 8) / kThreads, "operands"); }

// The layout's sizes: D, Tp (OperandShape), and the elements of one operand's copy.
Operands Sizes(int B, int T, int C, int NH, int64_t* n) {
  Operands ops = OperandShape(T, C, NH);
  *n = int64_t(B) * NH * ops.Tp * ops.D;
  return ops;
}

// The layout's room: Q, K, V in `kept` (or, when null, in Scratch(kScratchOp)); for the backward
// dO, dsum and lse2 in Scratch(kScratchOp).
Operands Layout(int B, int T, int C, int NH, bool backward, uint16_t* kept) {
  int64_t n = 0;
  Operands ops = Sizes(B, T, C, NH, &n);
  const int64_t rows = n / ops.D;
  const int64_t copies = (kept == nullptr ? 3 : 0) + (backward ? 1 : 0), stats = backward ? 2 : 0;
  auto* room = static_cast<uint16_t*>(Scratch(
      kScratchOp, size_t(copies * n) * sizeof(uint16_t) + size_t(stats * rows) * sizeof(float)));
  ops.q = kept != nullptr ? kept : room;
  ops.k = ops.q + n;
  ops.v = ops.k + n;
  if (backward) {
    ops.dout = kept != nullptr ? room : ops.v + n;
    ops.dsum = reinterpret_cast<float*>(ops.dout + n);
    ops.lse2 = ops.dsum + rows;
  }
  return ops;
}

// Operands' Q, K, V (ops.q on) from qkv.
void LaunchRoundQkv(const Operands& ops, const float* qkv, int B, int T, int C, int NH) {
  const unsigned heads = unsigned(B) * unsigned(NH);
  const dim3 grid = ChunkGrid(3 * int64_t(heads) * ops.Tp, ops.D);
  if (ops.D == 32)
    ATL_LAUNCH(RoundQkv<32>, grid, kThreads, ops.q, qkv, T, ops.Tp, C, NH, heads);
  else
    ATL_LAUNCH(RoundQkv<64>, grid, kThreads, ops.q, qkv, T, ops.Tp, C, NH, heads);
  CountBf16Rounded(3 * uint64_t(B) * uint64_t(T) * uint64_t(C));
}

}  // namespace

Operands OperandShape(int T, int C, int NH) {
  Operands ops;
  ops.D = C / NH <= 32 ? 32 : 64;
  ops.Tp = (T + kAttentionRows - 1) / kAttentionRows * kAttentionRows;
  return ops;
}

size_t OperandElements(int B, int T, int C, int NH) {
  int64_t n = 0;
  Sizes(B, T, C, NH, &n);
  return 3 * size_t(n);
}

Operands ForwardOperands(const float* qkv, int B, int T, int C, int NH, uint16_t* keep) {
  const Operands ops = Layout(B, T, C, NH, /*backward=*/false, keep);
  LaunchRoundQkv(ops, qkv, B, T, C, NH);
  return ops;
}

Operands BackwardOperands(const float* dout, const float* out, const float* qkv, const float* lse,
                          int B, int T, int C, int NH, const uint16_t* kept) {
  // The kept copies are only read (Operands' pointers are writable for the passes that fill them).
  const Operands ops = Layout(B, T, C, NH, /*backward=*/true, const_cast<uint16_t*>(kept));
  if (kept == nullptr) LaunchRoundQkv(ops, qkv, B, T, C, NH);
  const dim3 grid = ChunkGrid(int64_t(B) * NH * ops.Tp, ops.D);
  if (ops.D == 32)
    ATL_LAUNCH(RoundDout<32>, grid, kThreads, ops.dout, ops.dsum, ops.lse2, dout, out, lse, T,
               ops.Tp, C, NH);
  else
    ATL_LAUNCH(RoundDout<64>, grid, kThreads, ops.dout, ops.dsum, ops.lse2, dout, out, lse, T,
               ops.Tp, C, NH);
  CountBf16Rounded(uint64_t(B) * uint64_t(T) * uint64_t(C));
  return ops;
}

}  // namespace atl::kernels::cuda
