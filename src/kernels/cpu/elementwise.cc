// GELU (tanh approximation) and residual adds.
//
// GELU is written as x * sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3), which equals
// 0.5 x (1 + tanh u) and needs one exp. Its derivative: sigmoid(2u) + 2 x sigmoid(2u)
// (1 - sigmoid(2u)) du/dx. The double path evaluates the same formula with std::exp.
#include <cmath>
#include <type_traits>

#include "kernels/cpu/vec_math.h"
#include "kernels/ops.h"

namespace atl::kernels {
namespace {

constexpr double kGeluS = 0.7978845608028654;  // sqrt(2/pi)
constexpr double kGeluC = 0.044715;
constexpr size_t kChunk = 4096;  // elements per OpenMP chunk (a multiple of 16)

template <class T>
inline T Sigmoid2U(T x) {
  const T u = T(kGeluS) * (x + T(kGeluC) * x * x * x);
  return T(1) / (T(1) + std::exp(T(-2) * u));
}

}  // namespace

template <class T>
void GeluForward(T* out, const T* inp, size_t n) {
  const size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t ch = 0; ch < nchunks; ++ch) {
    const size_t i0 = ch * kChunk, i1 = i0 + kChunk < n ? i0 + kChunk : n;
#if ATL_HAVE_AVX512
    if constexpr (std::is_same_v<T, float>) {
      const __m512 s = _mm512_set1_ps(float(kGeluS)), c = _mm512_set1_ps(float(kGeluC));
      const __m512 one = _mm512_set1_ps(1.0f), m2 = _mm512_set1_ps(-2.0f);
      for (size_t i = i0; i < i1; i += 16) {
        const __mmask16 k = cpu::TailMask(i1 - i);
        const __m512 x = _mm512_maskz_loadu_ps(k, inp + i);
        const __m512 x3 = _mm512_mul_ps(_mm512_mul_ps(x, x), x);
        const __m512 u = _mm512_mul_ps(s, _mm512_fmadd_ps(c, x3, x));
        const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, cpu::Exp16(_mm512_mul_ps(m2, u))));
        _mm512_mask_storeu_ps(out + i, k, _mm512_mul_ps(x, sig));
      }
      continue;
    }
#endif
    for (size_t i = i0; i < i1; ++i) out[i] = inp[i] * Sigmoid2U(inp[i]);
  }
}

template <class T>
void GeluBackward(T* dinp, const T* inp, const T* dout, size_t n) {
  const size_t nchunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static)
  for (size_t ch = 0; ch < nchunks; ++ch) {
    const size_t i0 = ch * kChunk, i1 = i0 + kChunk < n ? i0 + kChunk : n;
#if ATL_HAVE_AVX512
    if constexpr (std::is_same_v<T, float>) {
      const __m512 s = _mm512_set1_ps(float(kGeluS)), c = _mm512_set1_ps(float(kGeluC));
      const __m512 c3 = _mm512_set1_ps(float(3 * kGeluC));
      const __m512 one = _mm512_set1_ps(1.0f), m2 = _mm512_set1_ps(-2.0f);
      const __m512 two = _mm512_set1_ps(2.0f);
      for (size_t i = i0; i < i1; i += 16) {
        const __mmask16 k = cpu::TailMask(i1 - i);
        const __m512 x = _mm512_maskz_loadu_ps(k, inp + i);
        const __m512 x2 = _mm512_mul_ps(x, x);
        const __m512 u = _mm512_mul_ps(s, _mm512_fmadd_ps(_mm512_mul_ps(c, x2), x, x));
        const __m512 du = _mm512_mul_ps(s, _mm512_fmadd_ps(c3, x2, one));
        const __m512 sig = _mm512_div_ps(one, _mm512_add_ps(one, cpu::Exp16(_mm512_mul_ps(m2, u))));
        // sig + 2 x sig (1 - sig) du
        const __m512 t = _mm512_mul_ps(_mm512_mul_ps(two, x), _mm512_mul_ps(sig, du));
        const __m512 g = _mm512_fmadd_ps(t, _mm512_sub_ps(one, sig), sig);
        const __m512 d = _mm512_maskz_loadu_ps(k, dout + i);
        const __m512 acc = _mm512_maskz_loadu_ps(k, dinp + i);
        _mm512_mask_storeu_ps(dinp + i, k, _mm512_fmadd_ps(g, d, acc));
      }
      continue;
    }
#endif
    for (size_t i = i0; i < i1; ++i) {
      const T x = inp[i];
      const T sig = Sigmoid2U(x);
      const T du = T(kGeluS) * (T(1) + T(3 * kGeluC) * x * x);
      const T g = sig + T(2) * x * sig * (T(1) - sig) * du;
      dinp[i] += g * dout[i];
    }
  }
}

template <class T>
void ResidualForward(T* out, const T* a, const T* b, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

template <class T>
void ResidualBackward(T* da, T* db, const T* dout, size_t n) {
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) {
    if (da != nullptr) da[i] += dout[i];
    if (db != nullptr) db[i] += dout[i];
  }
}

template void GeluForward<float>(float*, const float*, size_t);
template void GeluForward<double>(double*, const double*, size_t);
template void GeluBackward<float>(float*, const float*, const float*, size_t);
template void GeluBackward<double>(double*, const double*, const double*, size_t);
template void ResidualForward<float>(float*, const float*, const float*, size_t);
template void ResidualForward<double>(double*, const double*, const double*, size_t);
template void ResidualBackward<float>(float*, float*, const float*, size_t);
template void ResidualBackward<double>(double*, double*, const double*, size_t);

}  // namespace atl::kernels
