// The CUDA runtime as the rest of atoll sees it: whether a GPU is here, which one a rank uses,
// device memory, copies. Plain C++ (no CUDA headers), so host code includes it freely.
//
// Every function throws CudaError (a std::runtime_error naming the call, the file and line, and
// CUDA's message) when a CUDA call fails, except Probe, which reports instead of throwing.
//
// Streams: every kernel of kernels/cuda/ runs on one stream per process (Stream() in
// common.cuh), in the order called, so results never depend on timing. CopyToDevice and
// CopyToHost are synchronous (when they return, the data is where it was sent); CopyOnDevice,
// Zero and CopyToDeviceQueued are queued on the stream, in order with the kernels.
//
// Thread-safety: one thread per process drives the GPU: the first that uses it. The stream,
// scratch and cuBLASLt plans are the process's, so a second thread (in-process ranks, say) gets
// a CudaError saying so instead of corrupting the first one's work.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

namespace atl::kernels::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct DeviceInfo {
  int count = 0;       // visible devices; 0 when none (or no driver)
  std::string reason;  // why count is 0: "no CUDA driver", CUDA's message, ...
  // Of the selected device (ordinal), when count > 0:
  int ordinal = -1;
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  size_t memory_bytes = 0;
};

// What CUDA sees, without throwing: count 0 and a reason on a machine without a GPU or driver.
DeviceInfo Probe();

// CUDART_VERSION of the runtime atoll was built with (e.g. 13000).
int RuntimeVersion();

// Whether this build runs the kernels on atoll's CUDA emulator (the *_emu tests and programs): the
// same results as a GPU's, but no time it measures says anything of a GPU's.
bool Emulated();

// Whether a GPU is usable here; when not, *why (if given) says why, in words for a user.
bool Available(std::string* why = nullptr);

// Selects the device this process uses (the CUDA ordinal) and creates the stream and library
// handles on it. Call once before any kernel; later calls with the same ordinal do nothing, with
// another throw (one device per process).
void UseDevice(int ordinal);
// The ordinal a rank uses when the config leaves it open: local rank modulo the device count
// (OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK, as torchrun and mpirun set them;
// 0 without any).
int DefaultOrdinal();

// Device memory (synchronous; Malloc(0) returns nullptr).
void* Malloc(size_t bytes);
void Free(void* p);
void CopyToDevice(void* dst, const void* src, size_t bytes);
void CopyToHost(void* dst, const void* src, size_t bytes);
// A host -> device copy queued on the stream (the host does not wait for the GPU): src is staged
// in pinned host memory at once, so the caller may reuse it when this returns. For the small
// uploads inside a step (EncoderBackward's token groups), where a wait would idle the GPU.
void CopyToDeviceQueued(void* dst, const void* src, size_t bytes);
void CopyOnDevice(void* dst, const void* src, size_t bytes);
void Zero(void* p, size_t bytes);
// Every byte of the backend's scratch memory (every slot, as large as it has grown) set to
// `byte`: for tests, so that a value an earlier call left there cannot pass for a result (0xff:
// NaNs).
void FillScratch(unsigned char byte);
// Bytes CopyToDevice(Queued) and CopyToHost have moved so far in this process, and the times the
// host waited for the GPU (synchronous copies, Synchronize, scratch growth, a queued copy whose
// staging buffer the last one still held): what a step costs in transfers and waits (tests and
// profiles compare two readings).
struct CopyCounts {
  uint64_t to_device = 0, to_host = 0;
  uint64_t waits = 0;
};
CopyCounts Copied();
// Bytes Zero has set so far in this process (a step's zeroing passes: profiles compare two
// readings).
uint64_t Zeroed();
// The process's stream (a cudaStream_t), for libraries that queue work in order with the
// kernels (NCCL: comm/nccl/nccl_comm.h).
void* StreamHandle();
// Waits for every kernel issued so far; throws the first asynchronous error they raised.
void Synchronize();

// Owning device array of n elements of T (uninitialized unless zeroed). Move-only.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) : p_(static_cast<T*>(Malloc(n * sizeof(T)))), n_(n) {}
  ~DeviceArray() { Free(p_); }
  DeviceArray(DeviceArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), n_(std::exchange(o.n_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  void Upload(const T* host, size_t n) { CopyToDevice(p_, host, n * sizeof(T)); }
  void Download(T* host, size_t n) const { CopyToHost(host, p_, n * sizeof(T)); }
  void SetZero() { Zero(p_, n_ * sizeof(T)); }

 private:
  T* p_ = nullptr;
  size_t n_ = 0;
};

// A host vector's copy on the device, and a device array's on the host (synchronous).
template <class T>
DeviceArray<T> ToDevice(const std::vector<T>& host) {
  DeviceArray<T> d(host.size());
  d.Upload(host.data(), host.size());
  return d;
}
template <class T>
std::vector<T> ToHost(const DeviceArray<T>& d) {
  std::vector<T> h(d.size());
  d.Download(h.data(), h.size());
  return h;
}

}  // namespace atl::kernels::cuda
