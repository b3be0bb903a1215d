// GEMM for the CPU kernels: one OpenBLAS call (Gemm), and a fixed tiling of one product into
// independent BLAS calls spread over OpenMP threads (ParallelGemm).
//
// Why tiles and not OpenBLAS's own threads: OpenBLAS splits work by its thread count, so its
// results (and its reduction order for a split K) could change with the number of threads. Here
// the tile grid depends only on the shape, every tile of C is computed by exactly one
// single-threaded BLAS call with the same arguments whatever thread runs it, and K is never split.
// So the result is bitwise identical for any OpenMP thread count.
//
// Internal to src/kernels/cpu; not part of the backend-neutral ops.h.
#pragma once

#include <cstddef>

namespace atl::kernels::cpu {

// C[M,N] = alpha * op(A) · op(B) + beta * C, row-major; op(X) = X^T when trans_x. One BLAS call
// in the calling thread.
template <class T>
void Gemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda, const T* B,
          int ldb, T beta, T* C, int ldc);

// How a product is cut: tiles of tile_m rows by tile_n columns of C (the last ones smaller).
struct GemmTiling {
  int tile_m;
  int tile_n;
};

// The default tiling for an M x N x K product: a function of the shape only (never of the thread
// count). Small products stay one call; larger ones are cut along their longer side into tiles
// big enough for OpenBLAS to run near its peak and numerous enough to balance two to a few
// threads.
GemmTiling DefaultTiling(int M, int N, int K);

// One product C = alpha op(A) op(B) + beta C cut into tiles: the unit that parallel loops hand
// out. Tile i covers rows [i / ntiles_n * tile_m, ...) and columns [i % ntiles_n * tile_n, ...).
template <class T>
struct GemmJob {
  bool trans_a, trans_b;
  int M, N, K;
  T alpha;
  const T* A;
  int lda;
  const T* B;
  int ldb;
  T beta;
  T* C;
  int ldc;
  GemmTiling tiling;

  int num_tiles() const;
  void RunTile(int tile) const;  // one BLAS call
};

// Same contract as Gemm, computed as independent tiles in an OpenMP parallel loop.
template <class T>
void ParallelGemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                  const T* B, int ldb, T beta, T* C, int ldc, GemmTiling tiling);
template <class T>
void ParallelGemm(bool trans_a, bool trans_b, int M, int N, int K, T alpha, const T* A, int lda,
                  const T* B, int ldb, T beta, T* C, int ldc) {
  ParallelGemm(trans_a, trans_b, M, N, K, alpha, A, lda, B, ldb, beta, C, ldc,
               DefaultTiling(M, N, K));
}

}  // namespace atl::kernels::cpu
