// The CUDA emulator's runtime (emu/include/cuda_runtime.h): one device whose memory is host
// memory that the host cannot touch. Device memory is readable only while a kernel, a copy or a
// cuBLASLt call runs (DeviceAccess), so host code that dereferences a device
// pointer faults here as it would on a GPU, and the fault is reported as that. Copies check
// their direction: a host pointer passed as device memory (or the other way) is an error, as it
// is on a GPU.
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda_runtime.h"
#include "kernels/cuda/emu/memory.h"

struct CUstream_emu {};

namespace atl::cuda_emu {
namespace {

size_t PageBytes() {
  static const size_t page = size_t(sysconf(_SC_PAGESIZE));
  return page;
}

struct Allocation {
  size_t bytes;   // asked for
  size_t mapped;  // rounded up to pages
  int open = 0;   // DeviceAccess objects that opened it
};

// Device memory is carved from one reserved range (so a fault inside it is known to be a touch of
// device memory, even of a freed block). Freed blocks are kept for reuse (best fit; their pages
// are given back to the system).
struct Arena {
  char* base = nullptr;
  size_t reserved = 0, top = 0;
  std::multimap<size_t, uintptr_t> free;  // mapped size -> start
};
Arena& TheArena() {
  static Arena a;
  if (a.base == nullptr) {
    for (size_t gib = 256; gib >= 1 && a.base == nullptr; gib /= 2) {
      void* p =
          mmap(nullptr, gib << 30, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
      if (p != MAP_FAILED) {
        a.base = static_cast<char*>(p);
        a.reserved = gib << 30;
      }
    }
  }
  return a;
}

// Live allocations by start address.
std::map<uintptr_t, Allocation>& Allocations() {
  static auto* m = new std::map<uintptr_t, Allocation>;
  return *m;
}
thread_local cudaError_t g_last = cudaSuccess;
thread_local std::string g_launch_message;

cudaError_t Fail(cudaError_t e) {
  g_last = e;
  return e;
}

// A fault at an address inside device memory: host code touched it. Say so, then let the default
// action (a core dump) happen.
struct sigaction g_previous;
void OnFault(int sig, siginfo_t* info, void* ctx) {
  if (OverlapsDevice(info->si_addr, 1)) {
    static const char msg[] =
        "CUDA emulator: host code read or wrote device memory (a GPU faults here too): the "
        "pointer must go through CopyToHost/CopyToDevice or a kernel\n";
    (void)!write(2, msg, sizeof(msg) - 1);
  }
  sigaction(sig, &g_previous, nullptr);
  (void)ctx;
}

void InstallFaultHandler() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = &OnFault;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGSEGV, &sa, &g_previous);
  });
}

// The live allocation holding p, or null.
Allocation* Find(const void* p, uintptr_t* start) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto& all = Allocations();
  auto it = all.upper_bound(a);
  if (it == all.begin()) return nullptr;
  --it;
  if (a - it->first >= it->second.bytes) return nullptr;
  *start = it->first;
  return &it->second;
}

}  // namespace

DeviceAccess::DeviceAccess(const void* const* pointers, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uintptr_t start = 0;
    Allocation* a = pointers[i] == nullptr ? nullptr : Find(pointers[i], &start);
    if (a == nullptr) continue;
    if (a->open++ == 0) mprotect(reinterpret_cast<void*>(start), a->mapped, PROT_READ | PROT_WRITE);
    opened_.push_back(start);
  }
}

DeviceAccess::~DeviceAccess() {
  for (const uintptr_t start : opened_) {
    auto it = Allocations().find(start);
    if (it == Allocations().end()) continue;  // freed meanwhile
    if (--it->second.open == 0)
      mprotect(reinterpret_cast<void*>(start), it->second.mapped, PROT_NONE);
  }
}

bool IsDevice(const void* p, size_t bytes) {
  uintptr_t start = 0;
  const Allocation* a = Find(p, &start);
  return a != nullptr && bytes <= a->bytes - (reinterpret_cast<uintptr_t>(p) - start);
}

bool OverlapsDevice(const void* p, size_t bytes) {
  const Arena& arena = TheArena();
  const auto a = reinterpret_cast<uintptr_t>(p), base = reinterpret_cast<uintptr_t>(arena.base);
  return a < base + arena.reserved && a + bytes > base;
}

cudaError_t GetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t GetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof(prop->name), "atoll CUDA emulator");
  prop->totalGlobalMem = size_t(sysconf(_SC_PHYS_PAGES)) * PageBytes();
  prop->multiProcessorCount = 1;
  prop->major = 9;
  prop->minor = 0;
  return cudaSuccess;
}

cudaError_t SetDevice(int device) {
  if (device != 0) return Fail(cudaErrorInvalidDevice);
  InstallFaultHandler();
  return cudaSuccess;
}

cudaError_t StreamCreateWithFlags(cudaStream_t* stream, unsigned flags) {
  (void)flags;
  static CUstream_emu the_stream;
  *stream = &the_stream;
  return cudaSuccess;
}

cudaError_t StreamSynchronize(cudaStream_t stream) {
  (void)stream;  // everything ran when it was issued
  return cudaSuccess;
}

cudaError_t Malloc(void** p, size_t bytes) {
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  Arena& arena = TheArena();
  const size_t mapped = (bytes + PageBytes() - 1) / PageBytes() * PageBytes();
  char* m = nullptr;
  auto fit = arena.free.lower_bound(mapped);
  if (fit != arena.free.end()) {
    m = reinterpret_cast<char*>(fit->second);
    const size_t size = fit->first;
    arena.free.erase(fit);
    if (size > mapped) arena.free.emplace(size - mapped, reinterpret_cast<uintptr_t>(m + mapped));
  } else {
    if (arena.base == nullptr || arena.reserved - arena.top < mapped)
      return Fail(cudaErrorMemoryAllocation);
    m = arena.base + arena.top;
    arena.top += mapped;
  }
  // cudaMalloc's memory is uninitialized: fill it with a NaN pattern, so that reading it before
  // writing it shows.
  mprotect(m, mapped, PROT_READ | PROT_WRITE);
  std::memset(m, 0xff, mapped);
  mprotect(m, mapped, PROT_NONE);
  Allocations()[reinterpret_cast<uintptr_t>(m)] = {bytes, mapped};
  *p = m;
  return cudaSuccess;
}

cudaError_t Free(void* p) {
  if (p == nullptr) return cudaSuccess;
  auto it = Allocations().find(reinterpret_cast<uintptr_t>(p));
  if (it == Allocations().end()) return Fail(cudaErrorInvalidValue);
  madvise(p, it->second.mapped, MADV_DONTNEED);
  TheArena().free.emplace(it->second.mapped, it->first);
  Allocations().erase(it);
  return cudaSuccess;
}

cudaError_t MemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind kind,
                        cudaStream_t stream) {
  (void)stream;
  if (bytes == 0) return cudaSuccess;
  const bool dst_dev = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  const bool dst_ok = dst_dev ? IsDevice(dst, bytes) : !OverlapsDevice(dst, bytes);
  const bool src_ok = src_dev ? IsDevice(src, bytes) : !OverlapsDevice(src, bytes);
  if (!dst_ok || !src_ok) return Fail(cudaErrorInvalidValue);
  DeviceAccess open{dst, src};
  std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t MemsetAsync(void* p, int value, size_t bytes, cudaStream_t stream) {
  (void)stream;
  if (bytes == 0) return cudaSuccess;
  if (!IsDevice(p, bytes)) return Fail(cudaErrorInvalidValue);
  DeviceAccess open{p};
  std::memset(p, value, bytes);
  return cudaSuccess;
}

void SetLaunchError(const std::string& message) {
  g_launch_message = message;
  g_last = cudaErrorLaunchFailure;
}
void SetLaunchError(const char* message) { SetLaunchError(std::string(message)); }

cudaError_t GetLastError() {
  const cudaError_t e = g_last;
  g_last = cudaSuccess;
  return e;
}

const char* GetErrorString(cudaError_t err) {
  switch (err) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument (CUDA emulator: a pointer outside device memory, or a range "
             "past an allocation's end)";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorLaunchFailure:
      return g_launch_message.c_str();
    default:
      return "unknown error";
  }
}

}  // namespace atl::cuda_emu
