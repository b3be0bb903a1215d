// Linear layers in Hugging Face Conv1D layout: out = inp · W + b, W [IC, OC].
#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace atl::kernels {

using cpu::ParallelGemm;

template <class T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC) {
  T beta = 0;
  if (bias != nullptr) {
    // Seed out with the bias and let the GEMM accumulate onto it (beta = 1): one pass over out.
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      T* o = out + size_t(n) * OC;
      for (int j = 0; j < OC; ++j) o[j] = bias[j];
    }
    beta = 1;
  }
  ParallelGemm<T>(false, false, N, OC, IC, T(1), inp, IC, weight, OC, beta, out, OC);
}

template <class T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int IC, int OC) {
  if (dinp != nullptr) {
    ParallelGemm<T>(false, true, N, IC, OC, T(1), dout, OC, weight, OC, T(1), dinp, IC);
  }
  if (dweight != nullptr) {
    ParallelGemm<T>(true, false, IC, OC, N, T(1), inp, IC, dout, OC, T(1), dweight, OC);
  }
  if (dbias != nullptr) {
    // Column sums of dout: fixed column blocks, rows summed in order.
    constexpr int kCols = 64;
    const int nblocks = (OC + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
    for (int blk = 0; blk < nblocks; ++blk) {
      const int c0 = blk * kCols, c1 = c0 + kCols < OC ? c0 + kCols : OC;
      T acc[kCols] = {};
      for (int n = 0; n < N; ++n) {
        const T* d = dout + size_t(n) * OC;
        for (int c = c0; c < c1; ++c) acc[c - c0] += d[c];
      }
      for (int c = c0; c < c1; ++c) dbias[c] += acc[c - c0];
    }
  }
}

template void MatmulForward<float>(float*, const float*, const float*, const float*, int, int, int);
template void MatmulForward<double>(double*, const double*, const double*, const double*, int, int,
                                    int);
template void MatmulBackward<float>(float*, float*, float*, const float*, const float*,
                                    const float*, int, int, int);
template void MatmulBackward<double>(double*, double*, double*, const double*, const double*,
                                     const double*, int, int, int);

}  // namespace atl::kernels
