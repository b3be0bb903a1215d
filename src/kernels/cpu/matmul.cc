// Linear layers in Hugging Face Conv1D layout: out = inp · W + b, W [IC, OC].
//
// Each function is one OpenMP loop over independent tasks (GEMM tiles, bias-gradient column
// blocks), so a layer costs one fork/join, not one per product.
#include <algorithm>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"

namespace atl::kernels {

using cpu::DefaultTiling;
using cpu::GemmJob;

template <class T>
void MatmulForward(T* out, const T* inp, const T* weight, const T* bias, int N, int IC, int OC) {
  // With a bias, each tile seeds its block of out with the bias and the GEMM accumulates onto it
  // (beta = 1) while the block is still in cache.
  const GemmJob<T> job{false,
                       false,
                       N,
                       OC,
                       IC,
                       T(1),
                       inp,
                       IC,
                       weight,
                       OC,
                       bias != nullptr ? T(1) : T(0),
                       out,
                       OC,
                       DefaultTiling(N, OC, IC)};
  const int ntiles = job.num_tiles();
  const int tm = job.tiling.tile_m, tn = job.tiling.tile_n, nn = (OC + tn - 1) / tn;
#pragma omp parallel for schedule(dynamic, 1) if (ntiles > 1)
  for (int tile = 0; tile < ntiles; ++tile) {
    if (bias != nullptr) {
      const int i0 = (tile / nn) * tm, j0 = (tile % nn) * tn;
      const int i1 = std::min(N, i0 + tm), j1 = std::min(OC, j0 + tn);
      for (int i = i0; i < i1; ++i) std::copy(bias + j0, bias + j1, out + size_t(i) * OC + j0);
    }
    job.RunTile(tile);
  }
}

template <class T>
void MatmulBackward(T* dinp, T* dweight, T* dbias, const T* dout, const T* inp, const T* weight,
                    int N, int IC, int OC) {
  // dinp += dout · W^T        [N, IC]
  const GemmJob<T> dx{false, true,   N,  IC,   OC,   T(1), dout,
                      OC,    weight, OC, T(1), dinp, IC,   DefaultTiling(N, IC, OC)};
  // dweight += inp^T · dout   [IC, OC]
  const GemmJob<T> dw{true, false, IC, OC,   N,       T(1), inp,
                      IC,   dout,  OC, T(1), dweight, OC,   DefaultTiling(IC, OC, N)};
  // dbias += column sums of dout, rows in order, by fixed column blocks.
  constexpr int kCols = 64;
  const int nx = dinp != nullptr ? dx.num_tiles() : 0;
  const int nw = dweight != nullptr ? dw.num_tiles() : 0;
  const int nb = dbias != nullptr ? (OC + kCols - 1) / kCols : 0;
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < nx + nw + nb; ++task) {
    if (task < nx) {
      dx.RunTile(task);
    } else if (task < nx + nw) {
      dw.RunTile(task - nx);
    } else {
      const int c0 = (task - nx - nw) * kCols, c1 = std::min(OC, c0 + kCols);
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
