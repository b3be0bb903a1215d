// Shared by the .cu files of kernels/cuda/ (not part of the backend's interface): error checks,
// the process's stream and cuBLASLt handle, a scratch workspace, and deterministic reductions.
//
// Determinism: a reduction here always maps element i to the same thread and combines threads
// in the same tree (warp shuffles by fixed offsets, then warps in index order through shared
// memory), so its result depends only on the input and the launch shape, which depend only on
// the problem's shape. No atomics anywhere in kernels/cuda/.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {

[[noreturn]] void ThrowCuda(const char* call, const char* file, int line, const char* message);

#define ATL_CUDA(call)                                                                          \
  do {                                                                                          \
    const cudaError_t atl_err_ = (call);                                                        \
    if (atl_err_ != cudaSuccess)                                                                \
      ::atl::kernels::cuda::ThrowCuda(#call, __FILE__, __LINE__, cudaGetErrorString(atl_err_)); \
  } while (0)

#define ATL_CUBLAS(call)                                                                         \
  do {                                                                                           \
    const cublasStatus_t atl_st_ = (call);                                                       \
    if (atl_st_ != CUBLAS_STATUS_SUCCESS)                                                        \
      ::atl::kernels::cuda::ThrowCuda(#call, __FILE__, __LINE__, cublasLt_status_name(atl_st_)); \
  } while (0)

// After a kernel launch: launch-configuration errors now, execution errors at the next sync.
#define ATL_LAUNCHED() ATL_CUDA(cudaGetLastError())

// kernel<<<grid, block, 0, Stream()>>>(args...), then ATL_LAUNCHED(). On the CUDA emulator
// (emu/device.h) the kernel runs there and then, and a pointer argument that is not device memory
// fails the launch, as it would fail the kernel on a GPU.
#define ATL_LAUNCH(kernel, grid, block, ...) \
  ::atl::kernels::cuda::Launch(#kernel, kernel, grid, block, __VA_ARGS__)

const char* cublasLt_status_name(cublasStatus_t status);

// The process's stream and cuBLASLt handle (created by UseDevice; UseDevice(DefaultOrdinal()) on
// first use when it was not called).
cudaStream_t Stream();
cublasLtHandle_t BlasLt();
// cuBLASLt's workspace: fixed size, so its algorithm choice does not depend on history.
void* BlasWorkspace();
constexpr size_t kBlasWorkspaceBytes = size_t(32) << 20;

// Scratch device memory of at least `bytes` in one of a few slots, valid until the next Scratch
// call for the same slot (kernels on the one stream run in order, so reusing a slot across calls
// is safe). Grows, never shrinks. An op takes kScratchOp for its own buffers; the helpers below
// that an op calls take kScratchReduce, so the two never overlap (and the fused attention
// backward, attention_tc_backward.cu, its dq partial sums, between two launches that call no
// helper).
// Gemm's bf16 operands take kScratchGemm.
enum ScratchSlot { kScratchOp = 0, kScratchReduce = 1, kScratchGemm = 2, kScratchSlots = 3 };
void* Scratch(ScratchSlot slot, size_t bytes);

template <class... P, class... A>
void Launch(const char* name, void (*kernel)(P...), dim3 grid, dim3 block, const A&... args) {
  static_assert(sizeof...(P) == sizeof...(A), "a kernel launched with the wrong argument count");
  // Implicit conversions only, as <<<>>> allows (no cast may drop const or change a pointer type).
  static_assert((std::is_convertible_v<const A&, P> && ...), "a kernel argument of the wrong type");
#if defined(ATOLL_CUDA_EMULATED)
  const void* pointers[] = {::atl::cuda_emu::PointerOf(args)..., nullptr};
  ::atl::cuda_emu::Launch(
      name, grid, block, [&] { kernel(args...); }, pointers, int(sizeof...(A)));
#else
  (void)name;
  // clang-format off
  kernel<<<grid, block, 0, Stream()>>>(args...);
  // clang-format on
#endif
  ATL_LAUNCHED();
}

// sizeof(V) bytes (16, 8 or 4) at a p aligned to them, one load (the emulator: memcpy, as its
// host compiler's aliasing rules want, after cuda_emu::VectorAccess: a misaligned p fails the
// launch, as it faults on a GPU), and one store.
template <class V>
__device__ inline V LoadVector(const void* p) {
#if defined(ATOLL_CUDA_EMULATED)
  ::atl::cuda_emu::VectorAccess(p, sizeof(V));
  V v;
  memcpy(&v, p, sizeof(v));
  return v;
#else
  return *reinterpret_cast<const V*>(p);
#endif
}
template <class V>
__device__ inline void StoreVector(void* p, V v) {
#if defined(ATOLL_CUDA_EMULATED)
  ::atl::cuda_emu::VectorAccess(p, sizeof(V));
  memcpy(p, &v, sizeof(v));
#else
  *reinterpret_cast<V*>(p) = v;
#endif
}
__device__ inline uint4 Load16(const void* p) { return LoadVector<uint4>(p); }
__device__ inline void Store16(void* p, uint4 v) { StoreVector(p, v); }
__device__ inline uint32_t Load4(const void* p) { return LoadVector<uint32_t>(p); }
__device__ inline void Store8(void* p, uint2 v) { StoreVector(p, v); }

// The largest power of two (at most 256, at least 2) that divides the address: cuBLASLt must not
// pick a kernel that needs more alignment than the operands have, nor a kernel a vector load.
inline uint32_t Alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  uint32_t align = 256;
  while (align > 2 && a % align != 0) align >>= 1;  // bf16 operands may be 2-byte aligned
  return align;
}
inline unsigned Blocks(size_t n, unsigned threads) { return unsigned((n + threads - 1) / threads); }

// ---- Four elements a thread: the streaming kernels ---------------------------------------------
// A kernel that streams arrays with little arithmetic is bound by the bytes each SM keeps in
// flight: a thread that loads one float keeps 4, 64 warps an SM 8 KB, about half of what an
// H100's memory needs to run at its bandwidth (3.35 TB/s times a latency near 700 ns, over 132
// SMs). So those kernels take four consecutive elements a thread, by 16-byte loads and stores
// where every array is aligned for them (QuadAligned), one element at a time otherwise: the same
// arithmetic on each element either way, so the same bits.
struct Quad {
  size_t i;     // the thread's first element
  int count;    // its elements: 4, fewer at the end, 0 past it
  bool vector;  // one 16-byte access an array (the arrays aligned, 4 elements)
};
__device__ inline Quad QuadOf(size_t n, bool aligned) {
  const size_t i = 4 * (size_t(blockIdx.x) * blockDim.x + threadIdx.x);
  const int count = i >= n ? 0 : n - i >= 4 ? 4 : int(n - i);
  return {i, count, aligned && count == 4};
}
// One thread a quad, `threads` a block.
inline unsigned QuadBlocks(size_t n, unsigned threads) { return Blocks((n + 3) / 4, threads); }
// Whether the quads' accesses are aligned: every float array (null aside) at 16 bytes, every
// bf16 one at 8.
inline bool QuadAligned(std::initializer_list<const void*> floats,
                        std::initializer_list<const void*> halves = {}) {
  for (const void* p : floats)
    if (reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  for (const void* p : halves)
    if (reinterpret_cast<uintptr_t>(p) % 8 != 0) return false;
  return true;
}
// x[k] = p[q.i + k] for k < q.count, 0 beyond.
__device__ inline void LoadQuad(float (&x)[4], const float* p, const Quad& q) {
  if (q.vector) {
    const uint4 v = Load16(p + q.i);
    x[0] = __uint_as_float(v.x), x[1] = __uint_as_float(v.y);
    x[2] = __uint_as_float(v.z), x[3] = __uint_as_float(v.w);
    return;
  }
  for (int k = 0; k < 4; ++k) x[k] = k < q.count ? p[q.i + k] : 0.0f;
}
// p[q.i + k] = x[k] for k < q.count (as floats, or rounded to bf16: to nearest, ties to even).
__device__ inline void StoreQuad(float* p, const float (&x)[4], const Quad& q) {
  if (q.vector) {
    Store16(p + q.i, uint4{__float_as_uint(x[0]), __float_as_uint(x[1]), __float_as_uint(x[2]),
                           __float_as_uint(x[3])});
    return;
  }
  for (int k = 0; k < 4; ++k)
    if (k < q.count) p[q.i + k] = x[k];
}
__device__ inline void StoreQuad(__nv_bfloat16* p, const float (&x)[4], const Quad& q) {
  if (q.vector) {
    uint32_t h[4];
    for (int k = 0; k < 4; ++k) h[k] = __bfloat16_as_ushort(__float2bfloat16_rn(x[k]));
    Store8(p + q.i, uint2{h[0] | h[1] << 16, h[2] | h[3] << 16});
    return;
  }
  for (int k = 0; k < 4; ++k)
    if (k < q.count) p[q.i + k] = __float2bfloat16_rn(x[k]);
}

// Sum over a warp by a fixed butterfly: every lane gets the same bits.
template <class A>
__device__ inline A WarpSum(A v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
template <class A>
__device__ inline A WarpMax(A v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// A reduction over the block (blockDim.x a multiple of 32, at most 1024): warps reduce, then
// warp 0 combines the warps' results in a fixed butterfly. Every thread gets the result.
// `shared` holds 32 A's; the call ends with a barrier, so it may be reused right after.
template <class A, class Warp>
__device__ inline A BlockReduce(A v, A* shared, A identity, Warp warp_reduce) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  v = warp_reduce(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  A total = warp_reduce(lane < warps ? shared[lane] : identity);
  __syncthreads();
  return total;
}
template <class A>
__device__ inline A BlockSum(A v, A* shared) {
  return BlockReduce(v, shared, A(0), [](A x) { return WarpSum(x); });
}
template <class A>
__device__ inline A BlockMax(A v, A* shared) {
  return BlockReduce(v, shared, A(-INFINITY), [](A x) { return WarpMax(x); });
}

// ---- bf16 products (matmul.cu; SetBf16Matmul) --------------------------------------------------

// bf16 copies of an op's float operands, made once and shared by its products: the op reserves
// room for every operand at once (one Scratch(kScratchGemm) buffer, each operand at a 256-byte
// offset), then rounds each (to nearest, ties to even) into its place.
class Bf16Operands {
 public:
  // Room for operands of these element counts (0: an operand not used).
  explicit Bf16Operands(std::initializer_list<int64_t> counts);
  // Operand i: n <= counts[i] elements of src rounded to bf16 (a launch; none for n = 0).
  const __nv_bfloat16* Round(int i, const float* src, int64_t n);

 private:
  __nv_bfloat16* base_ = nullptr;
  int64_t offsets_[4] = {}, counts_[4] = {};
  int size_ = 0;
};

// Adds n to Bf16RoundedElements (ops.h), for a kernel that rounds float operands to bf16 itself.
void CountBf16Rounded(uint64_t n);

// An op's bf16 copy argument (ops.h's uint16_t bits) as the kernels' type: the copy is written
// only under SetBf16Matmul (null otherwise).
__nv_bfloat16* Bf16Copy(uint16_t* p);
inline const __nv_bfloat16* Bf16Copy(const uint16_t* p) {
  return Bf16Copy(const_cast<uint16_t*>(p));
}

// Gemm (ops.h) on operands already bf16, accumulating and writing float: the product Gemm runs
// after rounding its operands under SetBf16Matmul (the same cuBLASLt plan for the same shape and
// alignments, hence the same bits).
void GemmBf16(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const __nv_bfloat16* a,
              int64_t lda, const __nv_bfloat16* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Gemm (batch 1) whose operands may have bf16 copies (ops.h's Bf16Copies; null: none): under
// SetBf16Matmul the product reads a copy where there is one and rounds the other operand into
// scratch; float products otherwise (the copies unread). bias (n floats, or null): added to every
// row of c by cuBLASLt's epilogue where it can (16-byte aligned, an algorithm found); returns
// whether it was, so the caller adds it otherwise. c_bf16 (under SetBf16Matmul only, no bias): c
// is written there in bf16 instead (the float result rounded to nearest once; c unused).
bool GemmWithCopies(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a,
                    const uint16_t* a_bf16, int64_t lda, const float* b, const uint16_t* b_bf16,
                    int64_t ldb, float beta, float* c, int64_t ldc, const float* bias = nullptr,
                    __nv_bfloat16* c_bf16 = nullptr);

// Column sums of a row-major [rows, cols] matrix, ADDED into out[cols] (device), in a fixed
// order: rows are cut into chunks of kColumnChunkRows, each chunk summed per column in row order,
// then the chunk sums added in a fixed order (AddChunkSums). Uses Scratch(kScratchReduce).
void ColumnSumsAdd(float* out, const float* m, int64_t rows, int cols);
// ColumnSumsAdd's two passes, for a kernel that makes the matrix and sums it at once:
// ColumnChunkScratch gives room for the chunk sums partial[chunk][col] (chunks: rows cut into
// kColumnChunkRows), which the kernel, launched on ColumnChunkGrid's grid of 128 threads a block,
// writes by SumColumnChunks; AddColumnChunks adds them into out (AddChunkSums).
constexpr int kColumnChunkRows = 64;
__host__ __device__ inline int64_t ColumnChunks(int64_t rows) {
  return (rows + kColumnChunkRows - 1) / kColumnChunkRows;
}
float* ColumnChunkScratch(int64_t rows, int cols);
dim3 ColumnChunkGrid(int64_t rows, int cols);
// The same for SumColumnQuads (a thread four columns).
dim3 ColumnQuadGrid(int64_t rows, int cols);
void AddColumnChunks(float* out, const float* partial, int64_t rows, int cols);
// out[c] += the sum over k < chunks of partial[k * stride + c], c < cols, in a fixed order that
// depends on chunks alone (AddColumnChunks's second pass; LayerNorm's weight gradients). out1 (or
// null): likewise out1[c] += the sums of partial[k * stride + cols + c], in the same launch; out
// may be null then.
void AddChunkSums(float* out, const float* partial, int64_t chunks, int cols, int64_t stride,
                  float* out1 = nullptr);

// partial[chunk][c] = the sum of value(r * cols + c) over the chunk's rows r, in row order
// (__fadd_rn: no multiply in value fused into the sum). One thread per (chunk, column): a warp
// takes 32 adjacent columns of a row (coalesced); grid.y is capped at 65535, so blocks stride
// over the chunks (the chunks stay the same).
template <class Value>
__device__ inline void SumColumnChunks(float* partial, int64_t rows, int cols, Value value) {
  const int c = blockIdx.x * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kColumnChunkRows, r1 = min(rows, r0 + kColumnChunkRows);
    float sum = 0.0f;
    for (int64_t r = r0; r < r1; ++r) sum = __fadd_rn(sum, value(r * cols + c));
    partial[chunk * cols + c] = sum;
  }
}

// SumColumnChunks with four neighbouring columns a thread (a Quad's, 16-byte accesses: cols a
// multiple of 4, the arrays QuadAligned), on ColumnQuadGrid's grid of 128 threads a block:
// value(i, v) gives v[k] = the value of element i + k of a row, k < 4. The same sums in the same
// order, so the same bits.
template <class Value4>
__device__ inline void SumColumnQuads(float* partial, int64_t rows, int cols, Value4 value) {
  const int c = 4 * int(blockIdx.x * blockDim.x + threadIdx.x);
  if (c >= cols) return;
  const int64_t chunks = ColumnChunks(rows);
  const Quad at{0, 4, true};
  for (int64_t chunk = blockIdx.y; chunk < chunks; chunk += gridDim.y) {
    const int64_t r0 = chunk * kColumnChunkRows, r1 = min(rows, r0 + kColumnChunkRows);
    float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    for (int64_t r = r0; r < r1; ++r) {
      float v[4];
      value(r * cols + c, v);
      for (int k = 0; k < 4; ++k) sum[k] = __fadd_rn(sum[k], v[k]);
    }
    StoreQuad(partial + chunk * cols + c, sum, at);
  }
}

}  // namespace atl::kernels::cuda
