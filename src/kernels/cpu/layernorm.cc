// LayerNorm forward and backward (eps 1e-5, biased variance, as GPT-2 and PyTorch).
#include <cmath>

#include "kernels/ops.h"

namespace atl::kernels {

template <class T>
void LayerNormForward(T* out, T* mean, T* rstd, const T* inp, const T* weight, const T* bias, int N,
                      int C) {
  const T eps = T(1e-5);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* x = inp + size_t(n) * C;
    T m = 0;
    for (int c = 0; c < C; ++c) m += x[c];
    m /= C;
    // Two-pass variance: no cancellation when |mean| >> std.
    T v = 0;
    for (int c = 0; c < C; ++c) {
      const T d = x[c] - m;
      v += d * d;
    }
    v /= C;
    const T s = T(1) / std::sqrt(v + eps);
    T* o = out + size_t(n) * C;
    for (int c = 0; c < C; ++c) o[c] = (x[c] - m) * s * weight[c] + bias[c];
    mean[n] = m;
    rstd[n] = s;
  }
}

// dinp = rstd * (g - mean(g) - norm * mean(g * norm)), g = dout * weight, norm = (x - mean) rstd.
// Per row, so rows run in parallel. dweight and dbias sum over rows: a second pass cut by column
// blocks, each walking the rows in order, keeps that reduction's order fixed.
template <class T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int N, int C) {
  if (dinp != nullptr) {
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; ++n) {
      const T* x = inp + size_t(n) * C;
      const T* dy = dout + size_t(n) * C;
      const T m = mean[n], s = rstd[n];
      T g_mean = 0, gn_mean = 0;
      for (int c = 0; c < C; ++c) {
        const T g = dy[c] * weight[c];
        g_mean += g;
        gn_mean += g * (x[c] - m) * s;
      }
      g_mean /= C;
      gn_mean /= C;
      T* dx = dinp + size_t(n) * C;
      for (int c = 0; c < C; ++c) {
        const T norm = (x[c] - m) * s;
        dx[c] += s * (dy[c] * weight[c] - g_mean - norm * gn_mean);
      }
    }
  }
  if (dweight == nullptr && dbias == nullptr) return;
  constexpr int kCols = 32;
  const int nblocks = (C + kCols - 1) / kCols;
#pragma omp parallel for schedule(static)
  for (int blk = 0; blk < nblocks; ++blk) {
    const int c0 = blk * kCols, c1 = c0 + kCols < C ? c0 + kCols : C;
    T dw[kCols] = {}, db[kCols] = {};
    for (int n = 0; n < N; ++n) {
      const T* x = inp + size_t(n) * C;
      const T* dy = dout + size_t(n) * C;
      const T m = mean[n], s = rstd[n];
      for (int c = c0; c < c1; ++c) {
        dw[c - c0] += dy[c] * (x[c] - m) * s;
        db[c - c0] += dy[c];
      }
    }
    for (int c = c0; c < c1; ++c) {
      if (dweight != nullptr) dweight[c] += dw[c - c0];
      if (dbias != nullptr) dbias[c] += db[c - c0];
    }
  }
}

template void LayerNormForward<float>(float*, float*, float*, const float*, const float*,
                                      const float*, int, int);
template void LayerNormForward<double>(double*, double*, double*, const double*, const double*,
                                       const double*, int, int);
template void LayerNormBackward<float>(float*, float*, float*, const float*, const float*,
                                       const float*, const float*, const float*, int, int);
template void LayerNormBackward<double>(double*, double*, double*, const double*, const double*,
                                        const double*, const double*, const double*, int, int);

}  // namespace atl::kernels
