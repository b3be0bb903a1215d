// The tensor cores' warp-wide product, as the kernels of kernels/cuda/ use it: PTX's
// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32, D[16x8] += A[16x16] B[16x8], bf16
// operands, float accumulation, one warp (all 32 lanes) together; and the loads that feed it:
// ldmatrix (shared memory into fragments) and cp.async (global into shared memory).
//
// Which lane holds which element (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
// point type"): lane = 4 g + t (g = lane / 4, the group; t = lane % 4, the thread in it);
//   A: a[0] = (row g,     cols 2t, 2t+1)    a[1] = (row g + 8, cols 2t, 2t+1)
//      a[2] = (row g,     cols 2t+8, 2t+9)  a[3] = (row g + 8, cols 2t+8, 2t+9)
//   B: b[0] = (rows 2t, 2t+1, col g)        b[1] = (rows 2t+8, 2t+9, col g)
//   D: d[0], d[1] = (row g, cols 2t, 2t+1)  d[2], d[3] = (row g + 8, cols 2t, 2t+1)
// each 32-bit register holding two bf16, the lower-numbered element in its low half. So an
// accumulator's two rows are known to its lane (a softmax can scale them), and D's layout over
// two neighbouring 8-column tiles is A's over one 16-column tile (a product's result feeds the
// next product without a shuffle: AFromAccumulators).
//
// On the CUDA emulator (emu/device.h) the warp gathers its lanes' registers and every lane
// computes its elements from the rows of A and columns of B it needs, found by this same map, in
// float, k in order; so a kernel that holds the map wrongly fails against the CPU there as it
// would on a GPU, unless the map itself is wrong, which kernels/cuda/cuda_bf16_test.cc checks on
// a GPU against plain products (TensorCoreFragmentsHoldTheirElements). mma.sync with bf16 needs
// sm_80 or later: built for an older GPU, MmaBf16, LdMatrix4 and the copies trap
// (TensorCoreAttention asks for compute capability 8 first).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>
#if defined(ATOLL_CUDA_EMULATED)
#include <stdexcept>
#endif

namespace atl::kernels::cuda {

__device__ inline uint32_t PackBf16(float lo, float hi) {
  return uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(lo))) |
         uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(hi))) << 16;
}

__device__ inline float Bf16Lo(uint32_t pair) { return __uint_as_float(pair << 16); }
__device__ inline float Bf16Hi(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

// d += A B on the warp's fragments (the map above).
__device__ inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#if defined(ATOLL_CUDA_EMULATED)
  struct Regs {
    uint32_t a[4], b[2];
  };
  // This lane's elements only: rows g and g + 8 of A, columns 2t and 2t + 1 of B (held by lanes
  // 4 (2t) + u and 4 (2t + 1) + u), its own accumulators; the sums as the whole tiles' would be.
  const int lane = ::atl::cuda_emu::Lane(), g = lane / 4, t = lane % 4;
  float A[2][16], B[2][16];
  ::atl::cuda_emu::WarpGather(Regs{{a[0], a[1], a[2], a[3]}, {b[0], b[1]}}, [&](auto at) {
    for (int u = 0; u < 4; ++u) {
      const Regs ra = at(4 * g + u), rb[2] = {at(4 * (2 * t) + u), at(4 * (2 * t + 1) + u)};
      for (int h = 0; h < 2; ++h) {  // the register's low (h = 0) and high element
        const auto el = [h](uint32_t p) { return h == 0 ? Bf16Lo(p) : Bf16Hi(p); };
        A[0][2 * u + h] = el(ra.a[0]);
        A[1][2 * u + h] = el(ra.a[1]);
        A[0][2 * u + 8 + h] = el(ra.a[2]);
        A[1][2 * u + 8 + h] = el(ra.a[3]);
        for (int j = 0; j < 2; ++j) {
          B[j][2 * u + h] = el(rb[j].b[0]);
          B[j][2 * u + 8 + h] = el(rb[j].b[1]);
        }
      }
    }
  });
  for (int i = 0; i < 4; ++i) {
    const int r = i >= 2 ? 1 : 0, j = i & 1;
    float s = d[i];
    for (int k = 0; k < 16; ++k) s += A[r][k] * B[j][k];
    d[i] = s;
  }
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}

// Four 8x8 bf16 matrices from shared memory into the warp's fragments (PTX's
// ldmatrix.sync.aligned.m8n8.x4[.trans].shared.b16): lane l gives the address of row l % 8 of
// matrix l / 8 (16 bytes, 16-byte aligned); r[i] gets matrix i's (row g, cols 2t, 2t+1), as an A
// or B fragment's register holds its elements (the map above), or with kTrans its
// (rows 2t, 2t+1, col g): the fragment of the matrix transposed.
template <bool kTrans>
__device__ inline void LdMatrix4(uint32_t (&r)[4], const void* row) {
#if defined(ATOLL_CUDA_EMULATED)
  if (reinterpret_cast<uintptr_t>(row) % 16 != 0 || ::atl::cuda_emu::IsDevice(row))
    throw std::runtime_error("ldmatrix: a row address not 16-byte aligned shared memory");
  const int lane = ::atl::cuda_emu::Lane(), g = lane / 4, t = lane % 4;
  ::atl::cuda_emu::WarpGather(row, [&](auto rows) {
    const auto at = [&](int m, int i, int j) {  // matrix m's element (i, j)
      return uint32_t(static_cast<const uint16_t*>(rows(8 * m + i))[j]);
    };
    for (int m = 0; m < 4; ++m)
      r[m] = kTrans ? at(m, 2 * t, g) | at(m, 2 * t + 1, g) << 16
                    : at(m, g, 2 * t) | at(m, g, 2 * t + 1) << 16;
  });
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  // "memory": the compiler sees that it reads shared memory, so no store to the tile is moved
  // after it, nor a load before it, whatever barrier is (or is not) between them.
  const auto addr = uint32_t(__cvta_generic_to_shared(row));
  if constexpr (kTrans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
#endif
}

// The asynchronous copy of 16 bytes from global to shared memory (PTX's cp.async.cg, sm_80 on),
// both 16-byte aligned; its group closed by CopyCommit, and waited for by CopyWait<n> (every
// group of the thread's but the newest n complete). The copies of other threads are seen after
// their wait and a barrier.
__device__ inline void Copy16(void* shared, const void* global) {
#if defined(ATOLL_CUDA_EMULATED)
  ::atl::cuda_emu::AsyncCopy(shared, global, 16, 16);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(
                   uint32_t(__cvta_generic_to_shared(shared))),
               "l"(__cvta_generic_to_global(global))
               : "memory");
#endif
}
__device__ inline void CopyCommit() {
#if defined(ATOLL_CUDA_EMULATED)
  ::atl::cuda_emu::AsyncCommit();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int kPending>
__device__ inline void CopyWait() {
#if defined(ATOLL_CUDA_EMULATED)
  ::atl::cuda_emu::AsyncWait(kPending);
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
  __trap();
#else
  // "memory": shared reads after the wait are not moved before it, barrier or not.
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
#endif
}

// 2^x by the special function unit's approximation (ex2.approx.ftz: a relative error of about
// 2^-22, subnormal results flushed to 0, 2^-inf = 0), as FlashAttention's softmax takes it; exp2
// on the emulator.
__device__ inline float Exp2(float x) {
#if defined(ATOLL_CUDA_EMULATED)
  return std::exp2(x);
#else
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#endif
}

// The A fragment of a 16x16 tile whose columns 0-7 are the accumulators `lo` and 8-15 `hi`
// (two 16x8 products' results), each element times the scale of its row (g, g + 8).
__device__ inline void AFromAccumulators(uint32_t (&a)[4], const float (&lo)[4],
                                         const float (&hi)[4], float row_g = 1.0f,
                                         float row_g8 = 1.0f) {
  a[0] = PackBf16(lo[0] * row_g, lo[1] * row_g);
  a[1] = PackBf16(lo[2] * row_g8, lo[3] * row_g8);
  a[2] = PackBf16(hi[0] * row_g, hi[1] * row_g);
  a[3] = PackBf16(hi[2] * row_g8, hi[3] * row_g8);
}

}  // namespace atl::kernels::cuda
