// The CUDA emulator, device side: what a kernel of kernels/cuda/ sees when it is compiled by the
// host compiler instead of nvcc (emu/include/ stands in for the toolkit's headers). It lets every
// kernel and every op of the backend run, and be tested, on a machine without a GPU.
//
// Execution model, as the hardware's as far as a correct kernel can tell:
//   - a launch runs its blocks one after another, and each block's threads as fibers on the
//     calling thread; a thread runs until it finishes or waits at a barrier (a thread that waits
//     has a stack of its own; one that starts after a thread that returned runs on its stack);
//   - __syncthreads releases the block when every thread still running has arrived (threads that
//     returned count as arrived, as on Volta and later);
//   - a warp shuffle is a barrier of the lanes of its mask still running, which then read each
//     other's values; reading a lane that has returned or is outside the mask (undefined on the
//     hardware), or lanes waiting at different barriers (a hang), stops the launch with an error
//     naming the kernel. One barrier per warp at a time: lanes of one warp shuffling at once with
//     disjoint masks are refused;
//   - __shared__ variables are static, hence shared by the block's threads (blocks run in turn);
//   - a block's warps run one at a time, each as far as it goes (until all its lanes wait at
//     __syncthreads or have returned), so that warps drift apart between the block's barriers as
//     they may on a GPU; threads and warps start in index order in even blocks and in reverse
//     order in odd ones, so that a kernel that relies on an order the hardware does not promise
//     fails one way or the other (asynchronous copies, below, likewise).
// What it cannot show: speed, races between threads without a barrier in general (fibers switch
// only at barriers; the orders above expose the common ones: a tile overwritten while another
// warp reads it, a copy read before its wait), and differences of the hardware's arithmetic (fused
// multiply-adds, expf's ulps). Results are compared with the CPU backend within tolerances, as on a
// GPU; the bits a GPU gives are not these.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>

#define ATOLL_CUDA_EMULATED 1

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __shared__ static thread_local

struct uint3 {
  unsigned x, y, z;
};
struct alignas(8) uint2 {  // an 8-byte vector store's type
  unsigned x, y;
};
struct alignas(16) uint4 {  // a 16-byte vector load's type
  unsigned x, y, z, w;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

namespace atl::cuda_emu {

// The indices of the running thread (valid inside a kernel only).
struct Indices {
  uint3 thread, block;
  dim3 block_dim, grid_dim;
};
extern constinit thread_local const Indices* current;

// Runs body once per thread of the grid, as the file's comment says. pointers[i] is the kernel's
// argument i when that is a pointer (null otherwise): each must be null or device memory (a host
// pointer is an illegal address on a GPU), and only their allocations are open to the kernel.
// Returns false, with the error for cudaGetLastError (a deadlock, a bad shape or argument), when
// the launch failed.
bool Launch(const char* kernel, dim3 grid, dim3 block, const std::function<void()>& body,
            const void* const* pointers, int count);
template <class A>
const void* PointerOf(const A& a) {
  if constexpr (std::is_pointer_v<A>)
    return a;
  else
    return nullptr;
}

// Barriers (inside a kernel).
void SyncThreads();
// Lanes of `mask` exchange `bytes` of value: *out = the value of lane src (or own value when src
// is outside the warp's lanes, as the hardware's shuffles do at the edges).
void WarpExchange(unsigned mask, const void* value, void* out, size_t bytes, int src);
int Lane();
// A warp-wide gather (mma.sync's and ldmatrix's stand-in): every lane of the warp, all 32 running,
// gives `bytes` (at most kWarpSlotBytes) of value; WarpGatherBegin returns when all have, with
// the gather's slots: lane l's value at slots + l * kWarpSlotBytes, unchanged until the lane's
// next warp operation (a lane reads only the lanes it needs, not a copy of all 32).
// WarpGather<T>(mine, use) calls use(at) on them, at(l) being lane l's T.
constexpr size_t kWarpSlotBytes = 64;
const unsigned char* WarpGatherBegin(const void* value, size_t bytes);
template <class T, class Use>
void WarpGather(const T& mine, Use&& use) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= kWarpSlotBytes);
  const unsigned char* slots = WarpGatherBegin(&mine, sizeof(T));
  use([slots](int lane) {
    T v;
    std::memcpy(&v, slots + size_t(lane) * kWarpSlotBytes, sizeof(T));
    return v;
  });
}

// cp.async's stand-ins (inside a kernel). AsyncCopy starts a copy of `bytes` into dst (shared
// memory): src_bytes from src, zeros after them. AsyncCommit closes the thread's copies started
// since the last commit into a group; AsyncWait(n) waits for every group but the newest n. On a
// GPU a copy lands at any time between the two; here at one end or the other: in even blocks at
// once (so a kernel that starts a copy over a tile other threads still read gets a wrong result),
// in odd blocks only at the wait (so one that reads a destination before waiting reads the old
// bytes). A returned thread's copies are made.
void AsyncCopy(void* dst, const void* src, size_t bytes, size_t src_bytes);
void AsyncCommit();
void AsyncWait(int pending);

// A vector load or store of `bytes` (8 or 16; 4 for a 32-bit load through Load4) at p, inside a
// kernel: fails the launch where p is not a multiple of bytes (a GPU's misaligned address
// fault), and is counted.
void VectorAccess(const void* p, size_t bytes);
// The vector accesses so far, by the process (for tests: which path a kernel took).
uint64_t VectorAccesses();

// The threads so far, by the process, that ran on a fiber of their own (for tests): a block's
// first thread, and each that starts right after the thread that ran before it waited at a
// barrier; a thread that starts right after one that returned runs on its stack, no switch.
uint64_t FibersStarted();

// Whether [p, p + bytes) lies in one live allocation of device memory.
bool IsDevice(const void* p, size_t bytes = 1);
// Records a launch's failure for cudaGetLastError, with the message cudaGetErrorString returns.
void SetLaunchError(const char* message);
void SetLaunchError(const std::string& message);

}  // namespace atl::cuda_emu

#define threadIdx (::atl::cuda_emu::current->thread)
#define blockIdx (::atl::cuda_emu::current->block)
#define blockDim (::atl::cuda_emu::current->block_dim)
#define gridDim (::atl::cuda_emu::current->grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { ::atl::cuda_emu::SyncThreads(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  int unused = 0;
  ::atl::cuda_emu::WarpExchange(mask, &unused, &unused, sizeof(unused), ::atl::cuda_emu::Lane());
}

template <class T>
T __shfl_sync(unsigned mask, T v, int src_lane, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  const int lane = ::atl::cuda_emu::Lane();
  const int base = lane / width * width;
  T out;
  ::atl::cuda_emu::WarpExchange(mask, &v, &out, sizeof(T),
                                base + (src_lane % width + width) % width);
  return out;
}
template <class T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  const int lane = ::atl::cuda_emu::Lane();
  const int src = lane ^ lane_mask;
  T out;
  // A source beyond the lane's group of `width` gives the lane its own value.
  const bool same_group = src / width == lane / width;
  ::atl::cuda_emu::WarpExchange(mask, &v, &out, sizeof(T), same_group ? src : lane);
  return out;
}
template <class T>
T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  const int lane = ::atl::cuda_emu::Lane();
  const int src = lane + int(delta);
  T out;
  ::atl::cuda_emu::WarpExchange(mask, &v, &out, sizeof(T),
                                src / width == lane / width ? src : lane);
  return out;
}
template <class T>
T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8);
  const int lane = ::atl::cuda_emu::Lane();
  const int src = lane - int(delta);
  T out;
  ::atl::cuda_emu::WarpExchange(mask, &v, &out, sizeof(T),
                                src >= 0 && src / width == lane / width ? src : lane);
  return out;
}

// CUDA's mixed-type min and max, and the float intrinsics the kernels use.
template <class A, class B>
inline auto min(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return C(b) < C(a) ? C(b) : C(a);
}
template <class A, class B>
inline auto max(A a, B b) -> std::common_type_t<A, B> {
  using C = std::common_type_t<A, B>;
  return C(a) < C(b) ? C(b) : C(a);
}
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __uint_as_float(unsigned u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline unsigned __float_as_uint(float f) {
  unsigned u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float __expf(float x) { return std::exp(x); }
// A float add rounded on its own, never fused with a multiply before it (as on the GPU): the
// empty asm hides the operands from the host compiler's contraction.
inline float __fadd_rn(float a, float b) {
  asm("" : "+x"(a), "+x"(b));
  return a + b;
}
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float __frcp_rn(float x) { return 1.0f / x; }
template <class T>
inline T __ldg(const T* p) {
  return *p;
}
