// The CUDA emulator's device memory, inside the emulator: what may touch it, and when.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <vector>

namespace atl::cuda_emu {

// While one lives, the allocations holding the given pointers (null ones are skipped) are
// readable and writable by this process: a kernel, a copy or a cuBLASLt call runs on them. All
// other device memory faults when touched. Nests.
class DeviceAccess {
 public:
  DeviceAccess(const void* const* pointers, size_t n);
  DeviceAccess(std::initializer_list<const void*> pointers)
      : DeviceAccess(pointers.begin(), pointers.size()) {}
  ~DeviceAccess();
  DeviceAccess(const DeviceAccess&) = delete;
  DeviceAccess& operator=(const DeviceAccess&) = delete;

 private:
  std::vector<uintptr_t> opened_;  // allocation starts
};

// Whether [p, p + bytes) touches any allocation of device memory.
bool OverlapsDevice(const void* p, size_t bytes);

}  // namespace atl::cuda_emu
