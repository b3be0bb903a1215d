#include "kernels/cpu/gemm.h"

#include <cblas.h>

#include <algorithm>

namespace atl::kernels::cpu {

template <>
void Gemm<float>(bool trans_a, bool trans_b, int M, int N, int K, float alpha, const float* A,
                 int lda, const float* B, int ldb, float beta, float* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

template <>
void Gemm<double>(bool trans_a, bool trans_b, int M, int N, int K, double alpha, const double* A,
                  int lda, const double* B, int ldb, double beta, double* C, int ldc) {
  if (M <= 0 || N <= 0) return;
  cblas_dgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc);
}

GemmTiling DefaultTiling(int M, int N, int K) {
  // Below ~16 MFLOP a product is cheaper as one call than as several (each call re-packs its
  // panels and pays fixed overhead).
  const double flops = 2.0 * M * N * K;
  if (flops < 16e6) return {std::max(M, 1), std::max(N, 1)};
  // Aim at >= 8 tiles (two threads, uneven cores) of at least 64 along the cut side, multiples
  // of 32 so the BLAS micro-kernels see full panels. Cut the longer side.
  auto cut = [](int n) {
    int t = (n + 7) / 8;
    t = (t + 31) / 32 * 32;
    return std::max(t, 64);
  };
  if (M >= N) return {std::min(M, cut(M)), N};
  return {M, std::min(N, cut(N))};
}

template <class T>
int GemmJob<T>::num_tiles() const {
  if (M <= 0 || N <= 0) return 0;
  const int tm = std::max(1, tiling.tile_m), tn = std::max(1, tiling.tile_n);
  return ((M + tm - 1) / tm) * ((N + tn - 1) / tn);
}

template <class T>
void GemmJob<T>::RunTile(int tile) const {
  const int tm = std::max(1, tiling.tile_m), tn = std::max(1, tiling.tile_n);
  const int nn = (N + tn - 1) / tn;
  const int i0 = (tile / nn) * tm, j0 = (tile % nn) * tn;
  const int mm = std::min(tm, M - i0), ncols = std::min(tn, N - j0);
  // Row block i0 of op(A): rows of A, or columns of A when transposed; likewise for B.
  const T* a = trans_a ? A + i0 : A + size_t(i0) * lda;
  const T* b = trans_b ? B + size_t(j0) * ldb : B + j0;
  Gemm(trans_a, trans_b, mm, ncols, K, alpha, a, lda, b, ldb, beta, C + size_t(i0) * ldc + j0, ldc);
}

template <class T>
void ParallelGemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                  const T* B, int ldb, T beta, T* C, int ldc, GemmTiling tiling) {
  const GemmJob<T> job{trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc, tiling};
  const int ntiles = job.num_tiles();
  if (ntiles == 1) {
    job.RunTile(0);
    return;
  }
#pragma omp parallel for schedule(dynamic, 1)
  for (int tile = 0; tile < ntiles; ++tile) job.RunTile(tile);
}

template struct GemmJob<float>;
template struct GemmJob<double>;
template void ParallelGemm<float>(bool, bool, int, int, int, float, const float*, int, const float*,
                                  int, float, float*, int, GemmTiling);
template void ParallelGemm<double>(bool, bool, int, int, int, double, const double*, int,
                                   const double*, int, double, double*, int, GemmTiling);

}  // namespace atl::kernels::cpu
