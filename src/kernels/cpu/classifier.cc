// The tied LM head (logits = x · wte^T) fused with softmax cross-entropy.
//
// Forward stores the logits (the API exposes them) and, per row, lse = log sum exp and the loss.
// Backward never materializes dlogits [N, V] (206 MB for the `small` preset): it forms dlogits
// one (rows x vocab) tile at a time from the stored logits and lse while the tile is in cache,
// and feeds the tile straight into the two GEMMs that consume it:
//   dwte[tile] += dtile^T · x[rows]        (the vocab tile is owned by one task: no race)
//   dx_g[rows] += dtile · wte[tile]        (summed over vocab tiles: a reduction)
// The dx reduction is made deterministic by giving each of a FIXED number of groups of vocab
// tiles (NumGroups(N, C), a function of the shape, never of the thread count) its own partial dx_g,
// accumulated in tile order, and summing the partials in group order at the end.
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

// Backward tiles: kRowBlock x kVocabTile floats (512 KB) stay in a core's L2 between being formed
// and being read by the two GEMMs. Measured on the `small` shape (1 thread, Zen 5): ~225 ms
// against ~250 for 256 x 256 tiles without prefetch and ~275 for an unfused backward (dlogits
// stored whole, then two tiled GEMMs).
constexpr int kFwdVocabTile = 1024;  // forward tiles: vocab columns
constexpr int kFwdRowBlock = 256;    // forward tiles: rows (a 1 MB float tile)
constexpr int kVocabTile = 256;      // vocab columns per tile
constexpr int kRowBlock = 512;       // rows per tile in backward
// Forming a tile reads kVocabTile logits from each of kRowBlock rows V floats apart: a pattern
// the hardware prefetchers do not follow, so it ran latency-bound (~45 ms of the backward)
// until we prefetch the same segment kPrefetchRows rows ahead in software (~20 ms).
constexpr int kPrefetchRows = 2;

// Over one segment of a row: m = max l, s = sum exp(l - m).
template <class T>
void SegmentMaxSumExp(const T* l, int w, T* m_out, T* s_out) {
#if ATL_HAVE_AVX512
  if constexpr (std::is_same_v<T, float>) {
    __m512 vmx = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < w; j += 16) {
      const __mmask16 k = cpu::TailMask(size_t(w - j));
      vmx = _mm512_mask_max_ps(vmx, k, vmx, _mm512_maskz_loadu_ps(k, l + j));
    }
    const float mx = _mm512_reduce_max_ps(vmx);
    vmx = _mm512_set1_ps(mx);
    __m512 acc = _mm512_setzero_ps();
    for (int j = 0; j < w; j += 16) {
      const __mmask16 k = cpu::TailMask(size_t(w - j));
      const __m512 e = cpu::Exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, l + j), vmx));
      acc = _mm512_mask_add_ps(acc, k, acc, e);
    }
    *m_out = mx;
    *s_out = _mm512_reduce_add_ps(acc);
    return;
  }
#endif
  T mx = l[0];
  for (int j = 1; j < w; ++j) mx = l[j] > mx ? l[j] : mx;
  T sum = 0;
  for (int j = 0; j < w; ++j) sum += std::exp(l[j] - mx);
  *m_out = mx;
  *s_out = sum;
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

// Forward: logits in tiles of kFwdRowBlock rows x kFwdVocabTile columns, one BLAS call each. While
// a tile is still in cache, each row's segment is reduced to (max, sum exp(l - max)); the rows'
// lse then combine their segments in tile order (fixed, so deterministic), and the logits are
// never read back from memory for the loss.
template <class T>
T ClassifierForward(T* logits, T* lse, T* losses, T* scratch, const T* x, const T* wte,
                    const int32_t* targets, int N, int C, int V) {
  const int nvt = (V + kFwdVocabTile - 1) / kFwdVocabTile;
  const int nrb = (N + kFwdRowBlock - 1) / kFwdRowBlock;
  T* stats = scratch;  // [tile][row]{max, sum}
#pragma omp parallel for schedule(dynamic, 1)
  for (int task = 0; task < nvt * nrb; ++task) {
    const int t = task / nrb, r0 = (task % nrb) * kFwdRowBlock;
    const int v0 = t * kFwdVocabTile, w = std::min(kFwdVocabTile, V - v0);
    const int rows = std::min(kFwdRowBlock, N - r0);
    T* out = logits + size_t(r0) * V + v0;
    Gemm<T>(false, true, rows, w, C, T(1), x + size_t(r0) * C, C, wte + size_t(v0) * C, C, T(0),
            out, V);
    if (targets == nullptr) continue;
    for (int r = 0; r < rows; ++r) {
      T* st = stats + (size_t(t) * N + r0 + r) * 2;
      SegmentMaxSumExp(out + size_t(r) * V, w, st, st + 1);
    }
  }
  if (targets == nullptr) return T(0);
#pragma omp parallel for schedule(static)
  for (int n = 0; n < N; ++n) {
    T mx = stats[size_t(n) * 2];
    for (int t = 1; t < nvt; ++t) mx = std::max(mx, stats[(size_t(t) * N + n) * 2]);
    T sum = 0;
    for (int t = 0; t < nvt; ++t) {
      const T* st = stats + (size_t(t) * N + n) * 2;
      sum += st[1] * std::exp(st[0] - mx);
    }
    lse[n] = mx + std::log(sum);
    losses[n] = lse[n] - logits[size_t(n) * V + targets[n]];
  }
  double sum = 0;  // in row order
  for (int n = 0; n < N; ++n) sum += double(losses[n]);
  return T(sum / N);
}

// Groups of vocab tiles in backward: each group is one task with its own partial dx [N, C]. More
// groups balance uneven cores better (the last task's length is the idle tail); the partials cost
// memory and a final pass. Up to 32 groups while they stay under 8M elements (32 MB of float).
static int NumGroups(int N, int C) {
  const int64_t fit = (int64_t(8) << 20) / std::max<int64_t>(1, int64_t(N) * C);
  return int(std::clamp<int64_t>(fit, 8, 32));
}

size_t ClassifierForwardScratch(int N, int V) {
  return size_t((V + kFwdVocabTile - 1) / kFwdVocabTile) * N * 2;
}

size_t ClassifierBackwardScratch(int N, int C, int V) {
  const size_t groups = size_t(NumGroups(N, C));
  return groups * N * C + groups * kRowBlock * kVocabTile;
}

template <class T>
void ClassifierBackward(T* dx, T* dwte, T* scratch, const T* logits, const T* lse, const T* x,
                        const T* wte, const int32_t* targets, T dloss, int N, int C, int V) {
  const int ntiles = (V + kVocabTile - 1) / kVocabTile;
  const int max_groups = NumGroups(N, C);
  const int groups = std::min(max_groups, ntiles);
  T* partial_dx = scratch;                          // [groups][N][C]
  T* tiles = scratch + size_t(max_groups) * N * C;  // [groups][kRowBlock][kVocabTile]
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
          if (r + kPrefetchRows < rows) {
            const char* ahead =
                reinterpret_cast<const char*>(logits + size_t(n + kPrefetchRows) * V + v0);
            for (size_t b = 0; b < size_t(w) * sizeof(T); b += 64) {
              __builtin_prefetch(ahead + b, /*rw=*/0, /*locality=*/3);
            }
          }
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

template float ClassifierForward<float>(float*, float*, float*, float*, const float*, const float*,
                                        const int32_t*, int, int, int);
template double ClassifierForward<double>(double*, double*, double*, double*, const double*,
                                          const double*, const int32_t*, int, int, int);
template void ClassifierBackward<float>(float*, float*, float*, const float*, const float*,
                                        const float*, const float*, const int32_t*, float, int, int,
                                        int);
template void ClassifierBackward<double>(double*, double*, double*, const double*, const double*,
                                         const double*, const double*, const int32_t*, double, int,
                                         int, int);

}  // namespace atl::kernels
