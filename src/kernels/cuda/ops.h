// The CUDA backend of kernels/ops.h: the same ops, the same layouts and the same meaning (read the
// comments there), over DEVICE pointers, plus the optimizer's two kernels (AdamW, the gradient's
// sum of squares) so parameters and their state never leave the GPU.
//
// Differences from the CPU backend, all deliberate:
// - Pointers are device pointers, except: ClassifierForward returns the mean loss to the host;
//   EncoderBackward also takes the token ids on the host (it groups repeated tokens there, so the
//   gradient rows are summed in (b,t) order without atomics; the groups go up by a queued copy,
//   so the host does not wait for the GPU).
// - Attention keeps no probabilities: it saves each row's log-sum-exp instead (see below).
// - A backward may write its input gradient instead of adding to it (GradInto::kWrite,
//   kernels/grad_into.h: the last argument of LayerNormBackward, MatmulBackward,
//   AttentionBackward, GeluBackward and ClassifierBackward; kAdd, ops.h's meaning, by default),
//   so that a caller need not zero a buffer first. Parameter gradients are always added to.
// - Scratch is the backend's own (common.cuh), so the scratch arguments of the CPU signatures are
//   gone.
// - Results agree with the CPU backend within floating-point rounding, not bitwise (different
//   summation orders and cuBLASLt's own blocking); they are bitwise-repeatable run to run on one
//   GPU model with one CUDA/cuBLASLt version: every reduction has a fixed order (common.cuh), and
//   each GEMM shape keeps the cuBLASLt algorithm chosen for it first (matmul.cu).
//
// Precision: float throughout (CUBLAS_COMPUTE_32F, no TF32), unless SetBf16Matmul: then every
// matrix product (Gemm, so the linear layers' and the classifier's, and attention's for head sizes
// up to 64, on the tensor cores: attention_tc.cu) rounds its operands to bf16 and accumulates
// and writes float (the classifier's logits may be written in bf16, ClassifierForward); every
// other op stays float.
//
// Thread-safety: one caller at a time (runtime.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/attention_blocks.h"
#include "kernels/grad_into.h"

namespace atl::kernels::cuda {

// ---- The ops of kernels/ops.h ------------------------------------------------------------------

void EncoderForward(float* out, const int32_t* inp, const float* wte, const float* wpe, int B,
                    int T, int C, int vocab_begin = 0, int vocab_end = -1);
// inp is on the device, host_inp the same ids on the host.
void EncoderBackward(float* dwte, float* dwpe, const float* dout, const int32_t* inp,
                     const int32_t* host_inp, int B, int T, int C, int vocab_begin = 0,
                     int vocab_end = -1);

// bf16 copies (under SetBf16Matmul): an op that makes the input of a matrix product (LayerNorm,
// GELU, attention forward) may also write its out rounded to bf16 (to nearest, ties to even;
// uint16_t: the bf16's bits) into out_bf16, and the products take that copy (Bf16Copies::inp)
// instead of rounding the float themselves: the same operand, so the same result, with one
// rounding pass per activation instead of one per product (forward and backward). Likewise in the
// backward, the gradients LayerNorm, GELU and attention make (dinp_bf16, dqkv_bf16: after the
// op's addition) for the products below them (Bf16Copies::dout); and the weights, rounded by the
// caller once while they do not change (RoundToBf16; Bf16Copies::weight). Null: none. The
// copies are ignored when products are float. LayerNorm's and GELU's out may be null when they
// write a copy (bf16 products): the copy alone is written, for outputs only products read.
void LayerNormForward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                      const float* bias, int N, int C, uint16_t* out_bf16 = nullptr);
// res = a + b (as ResidualForward; res may be a or b), then LayerNormForward of res: one kernel
// reads the addends, writes the sum and normalizes it (the LayerNorm's first read of the sum is
// saved). The same bits as the two ops.
void ResidualLayerNormForward(float* res, const float* a, const float* b, float* out, float* mean,
                              float* rstd, const float* weight, const float* bias, int N, int C,
                              uint16_t* out_bf16 = nullptr);
void LayerNormBackward(float* dinp, float* dweight, float* dbias, const float* dout,
                       const float* inp, const float* weight, const float* mean, const float* rstd,
                       int N, int C, uint16_t* dinp_bf16 = nullptr, GradInto into = GradInto::kAdd);

// bf16 copies of a product's float operands (above; null: none, the op rounds the float).
struct Bf16Copies {
  const uint16_t* inp = nullptr;     // MatmulForward/Backward's inp, the classifier's x
  const uint16_t* dout = nullptr;    // MatmulBackward's dout
  const uint16_t* weight = nullptr;  // the weight, the classifier's wte
};

void MatmulForward(float* out, const float* inp, const float* weight, const float* bias, int N,
                   int IC, int OC, const Bf16Copies& copies = {});
// dout may be null under bf16 products when its copy is given and dbias is null.
void MatmulBackward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                    const float* weight, int N, int IC, int OC, const Bf16Copies& copies = {},
                    GradInto into = GradInto::kAdd);

// Flash-style (attention.cu): no [T, T] probabilities. Instead of att, forward writes each query
// row's log-sum-exp of its scaled scores, lse [B, NH, T], and backward takes it with the forward's
// out; so the GPU's attention memory is O(T) per head. Head sizes up to 128.
// keep (or null): where the forward leaves the bf16 Q, K, V it multiplies, when the tensor cores
// do the attention (AttentionKeptElements of them, 16-byte aligned; ignored when that is 0); the
// backward of that same forward takes them as `kept` and then reads qkv not at all, instead of
// rounding it again (3 B T C floats read and rounded fewer). The caller keeps them per layer, as
// it keeps lse, and must not give a backward the copies of another forward.
void AttentionForward(float* out, float* lse, const float* qkv, int B, int T, int C, int NH,
                      uint16_t* out_bf16 = nullptr, uint16_t* keep = nullptr);
void AttentionBackward(float* dqkv, const float* dout, const float* out, const float* qkv,
                       const float* lse, int B, int T, int C, int NH, uint16_t* dqkv_bf16 = nullptr,
                       GradInto into = GradInto::kAdd, const uint16_t* kept = nullptr);
// The elements AttentionForward keeps for this shape now: the tensor cores' operands (bf16
// products on, head size C / NH up to 64, an sm_80 GPU on) in their layout, 3 B NH Tp D with Tp
// = T rounded up to 64 and D = 32 or 64; 0 when the attention would not run on the tensor cores.
// Never more for a smaller B or T.
size_t AttentionKeptElements(int B, int T, int C, int NH);
// The rows of a block of the tensor-core attention's kernels (kernels/attention_blocks.h: the
// forward's and dQ's query rows, the dK/dV kernel's key rows; 64/64 by default). The same bits in
// every setting (CudaOps.Bf16AttentionBlockRowsChangeNoBit); which is faster is measured on a GPU
// (bench/kernels/attention.cc). Returns the previous setting; throws std::invalid_argument for
// rows other than 64 or 128.
AttentionBlockRows SetAttentionBlockRows(AttentionBlockRows rows);
// How the tensor-core attention's backward computes dQ (kernels/attention_blocks.h; kSplit by
// default): by a kernel of its own, or fused into the dK/dV kernel as partial sums a second pass
// adds (other bits for dQ, the same for dK and dV: CudaOps.Bf16AttentionFusedBackward). Returns
// the previous setting.
AttentionBackwardKind SetAttentionBackwardKind(AttentionBackwardKind backward);
// The fused backward's partial sums of dQ in scratch: AttentionPartialBytes for B batch rows
// (they grow as B NH T²: 214 MB for gpt2-124m's heads at B 8, T 1024). The backward takes as
// many batch rows at a time as fit in the limit (1 GiB by default), the same bits in any number
// of parts; the split backward when not one row's fit. (The scratch slot they use grows to 1.25
// times a request and is kept: up to 1.25 times the limit.) Returns the previous limit.
size_t SetAttentionPartialLimit(size_t bytes);
size_t AttentionPartialBytes(int B, int T, int C, int NH);

void GeluForward(float* out, const float* inp, size_t n, uint16_t* out_bf16 = nullptr);
// dbias (or null): GELU's backward also adds the column sums of dinp (after the op), viewed as
// [n / cols, cols], into dbias[cols], in the order MatmulBackward sums its dout for its bias
// gradient: so when dinp is a linear layer's dout (fc's, below GELU), that layer's bias gradient,
// bit for bit, without reading dinp again (give that layer's MatmulBackward a null dbias). dinp
// may be null under bf16 products with a copy and kWrite: the copy alone is written.
void GeluBackward(float* dinp, const float* inp, const float* dout, size_t n,
                  uint16_t* dinp_bf16 = nullptr, GradInto into = GradInto::kAdd,
                  float* dbias = nullptr, int cols = 0);

void ResidualForward(float* out, const float* a, const float* b, size_t n);
void ResidualBackward(float* da, float* db, const float* dout, size_t n);

// targets on the device (or null). Returns the mean loss (0 without targets) on the host.
// logits_bf16 (or null; read under bf16 products only): the logits are written there in bf16
// alone, as PyTorch's autocast keeps them, and `logits` is unused: half the bytes for the
// product to write and for the loss and the backward to read ([N, V] is the largest activation).
// Its rows are kernels::LogitsRowStride(V) apart (kernels/ops.h; N times that elements). The
// backward then takes the same pointer, and bf16 products still on.
float ClassifierForward(float* logits, float* lse, float* losses, const float* x, const float* wte,
                        const int32_t* targets, int N, int C, int V, const Bf16Copies& copies = {},
                        uint16_t* logits_bf16 = nullptr);
void ClassifierBackward(float* dx, float* dwte, const float* logits, const float* lse,
                        const float* x, const float* wte, const int32_t* targets, float dloss,
                        int N, int C, int V, const Bf16Copies& copies = {},
                        GradInto into = GradInto::kAdd, const uint16_t* logits_bf16 = nullptr);

// ---- General matrix product (cuBLASLt), for the ops above and for tests ------------------------

// bf16 operands for every product from now on (on) or float (off, the default); the process's
// setting, as its stream is.
void SetBf16Matmul(bool on);
bool Bf16Matmul();
// dst[i] = src[i] rounded to bf16 (bits), i < n (counted below).
void RoundToBf16(uint16_t* dst, const float* src, size_t n);
// Float elements rounded to bf16 for products so far, by the process (bf16 mode's own memory
// traffic: each is read as float and written as bf16 once more than a bf16 activation would be),
// the tensor-core attention's operands (Q, K, V, dO) included.
uint64_t Bf16RoundedElements();

// Row-major: c[m,n] = alpha * op(a) · op(b) + beta * c, op(a) [m,k] (a is [k,m] when trans_a),
// op(b) [k,n] (b is [n,k] when trans_b); lda, ldb, ldc are the row strides. `batch` products at
// element strides stride_a, stride_b, stride_c.
void Gemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int64_t lda,
          const float* b, int64_t ldb, float beta, float* c, int64_t ldc, int batch = 1,
          int64_t stride_a = 0, int64_t stride_b = 0, int64_t stride_c = 0);

// For tests: d[16x8] += a[16x16] b[16x8] (row-major, device memory) by one tensor-core product
// on one warp (mma.cuh's fragments), the operands rounded to bf16.
void Bf16TileProduct(float* d, const float* a, const float* b);
// For tests: d[16x8] = bf16(a[16x16] b[16x16]) b2[16x8], the first product's result fed to the
// second as its A operand without leaving the registers (mma.cuh's AFromAccumulators).
void Bf16TileChain(float* d, const float* a, const float* b, const float* b2);
// For tests: one warp's ldmatrix (mma.cuh's LdMatrix4, transposed or not) of four 8x8 matrices of
// 16-bit elements m[4][8][8] (device memory, staged in shared memory with padded rows): out[4 l +
// i] = lane l's register i.
void LdMatrixTiles(uint32_t* out, const uint16_t* m, bool trans);

// ---- Optimizer ----------------------------------------------------------------------------------

// A run of state elements [begin, end) updating parameters [begin + shift, end + shift) (shift
// modulo 2^64, as train/optimizer.h's segments), with or without weight decay.
struct AdamSegment {
  uint64_t begin, end, shift;
  uint32_t decay;
};
// The scalars of one AdamW step, computed on the host exactly as the CPU AdamW does.
struct AdamScalars {
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float step_size, inv_bc2_sqrt, eps, decay_factor, grad_scale;
};
// One AdamW update: the arithmetic of train/optimizer.h, element by element in float (equal to
// the CPU's within rounding: either compiler may fuse a multiply and an add). segments: device
// array sorted by begin, disjoint; state elements outside every segment are not updated.
// deltas (device, n elements, or null): what each updated parameter moved, after - before
// (exact in double, then rounded to float); elements outside every segment are not written.
void AdamWStep(float* params, const float* grads, float* m, float* v, const AdamSegment* segments,
               int num_segments, uint64_t n, const AdamScalars& s, float* deltas = nullptr);

// host_out[j] = sum of x[i]^2 over segment j's elements [begin, end), in double, in a fixed
// order (segments: a device array; shift and decay are ignored).
void SegmentSquaredSums(double* host_out, const float* x, const AdamSegment* segments,
                        int num_segments);

// sum g_i^2 in double, in a fixed order (fixed chunks, then the chunk sums in order); returned to
// the host.
double GradSquaredSum(const float* grads, size_t n);

// ---- The corruption checks' reads (checks.cu, for train/sdc/) ----------------------------------

// A range [begin, end) of 32-bit words.
struct HashRange {
  uint64_t begin, end;
};
// host_out[r] = the fingerprint of range r of the words at `data` (device): any change of one
// word changes its range's fingerprint (every step below is one-to-one in each of its inputs
// when the other is fixed), and two changes leave it alone with odds near 2^-64. The function
// (not XXH3, atoll's CPU fingerprint): a range is cut into chunks of kHashChunkWords; in a chunk,
// thread t of 256 folds words t, t + 256, ... with HashStep from HashMix(t + 1), and the threads'
// values are combined by HashCombine in a fixed tree (pairs t, t + s for s = 128, 64, ..., 1);
// the range's is HashMix(length + kHashSeed) combined with its chunks' in order. Deterministic.
void RangeHashes(uint64_t* host_out, const void* data, const HashRange* host_ranges,
                 int num_ranges);
// *slot = max(*slot, the largest |x_i|) (device; infinity when any x_i is not finite; *slot
// unchanged when n is 0), queued (the host does not wait): the step guard keeps a step's maxima
// on the GPU and reads them once.
void MaxAbsInto(float* slot, const float* x, size_t n);

#if defined(__CUDACC__)
#define ATL_HOST_DEVICE __host__ __device__
#else
#define ATL_HOST_DEVICE
#endif
constexpr uint64_t kHashChunkWords = 8192;
constexpr uint64_t kHashSeed = 0x9E3779B97F4A7C15ull;
// MurmurHash3's 64-bit finalizer: a bijection.
ATL_HOST_DEVICE inline uint64_t HashMix(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  return x ^ (x >> 33);
}
ATL_HOST_DEVICE inline uint64_t HashStep(uint64_t h, uint32_t word) {
  return HashMix(h + (uint64_t(word) + 1) * kHashSeed);
}
ATL_HOST_DEVICE inline uint64_t HashCombine(uint64_t a, uint64_t b) {
  return HashMix(a * 0xD6E8FEB86659FD93ull + b);
}
#undef ATL_HOST_DEVICE

}  // namespace atl::kernels::cuda
