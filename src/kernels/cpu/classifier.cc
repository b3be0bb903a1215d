// The tied LM head (logits = x · wte^T) fused with softmax cross-entropy.
//
// Forward stores the logits (the API exposes them) and, per row, lse = log sum exp and the loss.
// Backward never materializes dlogits [N, V] (206 MB for the `small` preset): it forms dlogits
// one (rows x vocab) tile at a time from the stored logits and lse while the tile is in cache,
// and feeds the tile straight into the two GEMMs that consume it:
//   dwte[tile] += dtile^T · x[rows]        (the vocab tile is owned by one task: no race)
//   dx_g[rows] += dtile · wte[tile]        (summed over vocab tiles: a reduction)
// The dx reduction is made deterministic by giving each of a FIXED number of groups of vocab
// tiles (kGroups, not the thread count) its own partial dx_g, accumulated in tile order, and
// summing the partials in group order at the end.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace atl::kernels {
namespace {

using cpu::Gemm;
using cpu::ParallelGemm;

constexpr int kVocabTile = 256;  // vocab columns per tile
constexpr int kRowBlock = 256;   // rows per tile in backward
constexpr int kGroups = 8;       // groups of vocab tiles, each with its own partial dx

// Per row: lse = log sum_v exp(l_v), computed as max + log sum exp(l - max).
template <class T>
T RowLogSumExp(const T* l, int V) {
#if ATL_HAVE_AVX512
  if constexpr (std::is_same_v<T, float>) {
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < V; j += 16) {
      const __mmask16 k = cpu::TailMask(size_t(V - j));
      vmx = _mm512_mask_max_ps(vmx, k, vmx, _mm512_maskz_loadu_ps(k, l + j));
    }
    const float mx = _mm512_reduce_max_ps(vmx);
    vmx = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < V; j += 16) {
      const __mmask16 k = cpu::TailMask(size_t(V - j));
      const __m512 e = cpu::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vmx));
      acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    return mx + std::log(_mm512_reduce_add_ps(acc));
  }
#endif
  T mx = l[0];
  for (int j = 1; j < V; ++j) mx = l[j] > mx ? l[j] : mx;
  T sum = 0;
  for (int j = 0; j < V; ++j) sum += std::exp(l[j] - mx);
  return mx + std::log(sum);
}

// d[0..w) = dloss * exp(l[0..w) - lse)
template <class T>
void ScaledSoftmax(T* d, const T* l, int w, T lse, T dloss) {
#if ATL_HAVE_AVX512
  if constexpr (std::is_same_v<T, float>) {
    const __m512 vl = _mm512_set1_ps(lse), vd = _mm512_set1_ps(dloss);
    for (int j = 0; j < w; j += 16) {
      const __mmask16 k = cpu::TailMask(size_t(w - j));
      const __m512 e = cpu::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vl));
      _mm512_mask_storeu_ps(d + j, k, _mm512_mul_ps(e, vd));
    }
    return;
  }
#endif
  for (int j = 0; j < w; ++j) d[j] = dloss * std::exp(l[j] - lse);
}

}  // namespace

template <class T>
T ClassifierForward(T* logits, T* lse, T* losses, const T* x, const T* wte, const int32_t* targets,
                    int N, int C, int V) {
  // Tiles over the vocabulary: each call packs x (small) and a slice of wte once.
  ParallelGemm<T>(false, true, N, V, C, T(1), x, C, wte, C, T(0), logits, V,
                  cpu::GemmTiling{N, 4 * kVocabTile});
  if (targets == nullptr) return T(0);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    const T* l = logits + size_t(n) * V;
    lse[n] = RowLogSumExp(l, V);
    losses[n] = lse[n] - l[targets[n]];
  }
  double sum = 0;  // in row order
  for (int n = 0; n < N; ++n) sum += double(losses[n]);
  return T(sum / N);
}

size_t ClassifierBackwardScratch(int N, int C, int V) {
  return size_t(kGroups) * N * C + size_t(kGroups) * kRowBlock * kVocabTile;
}

template <class T>
void ClassifierBackward(T* dx, T* dwte, T* scratch, const T* logits, const T* lse, const T* x,
                        const T* wte, const int32_t* targets, T dloss, int N, int C, int V) {
  const int ntiles = (V + kVocabTile - 1) / kVocabTile;
  const int groups = std::min(kGroups, ntiles);
  T* partial_dx = scratch;                       // [groups][N][C]
  T* tiles = scratch + size_t(kGroups) * N * C;  // [groups][kRowBlock][kVocabTile]
#pragma omp parallel for schedule(dynamic, 1)
  for (int g = 0; g < groups; ++g) {
    T* pdx = partial_dx + size_t(g) * N * C;
    T* d = tiles + size_t(g) * kRowBlock * kVocabTile;
    const int t0 = int(int64_t(ntiles) * g / groups), t1 = int(int64_t(ntiles) * (g + 1) / groups);
    for (int t = t0; t < t1; ++t) {
      const int v0 = t * kVocabTile, w = std::min(kVocabTile, V - v0);
      for (int r0 = 0; r0 < N; r0 += kRowBlock) {
        const int rows = std::min(kRowBlock, N - r0);
        for (int r = 0; r < rows; ++r) {
          const int n = r0 + r;
          T* dr = d + size_t(r) * w;
          ScaledSoftmax(dr, logits + size_t(n) * V + v0, w, lse[n], dloss);
          const int tgt = targets[n] - v0;
          if (tgt >= 0 && tgt < w) dr[tgt] -= dloss;
        }
        if (dwte != nullptr) {
          Gemm<T>(true, false, w, C, rows, T(1), d, w, x + size_t(r0) * C, C, T(1),
                  dwte + size_t(v0) * C, C);
        }
        if (dx != nullptr) {
          Gemm<T>(false, false, rows, C, w, T(1), d, w, wte + size_t(v0) * C, C,
                  t == t0 ? T(0) : T(1), pdx + size_t(r0) * C, C);
        }
      }
    }
  }
  if (dx == nullptr) return;
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T* o = dx + size_t(n) * C;
    for (int g = 0; g < groups; ++g) {
      const T* p = partial_dx + (size_t(g) * N + n) * C;
      for (int c = 0; c < C; ++c) o[c] += p[c];
    }
  }
}

template float ClassifierForward<float>(float*, float*, float*, const float*, const float*,
                                        const int32_t*, int, int, int);
template double ClassifierForward<double>(double*, double*, double*, const double*, const double*,
                                          const int32_t*, int, int, int);
template void ClassifierBackward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const int32_t*, float, int, int,
                                        int);
template void ClassifierBackward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const int32_t*, double, int,
                                         int, int);

}  // namespace atl::kernels
