// Bf16TileProduct (ops.h): one tensor-core product through mma.cuh's fragments, so that a test
// can hold the fragments' map against a plain product on the GPU itself.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

// One warp: d[16x8] += a[16x16] b[16x8], all row-major.
__global__ void TileProduct(float* d, const float* a, const float* b) {
  const int lane = int(threadIdx.x), g = lane / 4, t = lane % 4, c = 2 * t;
  const uint32_t fa[4] = {PackBf16(a[g * 16 + c], a[g * 16 + c + 1]),
                          PackBf16(a[(g + 8) * 16 + c], a[(g + 8) * 16 + c + 1]),
                          PackBf16(a[g * 16 + c + 8], a[g * 16 + c + 9]),
                          PackBf16(a[(g + 8) * 16 + c + 8], a[(g + 8) * 16 + c + 9])};
  const uint32_t fb[2] = {PackBf16(b[c * 8 + g], b[(c + 1) * 8 + g]),
                          PackBf16(b[(c + 8) * 8 + g], b[(c + 9) * 8 + g])};
  float acc[4] = {d[g * 8 + c], d[g * 8 + c + 1], d[(g + 8) * 8 + c], d[(g + 8) * 8 + c + 1]};
  MmaBf16(acc, fa, fb);
  d[g * 8 + c] = acc[0];
  d[g * 8 + c + 1] = acc[1];
  d[(g + 8) * 8 + c] = acc[2];
  d[(g + 8) * 8 + c + 1] = acc[3];
}

}  // namespace

void Bf16TileProduct(float* d, const float* a, const float* b) {
  ATL_LAUNCH(TileProduct, dim3(1), dim3(32), d, a, b);
}

}  // namespace atl::kernels::cuda
