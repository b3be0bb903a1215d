// The process's CUDA context: device choice, stream, cuBLASLt handle, scratch; memory and copies.
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {
namespace {

struct Context {
  int ordinal = -1;
  std::thread::id owner;  // the one thread that drives the GPU
  cudaStream_t stream = nullptr;
  cublasLtHandle_t blas = nullptr;
  void* blas_workspace = nullptr;
  void* scratch[kScratchSlots] = {};
  size_t scratch_bytes[kScratchSlots] = {};
  // CopyToDeviceQueued's pinned staging buffer, and the event that marks its last copy done.
  void* staging = nullptr;
  size_t staging_bytes = 0;
  cudaEvent_t staged = nullptr;
};

Context& Ctx() {
  static Context ctx;
  return ctx;
}

Context& Ready() {
  Context& c = Ctx();
  if (c.ordinal < 0) UseDevice(DefaultOrdinal());
  if (std::this_thread::get_id() != c.owner)
    throw CudaError(
        "CUDA: a second thread used the GPU; one thread per process drives it (in-process ranks "
        "or sites cannot share a GPU: run them as processes, e.g. under mpirun)");
  return c;
}

std::atomic<uint64_t> copied_to_device{0}, copied_to_host{0}, zeroed{0}, waits{0};

// The host waits for every kernel and copy issued so far (counted: Copied().waits).
void Wait(cudaStream_t stream) {
  ++waits;
  ATL_CUDA(cudaStreamSynchronize(stream));
}

int EnvInt(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') return -1;
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  return (*end == '\0' && x >= 0 && x < (1 << 20)) ? int(x) : -1;
}

}  // namespace

void ThrowCuda(const char* call, const char* file, int line, const char* message) {
  throw CudaError(fmt::format("CUDA: {} failed at {}:{}: {}", call, file, line, message));
}

const char* cublasLt_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    default:
      return "cuBLAS error";
  }
}

DeviceInfo Probe() {
  DeviceInfo info;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (err == cudaErrorInsufficientDriver) {
      // The runtime says this both without a driver and with one older than itself.
      void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
      if (driver == nullptr) driver = dlopen("libcuda.so.1", RTLD_LAZY);
      info.reason = driver == nullptr
                        ? "no CUDA driver (libcuda.so.1 not found)"
                        : fmt::format(
                              "the CUDA driver is older than the CUDA {}.{} runtime atoll "
                              "was built with",
                              CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    } else if (err == cudaErrorNoDevice) {
      info.reason = "no CUDA device";
    } else {
      info.reason = fmt::format("CUDA: {}", cudaGetErrorString(err));
    }
    cudaGetLastError();  // clear it
    return info;
  }
  info.count = count;
  if (count == 0) {
    info.reason = "no CUDA device";
    return info;
  }
  info.ordinal = Ctx().ordinal >= 0 ? Ctx().ordinal : DefaultOrdinal();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, info.ordinal) == cudaSuccess) {
    info.name = prop.name;
    info.sm_count = prop.multiProcessorCount;
    info.cc_major = prop.major;
    info.cc_minor = prop.minor;
    info.memory_bytes = prop.totalGlobalMem;
  }
  return info;
}

int RuntimeVersion() { return CUDART_VERSION; }

bool Emulated() {
#if defined(ATOLL_CUDA_EMULATED)
  return true;
#else
  return false;
#endif
}

bool Available(std::string* why) {
  const DeviceInfo info = Probe();
  if (info.count > 0) return true;
  if (why != nullptr) *why = info.reason;
  return false;
}

int DefaultOrdinal() {
  int local = -1;
  for (const char* name : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "LOCAL_RANK"}) {
    local = EnvInt(name);
    if (local >= 0) break;
  }
  if (local < 0) return 0;
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return 0;
  }
  return local % count;
}

void UseDevice(int ordinal) {
  Context& c = Ctx();
  if (c.ordinal == ordinal) return;
  if (c.ordinal >= 0)
    throw CudaError(
        fmt::format("CUDA: this process already uses device {}, not {}", c.ordinal, ordinal));
  ATL_CUDA(cudaSetDevice(ordinal));
  ATL_CUDA(cudaStreamCreateWithFlags(&c.stream, cudaStreamNonBlocking));
  ATL_CUBLAS(cublasLtCreate(&c.blas));
  ATL_CUDA(cudaMalloc(&c.blas_workspace, kBlasWorkspaceBytes));
  c.owner = std::this_thread::get_id();
  c.ordinal = ordinal;
}

cudaStream_t Stream() { return Ready().stream; }
void* StreamHandle() { return Stream(); }
cublasLtHandle_t BlasLt() { return Ready().blas; }
void* BlasWorkspace() { return Ready().blas_workspace; }

void* Scratch(ScratchSlot slot, size_t bytes) {
  Context& c = Ready();
  if (bytes > c.scratch_bytes[slot]) {
    // The kernels still using the old buffer finish first.
    Wait(c.stream);
    if (c.scratch[slot] != nullptr) ATL_CUDA(cudaFree(c.scratch[slot]));
    c.scratch[slot] = nullptr;
    c.scratch_bytes[slot] = 0;
    const size_t grown = bytes + bytes / 4;
    ATL_CUDA(cudaMalloc(&c.scratch[slot], grown));
    c.scratch_bytes[slot] = grown;
  }
  return c.scratch[slot];
}

void* Malloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  Ready();
  void* p = nullptr;
  ATL_CUDA(cudaMalloc(&p, bytes));
  return p;
}

void Free(void* p) {
  if (p != nullptr) cudaFree(p);  // never throws: called from destructors
}

CopyCounts Copied() { return {copied_to_device.load(), copied_to_host.load(), waits.load()}; }
uint64_t Zeroed() { return zeroed.load(); }

void CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  copied_to_device += bytes;
  ATL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, Stream()));
  Wait(Stream());
}

void CopyToDeviceQueued(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  Context& c = Ready();
  copied_to_device += bytes;
  if (c.staged == nullptr) ATL_CUDA(cudaEventCreateWithFlags(&c.staged, cudaEventDisableTiming));
  // The last queued copy may still be reading the staging buffer (it is long done when a step's
  // other waits came between; a wait when not).
  if (cudaEventQuery(c.staged) == cudaErrorNotReady) ++waits;
  ATL_CUDA(cudaEventSynchronize(c.staged));
  if (bytes > c.staging_bytes) {
    if (c.staging != nullptr) ATL_CUDA(cudaFreeHost(c.staging));
    c.staging = nullptr;
    c.staging_bytes = 0;
    const size_t grown = bytes + bytes / 4;
    ATL_CUDA(cudaMallocHost(&c.staging, grown));
    c.staging_bytes = grown;
  }
  std::memcpy(c.staging, src, bytes);
  ATL_CUDA(cudaMemcpyAsync(dst, c.staging, bytes, cudaMemcpyHostToDevice, c.stream));
  ATL_CUDA(cudaEventRecord(c.staged, c.stream));
}

void CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  copied_to_host += bytes;
  ATL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, Stream()));
  Wait(Stream());
}

void CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return;
  ATL_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, Stream()));
}

void Zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  zeroed += bytes;
  ATL_CUDA(cudaMemsetAsync(p, 0, bytes, Stream()));
}

void Synchronize() { Wait(Stream()); }

void FillScratch(unsigned char byte) {
  Context& c = Ready();
  for (int slot = 0; slot < kScratchSlots; ++slot)
    if (c.scratch[slot] != nullptr)
      ATL_CUDA(cudaMemsetAsync(c.scratch[slot], byte, c.scratch_bytes[slot], c.stream));
  Wait(c.stream);
}

// ---- ColumnSumsAdd ---------------------------------------------------------------------------

namespace {

// partial[chunk][c] = sum of m[r][c] over the chunk's rows, in row order (SumColumnChunks).
__global__ void ColumnChunkSums(float* partial, const float* m, int64_t rows, int cols) {
  SumColumnChunks(partial, rows, cols, [m](int64_t i) { return m[i]; });
}
// The same sums, four columns a thread by 16-byte loads (SumColumnQuads: cols a multiple of 4, m
// and partial 16-byte aligned): the same bits.
__global__ void ColumnChunkQuadSums(float* partial, const float* m, int64_t rows, int cols) {
  SumColumnQuads(partial, rows, cols, [m](int64_t i, float(&v)[4]) {
    LoadQuad(v, m, Quad{size_t(i), 4, true});
  });
}

// out[c] += the sum over chunks k of partial[k * stride + c]; blockIdx.y = 1 does the same into
// out1 from partial + cols (two column ranges of each chunk's row, one launch). A block takes 32
// columns (a warp reads them coalesced) and 16 slices: slice s sums its contiguous range of chunks
// in order, then the slices' sums are added in slice order. The order depends on chunks alone;
// sixteen chains instead of one keep a column's loads in flight (an H100 has 132 SMs, a bias 768
// columns).
constexpr int kSumSlices = 16;
__global__ void __launch_bounds__(32 * kSumSlices)
    AddChunkSumsKernel(float* out, float* out1, const float* partial, int64_t chunks, int cols,
                       int64_t stride) {
  __shared__ float sums[kSumSlices][32];
  if (blockIdx.y == 1) {  // the whole block
    out = out1;
    partial += cols;
  }
  const int col = threadIdx.x & 31, slice = threadIdx.x >> 5;
  const int c = blockIdx.x * 32 + col;
  const int64_t per = (chunks + kSumSlices - 1) / kSumSlices;
  const int64_t k0 = min(chunks, slice * per), k1 = min(chunks, k0 + per);
  float s = 0.0f;
  if (c < cols)
    for (int64_t k = k0; k < k1; ++k) s += partial[k * stride + c];
  sums[slice][col] = s;
  __syncthreads();
  if (slice != 0 || c >= cols) return;
  float total = sums[0][col];
  for (int i = 1; i < kSumSlices; ++i) total += sums[i][col];
  out[c] += total;
}
}  // namespace

float* ColumnChunkScratch(int64_t rows, int cols) {
  return static_cast<float*>(
      Scratch(kScratchReduce, size_t(ColumnChunks(rows)) * size_t(cols) * sizeof(float)));
}

dim3 ColumnChunkGrid(int64_t rows, int cols) {
  return dim3(Blocks(size_t(cols), 128), unsigned(std::min<int64_t>(ColumnChunks(rows), 65535)));
}

dim3 ColumnQuadGrid(int64_t rows, int cols) {
  return dim3(Blocks(size_t(cols + 3) / 4, 128),
              unsigned(std::min<int64_t>(ColumnChunks(rows), 65535)));
}

void AddChunkSums(float* out, const float* partial, int64_t chunks, int cols, int64_t stride,
                  float* out1) {
  if (chunks <= 0 || cols <= 0 || (out == nullptr && out1 == nullptr)) return;
  if (out == nullptr) {  // out1's alone
    out = out1;
    partial += cols;
    out1 = nullptr;
  }
  ATL_LAUNCH(AddChunkSumsKernel, dim3(Blocks(size_t(cols), 32), out1 != nullptr ? 2 : 1),
             32 * kSumSlices, out, out1, partial, chunks, cols, stride);
}

void AddColumnChunks(float* out, const float* partial, int64_t rows, int cols) {
  AddChunkSums(out, partial, ColumnChunks(rows), cols, cols);
}

void ColumnSumsAdd(float* out, const float* m, int64_t rows, int cols) {
  if (rows <= 0 || cols <= 0) return;
  float* partial = ColumnChunkScratch(rows, cols);
  if (cols % 4 == 0 && QuadAligned({m, partial}))
    ATL_LAUNCH(ColumnChunkQuadSums, ColumnQuadGrid(rows, cols), 128, partial, m, rows, cols);
  else
    ATL_LAUNCH(ColumnChunkSums, ColumnChunkGrid(rows, cols), 128, partial, m, rows, cols);
  AddColumnChunks(out, partial, rows, cols);
}

}  // namespace atl::kernels::cuda
