// Bf16TileProduct, Bf16TileChain and LdMatrixTiles (ops.h): tensor-core products and fragment
// loads through mma.cuh, so that a test can hold its maps against plain products and the PTX
// ISA's map on the GPU itself.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// The lane's A fragment of a16[16x16] and B fragment of columns [col, col + 8) of b16[16 x ldb].
struct Fragments {
  uint32_t a[4], b[2];
  __device__ Fragments(const float* a16, const float* b16, int ldb, int col) {
    const int lane = int(threadIdx.x), g = lane / 4, c = 2 * (lane % 4);
    a[0] = PackBf16(a16[g * 16 + c], a16[g * 16 + c + 1]);
    a[1] = PackBf16(a16[(g + 8) * 16 + c], a16[(g + 8) * 16 + c + 1]);
    a[2] = PackBf16(a16[g * 16 + c + 8], a16[g * 16 + c + 9]);
    a[3] = PackBf16(a16[(g + 8) * 16 + c + 8], a16[(g + 8) * 16 + c + 9]);
    b[0] = PackBf16(b16[c * ldb + col + g], b16[(c + 1) * ldb + col + g]);
    b[1] = PackBf16(b16[(c + 8) * ldb + col + g], b16[(c + 9) * ldb + col + g]);
  }
};

// The lane's four elements of d[16x8] (row-major), the accumulator's map.
__device__ inline float& Element(float* d, int i) {
  const int lane = int(threadIdx.x), g = lane / 4, c = 2 * (lane % 4);
  return d[(g + (i >= 2 ? 8 : 0)) * 8 + c + (i & 1)];
}

// One warp: d[16x8] += a[16x16] b[16x8], all row-major.
__global__ void TileProduct(float* d, const float* a, const float* b) {
  const Fragments f(a, b, 8, 0);
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = Element(d, i);
  MmaBf16(acc, f.a, f.b);
  for (int i = 0; i < 4; ++i) Element(d, i) = acc[i];
}

// One warp: d[16x8] = bf16(a[16x16] b[16x16]) b2[16x8], the first product's two accumulators
// (columns 0-7, 8-15) made the second's A operand by AFromAccumulators.
__global__ void TileChain(float* d, const float* a, const float* b, const float* b2) {
  const Fragments lo(a, b, 16, 0), hi(a, b, 16, 8), second(a, b2, 8, 0);
  float p_lo[4] = {}, p_hi[4] = {}, acc[4] = {};
  MmaBf16(p_lo, lo.a, lo.b);
  MmaBf16(p_hi, hi.a, hi.b);
  uint32_t p[4];
  AFromAccumulators(p, p_lo, p_hi);
  MmaBf16(acc, p, second.b);
  for (int i = 0; i < 4; ++i) Element(d, i) = acc[i];
}

// One warp: four 8x8 matrices staged in shared memory (rows of 16 elements, 16-byte aligned),
// lane l's row being row l % 8 of matrix l / 8; each lane's ldmatrix registers written out.
template <bool kTrans>
__global__ void LdMatrixKernel(uint32_t* out, const uint16_t* m) {
  struct alignas(16) Staged {
    uint16_t row[32][16];
  };
  __shared__ Staged s;
  const int lane = int(threadIdx.x);
  for (int j = 0; j < 8; ++j) s.row[lane][j] = m[lane * 8 + j];  // row lane: matrix lane / 8
  __syncwarp();
  uint32_t r[4];
  LdMatrix4<kTrans>(r, &s.row[lane][0]);
  for (int i = 0; i < 4; ++i) out[4 * lane + i] = r[i];
}

}  // namespace

void LdMatrixTiles(uint32_t* out, const uint16_t* m, bool trans) {
  if (trans)
    ATL_LAUNCH(LdMatrixKernel<true>, dim3(1), dim3(32), out, m);
  else
    ATL_LAUNCH(LdMatrixKernel<false>, dim3(1), dim3(32), out, m);
}

void Bf16TileChain(float* d, const float* a, const float* b, const float* b2) {
  ATL_LAUNCH(TileChain, dim3(1), dim3(32), d, a, b, b2);
}

void Bf16TileProduct(float* d, const float* a, const float* b) {
  ATL_LAUNCH(TileProduct, dim3(1), dim3(32), d, a, b);
}

}  // namespace atl::kernels::cuda
