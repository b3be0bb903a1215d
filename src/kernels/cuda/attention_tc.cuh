// Attention on the tensor cores (attention_tc.cu), which attention.cu's AttentionForward and
// AttentionBackward hand over to when TensorCoreAttention says so, and the grid both files' kernels
// share. Internal to kernels/cuda/.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#include <string>

#include "kernels/cuda/common.cuh"

namespace atl::kernels::cuda {

// Where a block of a causal attention kernel works. The grid is one-dimensional, B * NH heads of
// `row_blocks` blocks each, a head's blocks consecutive, so that they run at about the same time
// and read its tiles of the other side (K and V; Q and dO) while L2 still holds them. Within a
// head the block with the most work starts first: descending for the forward and dQ (a query
// block sees more keys the later it is), ascending for dK/dV (a key block is seen by more
// queries the earlier it is). Which block computes what does not change: the results are the
// same bits in any order.
struct BlockPlace {
  int bh;     // the head: b * NH + h
  int block;  // its row block
};
__device__ inline BlockPlace PlaceBlock(int row_blocks, bool descending) {
  const int bh = int(blockIdx.x / unsigned(row_blocks));
  const int i = int(blockIdx.x % unsigned(row_blocks));
  return {bh, descending ? row_blocks - 1 - i : i};
}
// A one-dimensional grid of `blocks` (of `what`, for the error); throws when over CUDA's 2^31 - 1.
inline dim3 AttentionGrid(int64_t blocks, const char* what) {
  if (blocks > 0x7fffffff)
    ThrowCuda("attention", __FILE__, __LINE__,
              (std::string("more than 2^31 - 1 blocks of ") + what).c_str());
  return dim3(unsigned(blocks));
}
// The grid of B * NH heads of ceil(T / rows) blocks.
inline dim3 HeadBlocks(int B, int NH, int T, int rows, int* row_blocks) {
  *row_blocks = (T + rows - 1) / rows;
  return AttentionGrid(int64_t(B) * NH * *row_blocks, "rows");
}

// bf16 products are on (SetBf16Matmul) and the head size C / NH is at most 64.
bool TensorCoreAttention(int C, int NH);
// As AttentionForward / AttentionBackward (ops.h), with bf16 operands. out16, dqkv16 (or null):
// what they write to out and dqkv, rounded to bf16 as well. add: the backward adds to dqkv (else
// writes over it). Both take Scratch(kScratchOp) for their operands.
// keep, kept (or null): the bf16 Q, K, V kept from the forward for its backward (ops.h's
// AttentionForward).
void TcAttentionForward(float* out, __nv_bfloat16* out16, float* lse, const float* qkv, int B,
                        int T, int C, int NH, uint16_t* keep);
void TcAttentionBackward(float* dqkv, __nv_bfloat16* dqkv16, const float* dout, const float* out,
                         const float* qkv, const float* lse, int B, int T, int C, int NH, bool add,
                         const uint16_t* kept);

// ---- The tensor-core kernels' operands (attention_tc_prep.cu) ---------------------------------

// The rows of a block and of a tile of the kernels (attention_tc.cu).
constexpr int kAttentionRows = 64;
// log2 e: the kernels' softmax is in base 2, their lse in base e.
constexpr float kLog2e = 1.4426950408889634f;

// The operands rounded to bf16 in the kernels' layout: for each head (bh = b * NH + h) Tp rows
// of D elements, D = 32 or 64 (the head size hs padded with zeros), Tp = T rounded up to 64 (rows
// past T zero); the copies [B * NH][Tp][D] each, in Scratch(kScratchOp). The backward's also: dO
// likewise; per row of each head (B * NH * Tp floats) dsum = D_i = dO_i · O_i (dO rounded to
// bf16, O the forward's float out) and lse2 = lse log2 e, 0 and +infinity past T (null in the
// forward's).
struct Operands {
  int D = 0, Tp = 0;
  uint16_t *q = nullptr, *k = nullptr, *v = nullptr, *dout = nullptr;
  float *dsum = nullptr, *lse2 = nullptr;
};
// The layout's D and Tp for T and the head size C / NH (no pointers).
Operands OperandShape(int T, int C, int NH);
// The elements of the Q, K, V copies together (3 B NH Tp D), for T and the head size C / NH.
size_t OperandElements(int B, int T, int C, int NH);
// keep (or null): the Q, K, V copies go there (OperandElements, 16-byte aligned), not to scratch,
// for the backward of this forward to take as `kept` instead of rounding qkv again (qkv is then
// not read).
Operands ForwardOperands(const float* qkv, int B, int T, int C, int NH, uint16_t* keep = nullptr);
Operands BackwardOperands(const float* dout, const float* out, const float* qkv, const float* lse,
                          int B, int T, int C, int NH, const uint16_t* kept = nullptr);

}  // namespace atl::kernels::cuda
