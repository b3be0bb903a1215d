// LayerNorm forward and backward: one warp per row (the row's sums by a fixed butterfly), and the
// weight and bias gradients as column sums in fixed row chunks (common.cuh).
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

constexpr int kRowsPerBlock = 8;  // warps per block, one row each
constexpr int kChunkRows = 64;    // rows per partial column sum

// out_bf16 (or null): out rounded to bf16 as well; out null: the bf16 alone.
__global__ void LayerNormForwardKernel(float* out, __nv_bfloat16* out_bf16, float* mean,
                                       float* rstd, const float* inp, const float* weight,
                                       const float* bias, int N, int C) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const float* x = inp + n * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += x[c];
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

// dinp (+)= the input's gradient (add: added to dinp, else written over it); dinp_bf16 (or null):
// the result rounded to bf16 as well.
__global__ void LayerNormInputGradKernel(float* dinp, __nv_bfloat16* dinp_bf16, const float* dout,
                                         const float* inp, const float* weight, const float* mean,
                                         const float* rstd, int N, int C, bool add) {
  const int lane = threadIdx.x & 31;
  const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + (threadIdx.x >> 5);
  if (n >= N) return;
  const float* x = inp + n * C;
  const float* dy = dout + n * C;
  const float m = mean[n], r = rstd[n];
  float g_sum = 0.0f, gn_sum = 0.0f;
  for (int c = lane; c < C; c += 32) {
    const float g = dy[c] * weight[c];
    g_sum += g;
    gn_sum += g * (x[c] - m) * r;
  }
  const float g_mean = WarpSum(g_sum) / float(C);
  const float gn_mean = WarpSum(gn_sum) / float(C);
  float* dx = dinp + n * C;
  __nv_bfloat16* dxb = dinp_bf16 != nullptr ? dinp_bf16 + n * C : nullptr;
  for (int c = lane; c < C; c += 32) {
    const float norm = (x[c] - m) * r;
    const float g = dy[c] * weight[c] - g_mean - norm * gn_mean;
    const float v = add ? dx[c] + r * g : r * g;
    dx[c] = v;
    if (dxb != nullptr) dxb[c] = __float2bfloat16_rn(v);
  }
}

// partial[chunk][c] = sum over the chunk's rows of dout * norm, partial[chunk][C + c] = of dout.
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

__global__ void LayerNormParamAddKernel(float* dweight, float* dbias, const float* partial,
                                        int64_t chunks, int C) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= C) return;
  float dw = 0.0f, db = 0.0f;
  for (int64_t k = 0; k < chunks; ++k) {
    dw += partial[k * 2 * C + c];
    db += partial[k * 2 * C + C + c];
  }
  if (dweight != nullptr) dweight[c] += dw;
  if (dbias != nullptr) dbias[c] += db;
}

}  // namespace

void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, uint16_t* out_bf16) {
  if (N <= 0) return;
  __nv_bfloat16* out16 = Bf16Copy(out_bf16);
  if (out == nullptr && out16 == nullptr)
    ThrowCuda("LayerNormForward", __FILE__, __LINE__, "no out: a null out needs a bf16 copy");
  ATL_LAUNCH(LayerNormForwardKernel, Blocks(size_t(N), kRowsPerBlock), 32 * kRowsPerBlock, out,
             out16, mean, rstd, inp, weight, bias, N, C);
}

void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, uint16_t* dinp_bf16, GradInto into) {
  if (N <= 0) return;
  if (dinp != nullptr) {
    ATL_LAUNCH(LayerNormInputGradKernel, Blocks(size_t(N), kRowsPerBlock), 32 * kRowsPerBlock, dinp,
               Bf16Copy(dinp_bf16), dout, inp, weight, mean, rstd, N, C, into == GradInto::kAdd);
  }
  if (dweight == nullptr && dbias == nullptr) return;
  const int64_t chunks = (N + kChunkRows - 1) / kChunkRows;
  auto* partial =
      static_cast<float*>(Scratch(kScratchReduce, size_t(chunks) * 2 * size_t(C) * sizeof(float)));
  const dim3 grid(Blocks(size_t(C), 128), unsigned(chunks < 65535 ? chunks : 65535));
  ATL_LAUNCH(LayerNormParamChunkKernel, grid, 128, partial, dout, inp, mean, rstd, N, C);
  ATL_LAUNCH(LayerNormParamAddKernel, Blocks(size_t(C), 128), 128, dweight, dbias, partial, chunks,
             C);
}

}  // namespace atl::kernels::cuda
