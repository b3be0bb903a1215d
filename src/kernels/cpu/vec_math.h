// Vectorized exp for the float kernels (softmax, cross-entropy, GELU).
//
// glibc's scalar expf costs ~5 ns; the LM head alone needs 2 exps per logit (50M logits per
// micro-batch of the `small` preset), so float paths use this AVX-512 exp: Cephes' expf
// polynomial (max relative error ~1 ulp on the reduced range), range reduction by n =
// round(x log2 e) with ln 2 split in two, and scalef for 2^n (which flushes huge negative
// arguments to 0 without overflow tricks). Every element of a buffer goes through the same
// vector code (tails use masks, not a scalar loop), so results never depend on where a chunk
// boundary falls. double paths use std::exp: they are the reference.
//
// Internal to src/kernels/cpu.
#pragma once

#include <cmath>
#include <cstddef>

#if defined(__AVX512F__)
#include <immintrin.h>
#define ATL_HAVE_AVX512 1
#else
#define ATL_HAVE_AVX512 0
#endif

namespace atl::kernels::cpu {

#if ATL_HAVE_AVX512
// GCC 12 reports _mm512_undefined_ps() inside its own intrinsics as uninitialized (a false
// positive) wherever they inline.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
inline __m512 Exp16(__m512 x) {
  const __m512 hi = _mm512_set1_ps(88.3762626647949f);
  const __m512 lo = _mm512_set1_ps(-103.9720840454f);  // below: exp underflows to 0
  x = _mm512_min_ps(_mm512_max_ps(x, lo), hi);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 r2 = _mm512_mul_ps(r, r);
  p = _mm512_fmadd_ps(p, r2, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Mask of the first n (< 16) lanes, or all lanes for n >= 16.
inline __mmask16 TailMask(size_t n) {
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1u);
}
#pragma GCC diagnostic pop
#endif

}  // namespace atl::kernels::cpu
