// What the CUDA op tests share (cuda_ops_test.cc, cuda_bf16_test.cc, cuda_attention_tc_test.cc):
// the fixture that skips without a usable GPU, random inputs, the normalized error and its checks,
// bits compared, and attention's cases, on the CPU and on the GPU.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/ops.h"

namespace atl::kernels::cuda {

inline constexpr double kTol = 1e-5;

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    if (!Available(&why)) GTEST_SKIP() << "no GPU here (" << why << "): the CUDA op tests need one";
  }
};

inline std::vector<float> Random(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

inline std::vector<int32_t> Tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = dist(gen);
  return v;
}

inline std::vector<double> D(const std::vector<float>& v) { return {v.begin(), v.end()}; }

inline double NormErr(const std::vector<float>& got, const std::vector<double>& want) {
  EXPECT_EQ(got.size(), want.size());
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  if (!std::isfinite(num)) return INFINITY;
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

#define EXPECT_CLOSE(got, want) EXPECT_LE(NormErr(got, want), kTol) << #got

// A gradient that started at init: its increment against the reference's, so that the starting
// values do not hide an error in what the op added. The GPU's float result is init + increment
// rounded to float, which costs up to 2^-24 |init + increment| per element: the bound adds that
// to kTol, relative to the increment's norm. (An op that overwrote instead of adding misses by
// |init| / |increment|, millions of times that allowance.)
inline void ExpectIncrement(const char* what, const std::vector<float>& got,
                            const std::vector<float>& init, const std::vector<double>& want,
                            double tol = kTol) {
  ASSERT_EQ(got.size(), init.size()) << what;
  ASSERT_EQ(want.size(), init.size()) << what;
  double num = 0, den = 0, norm_got = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double inc = double(got[i]) - double(init[i]), want_inc = want[i] - double(init[i]);
    num += (inc - want_inc) * (inc - want_inc);
    den += want_inc * want_inc;
    norm_got += double(got[i]) * double(got[i]);
  }
  if (den == 0) den = 1;
  const double err = std::sqrt(num / den);
  const double bound = tol + 1.2e-7 * std::sqrt(norm_got / den);
  EXPECT_LE(err, bound) << what;
}
#define EXPECT_INC(got, init, want) ExpectIncrement(#got, got, init, want)

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * 4) == 0);
}

// x rounded to bf16 (to nearest, ties to even), back in float.
inline float RoundBf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// v, each element rounded to bf16.
inline std::vector<float> Rounded(std::vector<float> v) {
  for (float& x : v) x = RoundBf16(x);
  return v;
}

// bf16 products on (SetBf16Matmul) for a test's scope.
struct Bf16On {
  Bf16On() { SetBf16Matmul(true); }
  ~Bf16On() { SetBf16Matmul(false); }
};

// A bf16's bits widened to float (exactly).
inline float FromBf16Bits(uint16_t bits) {
  const uint32_t u = uint32_t(bits) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// ClassifierForward's bf16 logits (rows LogitsRowStride(V) apart), widened to a float [N, V].
inline std::vector<float> WidenedLogits(const std::vector<uint16_t>& bits, size_t N, size_t V) {
  const size_t ld = size_t(LogitsRowStride(int(V)));
  std::vector<float> logits(N * V);
  for (size_t i = 0; i < N * V; ++i) logits[i] = FromBf16Bits(bits[i / V * ld + i % V]);
  return logits;
}

// Each row's log-sum-exp of [N, V] logits, in double.
inline std::vector<double> RowLogSumExp(const std::vector<float>& logits, size_t N, size_t V) {
  std::vector<double> lse(N);
  for (size_t n = 0; n < N; ++n) {
    double mx = -INFINITY, sum = 0;
    for (size_t v = 0; v < V; ++v) mx = std::max(mx, double(logits[n * V + v]));
    for (size_t v = 0; v < V; ++v) sum += std::exp(double(logits[n * V + v]) - mx);
    lse[n] = mx + std::log(sum);
  }
  return lse;
}

// Each element rounded to bf16, as bits (what the ops' bf16 copies hold).
inline std::vector<uint16_t> Bf16Bits(const std::vector<float>& v) {
  std::vector<uint16_t> bits(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    const float r = RoundBf16(v[i]);
    uint32_t u;
    std::memcpy(&u, &r, sizeof(u));
    bits[i] = uint16_t(u >> 16);
  }
  return bits;
}

// Each query row's log-sum-exp of its scaled causal scores, in double, from the float inputs.
inline std::vector<double> RowLse(const std::vector<float>& qkv, int B, int T, int C, int NH) {
  const int hs = C / NH;
  const double scale = 1.0 / std::sqrt(double(hs));
  std::vector<double> lse(size_t(B) * NH * T), s(static_cast<size_t>(T));
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const float* q = qkv.data() + (size_t(b) * T + t) * 3 * C + size_t(h) * hs;
        double mx = -INFINITY, sum = 0;
        for (int j = 0; j <= t; ++j) {
          const float* k = qkv.data() + (size_t(b) * T + j) * 3 * C + C + size_t(h) * hs;
          double dot = 0;
          for (int d = 0; d < hs; ++d) dot += double(q[d]) * k[d];
          s[size_t(j)] = dot * scale;
          mx = std::max(mx, s[size_t(j)]);
        }
        for (int j = 0; j <= t; ++j) sum += std::exp(s[size_t(j)] - mx);
        lse[(size_t(b) * NH + h) * T + t] = mx + std::log(sum);
      }
  return lse;
}

// An attention test case: the shape, and amp, the factor q and k are scaled by.
struct AttentionCase {
  int B, T, C, NH;
  float amp;
  size_t x() const { return size_t(B) * T * C; }  // elements of out (and of dout)
};
inline std::ostream& operator<<(std::ostream& o, const AttentionCase& s) {
  return o << "B=" << s.B << " T=" << s.T << " C=" << s.C << " NH=" << s.NH << " amp=" << s.amp;
}

// Random inputs of a case: qkv (q and k times amp), dout, and dqkv0 for the gradient to add to.
struct AttentionInputs {
  std::vector<float> qkv, dout, dqkv0;
};
inline AttentionInputs RandomAttentionInputs(const AttentionCase& s, uint32_t seed) {
  AttentionInputs in{Random(3 * s.x(), seed), Random(s.x(), seed + 1), Random(3 * s.x(), seed + 2)};
  for (size_t i = 0; i < in.qkv.size(); ++i)
    if (i % (3 * size_t(s.C)) < 2 * size_t(s.C)) in.qkv[i] *= s.amp;
  return in;
}

// The CPU's double attention (kernels/ops.h) on qkv: out, and with dout dqkv0 plus the gradient.
struct AttentionReference {
  std::vector<double> out, dqkv;
};
inline AttentionReference CpuAttention(const AttentionCase& s, const std::vector<float>& qkv,
                                       const std::vector<float>* dout = nullptr,
                                       const std::vector<float>* dqkv0 = nullptr) {
  const size_t natt = size_t(s.B) * s.NH * s.T * s.T;
  auto dq = D(qkv);
  std::vector<double> att(natt);
  AttentionReference r{std::vector<double>(s.x()), {}};
  ::atl::kernels::AttentionForward(r.out.data(), att.data(), dq.data(), s.B, s.T, s.C, s.NH);
  if (dout != nullptr) {
    auto ddout = D(*dout);
    std::vector<double> scratch(natt);
    r.dqkv = D(*dqkv0);
    ::atl::kernels::AttentionBackward(r.dqkv.data(), scratch.data(), ddout.data(), dq.data(),
                                      att.data(), s.B, s.T, s.C, s.NH);
  }
  return r;
}

// The GPU's forward and backward (ops.h) on the inputs: {out, lse, dqkv0 plus the gradient};
// out_bf16 and dqkv_bf16 (device, or null) are passed on as the ops' bf16 copies. keep (or
// null): the forward keeps its operands for the backward, in room for the shape *keep
// (AttentionKeptElements of it); spoil_qkv: qkv is overwritten with NaNs between the forward and
// the backward; into: the backward's (kAdd: to dqkv0).
inline std::vector<std::vector<float>> GpuAttention(
    const AttentionCase& s, const AttentionInputs& in, uint16_t* out_bf16 = nullptr,
    uint16_t* dqkv_bf16 = nullptr, const AttentionCase* keep = nullptr, bool spoil_qkv = false,
    GradInto into = GradInto::kAdd) {
  auto g_qkv = ToDevice(in.qkv), g_dout = ToDevice(in.dout), g_dqkv = ToDevice(in.dqkv0);
  // NaNs in the outputs (a new array may get an earlier one's memory, and its values).
  auto g_out = ToDevice(std::vector<float>(s.x(), NAN));
  auto g_lse = ToDevice(std::vector<float>(size_t(s.B) * s.NH * s.T, NAN));
  // Where nothing is kept (AttentionKeptElements 0), still a room (of 8): the ops ignore it.
  DeviceArray<uint16_t> kept(
      keep ? std::max<size_t>(8, AttentionKeptElements(keep->B, keep->T, keep->C, keep->NH)) : 0);
  uint16_t* k = keep ? kept.data() : nullptr;
  AttentionForward(g_out.data(), g_lse.data(), g_qkv.data(), s.B, s.T, s.C, s.NH, out_bf16, k);
  if (spoil_qkv) g_qkv.Upload(std::vector<float>(in.qkv.size(), NAN).data(), in.qkv.size());
  AttentionBackward(g_dqkv.data(), g_dout.data(), g_out.data(), g_qkv.data(), g_lse.data(), s.B,
                    s.T, s.C, s.NH, dqkv_bf16, into, k);
  return {ToHost(g_out), ToHost(g_lse), ToHost(g_dqkv)};
}

}  // namespace atl::kernels::cuda
