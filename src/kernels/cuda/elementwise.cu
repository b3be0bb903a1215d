// Embeddings (encoder), GELU and residual adds: one thread per element for the embeddings, four
// for GELU and the adds (Quad, common.cuh); the embedding gradient groups repeated tokens so that
// no two threads add into one row.
#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr float kGeluS = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluC = 0.044715f;

// sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3): GELU(x) = x * sigmoid(2u) (see cpu/).
__device__ inline float Sigmoid2U(float x) {
  const float u = kGeluS * (x + kGeluC * x * x * x);
  return 1.0f / (1.0f + expf(-2.0f * u));
}

// Four elements a thread (Quad, common.cuh; `aligned`: QuadAligned). out_bf16 (or null): out
// rounded to bf16 as well; out null: the bf16 alone.
__global__ void GeluForwardKernel(float* out, __nv_bfloat16* out_bf16, const float* inp, size_t n,
                                  bool aligned) {
  const Quad q = QuadOf(n, aligned);
  if (q.count == 0) return;
  float y[4];
  LoadQuad(y, inp, q);
#pragma unroll
  for (int k = 0; k < 4; ++k) y[k] *= Sigmoid2U(y[k]);
  if (out != nullptr) StoreQuad(out, y, q);
  if (out_bf16 != nullptr) StoreQuad(out_bf16, y, q);
}

// GELU's backward at one element: d (+)= GELU'(x) g (add: added to d, else written over it).
__device__ inline float GeluGrad(float x, float g, float d, bool add) {
  const float s = Sigmoid2U(x);
  const float du = kGeluS * (1.0f + 3.0f * kGeluC * x * x);
  const float grad = s + 2.0f * x * s * (1.0f - s) * du;
  return add ? d + grad * g : grad * g;
}

// Elements q.i .. of GELU's backward: dinp (+)= GELU'(inp) dout (dinp null: not written; add
// needs it), dinp_bf16 (or null) the result rounded to bf16 as well; v the results.
__device__ inline void GeluBackwardQuad(float (&v)[4], float* dinp, __nv_bfloat16* dinp_bf16,
                                        const float* inp, const float* dout, const Quad& q,
                                        bool add) {
  float x[4], g[4];
  LoadQuad(x, inp, q);
  LoadQuad(g, dout, q);
  if (add) LoadQuad(v, dinp, q);
#pragma unroll
  for (int k = 0; k < 4; ++k) v[k] = GeluGrad(x[k], g[k], add ? v[k] : 0.0f, add);
  if (dinp != nullptr) StoreQuad(dinp, v, q);
  if (dinp_bf16 != nullptr) StoreQuad(dinp_bf16, v, q);
}

__global__ void GeluBackwardKernel(float* dinp, __nv_bfloat16* dinp_bf16, const float* inp,
                                   const float* dout, size_t n, bool add, bool aligned) {
  const Quad q = QuadOf(n, aligned);
  float v[4];
  if (q.count != 0) GeluBackwardQuad(v, dinp, dinp_bf16, inp, dout, q, add);
}

// The same over [rows, cols], also summing the results per column into partial[chunk][col], as
// ColumnSumsAdd's first pass sums what was written (SumColumnChunks: the same order). The
// columns one a thread, or (Quads) four where cols is a multiple of 4 and the arrays aligned.
__global__ void GeluBackwardColumnsKernel(float* dinp, __nv_bfloat16* dinp_bf16, float* partial,
                                          const float* inp, const float* dout, int64_t rows,
                                          int cols, bool add) {
  SumColumnChunks(partial, rows, cols, [=](int64_t i) {
    const Quad q{size_t(i), 1, false};
    float v[4];
    GeluBackwardQuad(v, dinp, dinp_bf16, inp, dout, q, add);
    return v[0];
  });
}
__global__ void GeluBackwardColumnQuadsKernel(float* dinp, __nv_bfloat16* dinp_bf16, float* partial,
                                              const float* inp, const float* dout, int64_t rows,
                                              int cols, bool add) {
  SumColumnQuads(partial, rows, cols, [=](int64_t i, float(&v)[4]) {
    GeluBackwardQuad(v, dinp, dinp_bf16, inp, dout, Quad{size_t(i), 4, true}, add);
  });
}

__global__ void ResidualForwardKernel(float* out, const float* a, const float* b, size_t n,
                                      bool aligned) {
  const Quad q = QuadOf(n, aligned);
  if (q.count == 0) return;
  float x[4], y[4];
  LoadQuad(x, a, q);
  LoadQuad(y, b, q);
#pragma unroll
  for (int k = 0; k < 4; ++k) x[k] += y[k];
  StoreQuad(out, x, q);
}

// One thread per (b, t, c).
__global__ void EncoderForwardKernel(float* out, const int32_t* inp, const float* wte,
                                     const float* wpe, int64_t n, int T, int C, int vocab_begin,
                                     int vocab_end) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t bt = i / C;
  const int c = int(i % C);
  const int t = int(bt % T);
  const int32_t token = inp[bt];
  float v;
  if (vocab_end < 0) {
    v = wte[int64_t(token - vocab_begin) * C + c] + wpe[int64_t(t) * C + c];
  } else {
    const bool held = token >= vocab_begin && token < vocab_end;
    v = held ? wte[int64_t(token - vocab_begin) * C + c] : 0.0f;
    if (wpe != nullptr) v += wpe[int64_t(t) * C + c];
  }
  out[i] = v;
}

// dwte: block x = one distinct token, threads over channels; the token's positions are added in
// (b, t) order, one at a time into the row, as the CPU backend adds them.
__global__ void TokenGradKernel(float* dwte, const float* dout, const int32_t* rows,
                                const int32_t* offsets, const int32_t* positions, int C) {
  const int c = blockIdx.y * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int u = blockIdx.x;
  float* w = dwte + int64_t(rows[u]) * C + c;
  float acc = *w;
  for (int j = offsets[u]; j < offsets[u + 1]; ++j) acc += dout[int64_t(positions[j]) * C + c];
  *w = acc;
}

// dwpe[t, c] += dout[b, t, c] for b in order.
__global__ void PositionGradKernel(float* dwpe, const float* dout, int B, int T, int C) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= int64_t(T) * C) return;
  float acc = dwpe[i];
  for (int b = 0; b < B; ++b) acc += dout[int64_t(b) * T * C + i];
  dwpe[i] = acc;
}

}  // namespace

void GeluForward(float* out, const float* inp, size_t n, uint16_t* out_bf16) {
  if (n == 0) return;
  __nv_bfloat16* out16 = Bf16Copy(out_bf16);
  if (out == nullptr && out16 == nullptr)
    ThrowCuda("GeluForward", __FILE__, __LINE__, "no out: a null out needs a bf16 copy");
  ATL_LAUNCH(GeluForwardKernel, QuadBlocks(n, 256), 256, out, out16, inp, n,
             QuadAligned({out, inp}, {out16}));
}

void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n, uint16_t* dinp_bf16,
                  GradInto into, float* dbias, int cols) {
  if (n == 0) return;
  __nv_bfloat16* dinp16 = Bf16Copy(dinp_bf16);
  const bool add = into == GradInto::kAdd;
  if (dinp == nullptr && (add || dinp16 == nullptr))
    ThrowCuda("GeluBackward", __FILE__, __LINE__,
              "no dinp: a null dinp needs a bf16 copy, and GradInto::kWrite");
  const bool aligned = QuadAligned({dinp, inp, dout}, {dinp16});
  if (dbias == nullptr) {
    ATL_LAUNCH(GeluBackwardKernel, QuadBlocks(n, 256), 256, dinp, dinp16, inp, dout, n, add,
               aligned);
    return;
  }
  if (cols <= 0 || n % size_t(cols) != 0)
    ThrowCuda("GeluBackward", __FILE__, __LINE__, "the columns do not divide n");
  const int64_t rows = int64_t(n / size_t(cols));
  float* partial = ColumnChunkScratch(rows, cols);
  if (aligned && cols % 4 == 0)
    ATL_LAUNCH(GeluBackwardColumnQuadsKernel, ColumnQuadGrid(rows, cols), 128, dinp, dinp16,
               partial, inp, dout, rows, cols, add);
  else
    ATL_LAUNCH(GeluBackwardColumnsKernel, ColumnChunkGrid(rows, cols), 128, dinp, dinp16, partial,
               inp, dout, rows, cols, add);
  AddColumnChunks(dbias, partial, rows, cols);
}

void ResidualForward(float* out, const float* a, const float* b, size_t n) {
  if (n == 0) return;
  ATL_LAUNCH(ResidualForwardKernel, QuadBlocks(n, 256), 256, out, a, b, n,
             QuadAligned({out, a, b}));
}

void ResidualBackward(float* da, float* db, const float* dout, size_t n) {
  if (n == 0) return;
  for (float* d : {da, db}) {
    if (d == nullptr) continue;
    ATL_LAUNCH(ResidualForwardKernel, QuadBlocks(n, 256), 256, d, static_cast<const float*>(d),
               dout, n, QuadAligned({d, dout}));
  }
}

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, int vocab_begin, int vocab_end) {
  const size_t n = size_t(B) * T * C;
  if (n == 0) return;
  ATL_LAUNCH(EncoderForwardKernel, Blocks(n, 256), 256, out, inp, wte, wpe, int64_t(n), T, C,
             vocab_begin, vocab_end);
}

void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                     const int32_t* host_inp, int B, int T, int C, int vocab_begin, int vocab_end) {
  const int N = B * T;
  if (N == 0 || C == 0) return;
  (void)inp;
  if (dwte != nullptr) {
    // Group the positions by token (stable: (b, t) order within a token), on the host.
    const int limit = vocab_end >= 0 ? vocab_end : INT32_MAX;
    std::vector<int32_t> order;
    order.reserve(size_t(N));
    for (int i = 0; i < N; ++i)
      if (host_inp[i] >= vocab_begin && host_inp[i] < limit) order.push_back(i);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t x, int32_t y) { return host_inp[x] < host_inp[y]; });
    std::vector<int32_t> rows, offsets;
    for (size_t j = 0; j < order.size(); ++j) {
      if (j == 0 || host_inp[order[j]] != host_inp[order[j - 1]]) {
        rows.push_back(host_inp[order[j]] - vocab_begin);
        offsets.push_back(int32_t(j));
      }
    }
    offsets.push_back(int32_t(order.size()));
    if (!rows.empty()) {
      // One upload: rows, offsets, positions.
      std::vector<int32_t> packed(rows);
      packed.insert(packed.end(), offsets.begin(), offsets.end());
      packed.insert(packed.end(), order.begin(), order.end());
      auto* dev = static_cast<int32_t*>(Scratch(kScratchOp, packed.size() * sizeof(int32_t)));
      CopyToDeviceQueued(dev, packed.data(), packed.size() * sizeof(int32_t));
      const int U = int(rows.size());
      const dim3 grid(unsigned(U), Blocks(size_t(C), 256));
      ATL_LAUNCH(TokenGradKernel, grid, 256, dwte, dout, dev, dev + U, dev + 2 * U + 1, C);
    }
  }
  if (dwpe != nullptr) {
    ATL_LAUNCH(PositionGradKernel, Blocks(size_t(T) * C, 256), 256, dwpe, dout, B, T, C);
  }
}

}  // namespace atl::kernels::cuda
