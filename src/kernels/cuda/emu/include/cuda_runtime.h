// The CUDA emulator's stand-in for the toolkit's cuda_runtime.h: the part of the runtime API that
// kernels/cuda/ calls, over host memory (emu/runtime.cc). Only the emulated build sees this file.
#pragma once

#include <cstddef>
#include <cstdlib>

#include "kernels/cuda/emu/device.h"

#define CUDART_VERSION 13000

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorNotReady = 600,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
enum cudaMemcpyKind {
  cudaMemcpyHostToHost = 0,
  cudaMemcpyHostToDevice = 1,
  cudaMemcpyDeviceToHost = 2,
  cudaMemcpyDeviceToDevice = 3,
};
constexpr unsigned cudaStreamNonBlocking = 1;

struct CUstream_emu;
using cudaStream_t = CUstream_emu*;

struct cudaDeviceProp {
  char name[256];
  size_t totalGlobalMem;
  int multiProcessorCount;
  int major, minor;
};

namespace atl::cuda_emu {
cudaError_t GetDeviceCount(int* count);
cudaError_t GetDeviceProperties(cudaDeviceProp* prop, int device);
cudaError_t SetDevice(int device);
cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned flags);
cudaError_t StreamSynchronize(cudaStream_t stream);
cudaError_t Malloc(void** p, size_t bytes);
cudaError_t Free(void* p);
cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream);
cudaError_t MemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream);
cudaError_t GetLastError();
const char* GetErrorString(cudaError_t err);
}  // namespace atl::cuda_emu

inline cudaError_t cudaGetDeviceCount(int* count) { return atl::cuda_emu::GetDeviceCount(count); }
inline cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  return atl::cuda_emu::GetDeviceProperties(prop, device);
}
inline cudaError_t cudaSetDevice(int device) { return atl::cuda_emu::SetDevice(device); }
inline cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  return atl::cuda_emu::StreamCreateWithFlags(stream, flags);
}
inline cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  return atl::cuda_emu::StreamSynchronize(stream);
}
// Work runs when it is issued on the emulator, so a stream is always done.
inline cudaError_t cudaStreamQuery(cudaStream_t) { return cudaSuccess; }
inline cudaError_t cudaDeviceSynchronize() { return atl::cuda_emu::StreamSynchronize(nullptr); }
template <class T>
inline cudaError_t cudaMalloc(T** p, size_t bytes) {
  return atl::cuda_emu::Malloc(reinterpret_cast<void**>(p), bytes);
}
inline cudaError_t cudaFree(void* p) { return atl::cuda_emu::Free(p); }
inline cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                                   cudaStream_t stream = nullptr) {
  return atl::cuda_emu::MemcpyAsync(dst, src, bytes, kind, stream);
}
inline cudaError_t cudaMemcpy(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind) {
  return atl::cuda_emu::MemcpyAsync(dst, src, bytes, kind, nullptr);
}
inline cudaError_t cudaMemsetAsync(void* p, int value, size_t bytes,
                                   cudaStream_t stream = nullptr) {
  return atl::cuda_emu::MemsetAsync(p, value, bytes, stream);
}
// Pinned host memory is plain host memory here, and an event is done once recorded (work runs
// when it is issued).
struct CUevent_emu {};
using cudaEvent_t = CUevent_emu*;
constexpr unsigned cudaEventDisableTiming = 2;
inline cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes);
  return *p != nullptr || bytes == 0 ? cudaSuccess : cudaErrorMemoryAllocation;
}
inline cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
inline cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned) {
  *event = new CUevent_emu;
  return cudaSuccess;
}
inline cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t = nullptr) { return cudaSuccess; }
inline cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
inline cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
inline cudaError_t cudaGetLastError() { return atl::cuda_emu::GetLastError(); }
inline const char* cudaGetErrorString(cudaError_t err) {
  return atl::cuda_emu::GetErrorString(err);
}
