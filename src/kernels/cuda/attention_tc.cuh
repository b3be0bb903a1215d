// Attention on the tensor cores (attention_tc.cu), which attention.cu's AttentionForward and
// AttentionBackward hand over to when TensorCoreAttention says so. Internal to kernels/cuda/.
#pragma once

#include <cuda_bf16.h>

namespace atl::kernels::cuda {

// bf16 products are on (SetBf16Matmul) and the head size C / NH is at most 64.
bool TensorCoreAttention(int C, int NH);
// As AttentionForward / AttentionBackward (ops.h), with bf16 operands; dsum: B * NH * T floats
// of scratch. out16, dqkv16 (or null): what they write to out and dqkv, rounded to bf16 as well.
// add: the backward adds to dqkv (else writes over it).
void TcAttentionForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int B,
                        int T, int C, int NH);
void TcAttentionBackward(float* dqkv, __nv_bfloat16* dqkv16, float* dsum, const float* dout,
                         const float* out, const float* qkv, const float* lse, int B, int T, int C,
                         int NH, bool add);

}  // namespace atl::kernels::cuda
