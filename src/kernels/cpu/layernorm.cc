// LayerNorm forward and backward (eps 1e-5, biased variance, as GPT-2 and PyTorch).
#include <algorithm>
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

// dinp = rstd * (g - mean(g) - norm * mean(g * norm)), g = dout * weight, norm = (x - mean) rstd,
// per row. dweight and dbias sum over rows: cut by column blocks, each walking the rows in order,
// so that reduction's order is fixed. Both kinds of task run in one OpenMP loop.
template <class T>
void LayerNormBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                       const T* mean, const T* rstd, int N, int C) {
  constexpr int kRows = 32, kCols = 32;
  const int nrow_tasks = dinp != nullptr ? (N + kRows - 1) / kRows : 0;
  const int ncol_tasks = (dweight != nullptr || dbias != nullptr) ? (C + kCols - 1) / kCols : 0;
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < nrow_tasks + ncol_tasks; ++task) {
    if (task < nrow_tasks) {
      const int n1 = std::min(N, (task + 1) * kRows);
      for (int n = task * kRows; n < n1; ++n) {
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
      continue;
    }
    const int c0 = (task - nrow_tasks) * kCols, c1 = std::min(C, c0 + kCols);
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
