// LayerNorm forward and backward: one warp per row (the row's sums by a fixed butterfly). The
// backward makes the input's gradient and the weight and bias gradients in one pass (a warp's
// rows summed per column in registers, a block's warps in shared memory, then the blocks' sums
// added in a fixed order) for widths up to 2048, in two passes beyond.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kChunkRows = 64;    // rows per partial column sum

// out_bf16 (or null): out rounded to bf16 as well; out null: the bf16 alone. res_a (or null): the
// rows normalized are res = res_a + res_b, written to res as they are read (ResidualForward's
// sum, so the same bits as the two kernels), and inp is unused.
__global__ void LayerNormForwardKernel(float* out, __nv_bfloat16* out_bf16, float* mean,
                                       float* rstd, const float* inp, float* res,
                                       const float* res_a, const float* res_b, const float* weight,
                                       const float* bias, int N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const float* x = res_a != nullptr ? res + n * C : inp + n * C;
  float s = 0.0f;
  if (res_a != nullptr) {
    for (int c = lane; c < C; c += 32) {
      const float v = res_a[n * C + c] + res_b[n * C + c];
      res[n * C + c] = v;
      s += v;
    }
  } else {
    for (int c = lane; c < C; c += 32) s += x[c];
  }
  const float m = WarpSum(s) / float(C);
  // Two passes, as the CPU: no cancellation when |mean| >> std.
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float d = x[c] - m;
    v += d * d;
  }
  v = WarpSum(v) / float(C);
  const float r = 1.0f / sqrtf(v + 1e-5f);
  float* o = out != nullptr ? out + n * C : nullptr;
  __nv_bfloat16* ob = out_bf16 != nullptr ? out_bf16 + n * C : nullptr;
  for (int c = lane; c < C; c += 32) {
    const float y = (x[c] - m) * r * weight[c] + bias[c];
    if (o != nullptr) o[c] = y;
    if (ob != nullptr) ob[c] = __float2bfloat16_rn(y);
  }
  if (lane == 0) {
    mean[n] = m;
    rstd[n] = r;
  }
}

// The row's input gradient, one warp per row: lane takes columns lane + 32 j. dinp (+)= it (add:
// added to dinp, else written over it; dinp null: not written); dinp_bf16 (or null): the result
// rounded to bf16 as well. kCols > 0: the columns are j < kCols (C <= 32 kCols), and each
// column's dy * norm and dy are added to dw[j], db[j]; up to 32 columns a lane (C <= 1024) the
// row's dout and inp are loaded into registers at once (every load in flight together: with the
// fused kernel's other changes, 137 -> 45 us a call at C = 768 on an H100; 157 registers a thread
// there, 168 at 32 columns, while 40 and more would need over 255 and spill), beyond that read
// where used, as before (two reads, the second from L1). kCols = 0: any C, no sums.
template <int kCols>
__device__ inline void LayerNormRowGrad(float* dinp, __nv_bfloat16* dinp_bf16, const float* dout,
                                        const float* inp, const float* weight, const float* mean,
                                        const float* rstd, int64_t n, int C, bool add, float* dw,
                                        float* db) {
  const int lane = threadIdx.x & 31;
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  float* dx = dinp != nullptr ? dinp + n * C : nullptr;
  __nv_bfloat16* dxb = dinp_bf16 != nullptr ? dinp_bf16 + n * C : nullptr;
  // The row in registers (held) for 1 to 32 columns a lane; read where used otherwise.
  constexpr bool kHeld = kCols > 0 && kCols <= 32;
  const int cols = kCols > 0 ? kCols : (C + 31) / 32;
  float held_d[kHeld ? kCols : 1], held_x[kHeld ? kCols : 1];
  if constexpr (kHeld) {
#pragma unroll
    for (int j = 0; j < kCols; ++j) {
      const int c = lane + 32 * j;
      held_d[j] = c < C ? dy[c] : 0.0f;
      held_x[j] = c < C ? x[c] : 0.0f;
    }
  }
  const auto d_at = [&](int j, int c) -> float {
    if constexpr (kHeld) return held_d[j];
    return dy[c];
  };
  const auto x_at = [&](int j, int c) -> float {
    if constexpr (kHeld) return held_x[j];
    return x[c];
  };
  float g_sum = 0.0f, gn_sum = 0.0f;
#pragma unroll
  for (int j = 0; j < cols; ++j) {
    const int c = lane + 32 * j;
    if (c < C) {
      const float g = d_at(j, c) * weight[c];
      g_sum += g;
      gn_sum += g * (x_at(j, c) - m) * r;
    }
  }
  const float g_mean = WarpSum(g_sum) / float(C);
  const float gn_mean = WarpSum(gn_sum) / float(C);
#pragma unroll
  for (int j = 0; j < cols; ++j) {
    const int c = lane + 32 * j;
    if (c < C) {
      const float norm = (x_at(j, c) - m) * r;
      const float d = d_at(j, c);  // read before dx is written (were they one buffer)
      if (dx != nullptr) {
        const float g = d * weight[c] - g_mean - norm * gn_mean;
        const float v = add ? dx[c] + r * g : r * g;
        dx[c] = v;
        if (dxb != nullptr) dxb[c] = __float2bfloat16_rn(v);
      }
      if constexpr (kCols > 0) {
        dw[j] += d * norm;
        db[j] += d;
      }
    }
  }
}

// Any C, the input's gradient alone (one warp per row).
__global__ void LayerNormInputGradKernel(float* dinp, __nv_bfloat16* dinp_bf16, const float* dout,
                                         const float* inp, const float* weight, const float* mean,
                                         const float* rstd, int N, int C, bool add) {
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  LayerNormRowGrad<0>(dinp, dinp_bf16, dout, inp, weight, mean, rstd, n, C, add, nullptr, nullptr);
}

// C <= 32 kCols: the input's gradient and the weights' in one pass over dout and inp. Warp w (of
// the grid: blockIdx.x kFusedWarps + its index in the block) takes rows [w kWarpRows,
// (w + 1) kWarpRows) in order, its lanes holding the sums of their columns in
// registers; the block's warps then add theirs into shared memory in warp order, and the block
// writes partial[block][c] (of dy * norm) and partial[block][C + c] (of dy), which AddChunkSums
// adds in a fixed order. partial null: the input's gradient alone.
// 2 rows a warp, 4 warps a block: 1024 blocks for gpt2's 8192 rows, 3 at a time an SM (157
// registers a thread at C = 768). 8 rows a warp (256 blocks, 2 an SM) left the loads too few to
// cover DRAM's latency: 137 us a call on an H100, 17% of its bandwidth (ncu). The weights'
// gradients are summed per 8 rows a block, then the blocks' sums in order (AddChunkSums): a fixed
// order, another than with 32 rows a block, so their bits differ from the earlier kernel's.
constexpr int kWarpRows = 2;
constexpr int kFusedWarps = 4;
constexpr int kFusedBlockRows = kWarpRows * kFusedWarps;
template <int kCols>
__global__ void __launch_bounds__(32 * kFusedWarps)
    LayerNormBackwardKernel(float* dinp, __nv_bfloat16* dinp_bf16, float* partial,
                            const float* dout, const float* inp, const float* weight,
                            const float* mean, const float* rstd, int N, int C, bool add) {
  __shared__ float sums[2][32 * kCols];  // the block's: [0] of dy * norm, [1] of dy
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int64_t r0 = int64_t(blockIdx.x) * kFusedBlockRows + int64_t(warp) * kWarpRows;
  const int64_t r1 = min(int64_t(N), r0 + kWarpRows);  // r1 <= r0: a warp past the rows, sums 0
  float dw[kCols], db[kCols];
#pragma unroll
  for (int j = 0; j < kCols; ++j) dw[j] = db[j] = 0.0f;
  for (int64_t n = r0; n < r1; ++n)
    LayerNormRowGrad<kCols>(dinp, dinp_bf16, dout, inp, weight, mean, rstd, n, C, add, dw, db);
  if (partial == nullptr) return;  // the whole block: no barrier below is skipped by some
  for (int k = 0; k < kFusedWarps; ++k) {
    if (warp == k) {
#pragma unroll
      for (int j = 0; j < kCols; ++j) {
        const int i = lane + 32 * j;
        if (i >= C) break;
        sums[0][i] = k == 0 ? dw[j] : sums[0][i] + dw[j];
        sums[1][i] = k == 0 ? db[j] : sums[1][i] + db[j];
      }
    }
    __syncthreads();
  }
  float* p = partial + int64_t(blockIdx.x) * 2 * C;
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    p[c] = sums[0][c];
    p[C + c] = sums[1][c];
  }
}

// Any C, the weights' gradients alone: partial[chunk][c] = sum over the chunk's rows of
// dout * norm, partial[chunk][C + c] = of dout.
__global__ void LayerNormParamChunkKernel(float* partial, const float* dout, const float* inp,
                                          const float* mean, const float* rstd, int N, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  const int64_t chunks = (int64_t(N) + kChunkRows - 1) / kChunkRows;
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {  // grid.y <= 65535
    const int64_t r0 = chunk * kChunkRows, r1 = min(int64_t(N), r0 + kChunkRows);
    float dw = 0.0f, db = 0.0f;
    for (int64_t r = r0; r < r1; ++r) {
      const float dy = dout[r * C + c];
      dw += dy * (inp[r * C + c] - mean[r]) * rstd[r];
      db += dy;
    }
    partial[chunk * 2 * C + c] = dw;
    partial[chunk * 2 * C + C + c] = db;
  }
}

// The fused kernel for C columns: the smallest kCols with C <= 32 kCols (up to 2048 columns).
using FusedKernel = void (*)(float*, __nv_bfloat16*, float*, const float*, const float*,
                             const float*, const float*, const float*, int, int, bool);
struct Fused {
  int cols;
  FusedKernel kernel;
  const char* name;
};
#define ATL_FUSED(k) \
  Fused { k, LayerNormBackwardKernel<k>, "LayerNormBackwardKernel<" #k ">" }
const Fused kFused[] = {ATL_FUSED(1),  ATL_FUSED(2),  ATL_FUSED(4),  ATL_FUSED(8),  ATL_FUSED(16),
                        ATL_FUSED(24), ATL_FUSED(32), ATL_FUSED(40), ATL_FUSED(48), ATL_FUSED(64)};
#undef ATL_FUSED
const Fused* FusedFor(int C) {
  for (const Fused& f : kFused)
    if (C <= 32 * f.cols) return &f;
  return nullptr;
}

}  // namespace

namespace {
void Forward(const char* op, float* out, float* mean, float* rstd, const float* inp, float* res,
             const float* a, const float* b, const float* weight, const float* bias, int N, int C,
             uint16_t* out_bf16) {
  if (N <= 0) return;
  __nv_bfloat16* out16 = Bf16Copy(out_bf16);
  if (out == nullptr && out16 == nullptr)
    ThrowCuda(op, __FILE__, __LINE__, "no out: a null out needs a bf16 copy");
  ATL_LAUNCH(LayerNormForwardKernel, Blocks(size_t(N), kRowsPerBlock), 32 * kRowsPerBlock, out,
             out16, mean, rstd, inp, res, a, b, weight, bias, N, C);
}
}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, uint16_t* out_bf16) {
  Forward("LayerNormForward", out, mean, rstd, inp, nullptr, nullptr, nullptr, weight, bias, N, C,
          out_bf16);
}

void ResidualLayerNormForward(float* res, const float* a, const float* b, float* out, float* mean,
                              float* rstd, const float* weight, const float* bias, int N, int C,
                              uint16_t* out_bf16) {
  Forward("ResidualLayerNormForward", out, mean, rstd, nullptr, res, a, b, weight, bias, N, C,
          out_bf16);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, uint16_t* dinp_bf16, GradInto into) {
  if (N <= 0) return;
  const bool params = dweight != nullptr || dbias != nullptr;
  if (dinp == nullptr && !params) return;
  const bool add = into == GradInto::kAdd;
  if (const Fused* f = FusedFor(C)) {  // one pass: dout and inp read once
    const int64_t blocks = (int64_t(N) + kFusedBlockRows - 1) / kFusedBlockRows;
    float* partial = params ? static_cast<float*>(Scratch(
                                  kScratchReduce, size_t(blocks) * 2 * size_t(C) * sizeof(float)))
                            : nullptr;
    Launch(f->name, f->kernel, unsigned(blocks), 32 * kFusedWarps, dinp, Bf16Copy(dinp_bf16),
           partial, dout, inp, weight, mean, rstd, N, C, add);
    if (params) AddChunkSums(dweight, partial, blocks, C, 2 * int64_t(C), dbias);
    return;
  }
  if (dinp != nullptr) {
    ATL_LAUNCH(LayerNormInputGradKernel, Blocks(size_t(N), kRowsPerBlock), 32 * kRowsPerBlock, dinp,
               Bf16Copy(dinp_bf16), dout, inp, weight, mean, rstd, N, C, add);
  }
  if (!params) return;
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  auto* partial =
      static_cast<float*>(Scratch(kScratchReduce, size_t(chunks) * 2 * size_t(C) * sizeof(float)));
  const dim3 grid(Blocks(size_t(C), 128), unsigned(chunks < 65535 ? chunks : 65535));
  ATL_LAUNCH(LayerNormParamChunkKernel, grid, 128, partial, dout, inp, mean, rstd, N, C);
  AddChunkSums(dweight, partial, chunks, C, 2 * int64_t(C), dbias);
}

}  // namespace atl::kernels::cuda
