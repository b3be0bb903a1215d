// Every op of kernels/ops.h on the CPU backend:
//  - backward against central finite differences in double (FiniteDiff*),
//  - float against double on the same inputs (FloatMatchesDouble*), ggml test-backend-ops style,
//  - bitwise-identical results for 1 and 2 OpenMP threads (Deterministic*).
//
// Finite-difference tolerance. Every test differentiates J = sum(out * R) for a fixed random R
// (so dout = R) with a central difference of step h = 1e-5 in double. Its error is the truncation
// term h^2 |J'''| / 6 ~ 1e-11 (the ops are smooth, with O(1) third derivatives at these input
// scales) plus rounding, ~ eps |J| / h ~ 2e-16 * O(10) / 1e-5 ~ 2e-10. Gradients here are O(0.1)
// to O(1), so we require |analytic - numeric| <= 1e-6 * max(|numeric|, 1e-2): three orders above
// the expected noise, yet any real bug (a missed term, a wrong index, a transposed product) shows
// up as an O(1) relative error.
#include "kernels/ops.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/cpu/vec_math.h"

namespace atl::kernels {
namespace {

constexpr double kFdStep = 1e-5;
constexpr double kFdRtol = 1e-6;
constexpr double kFdFloor = 1e-2;

std::vector<double> RandomVec(size_t n, uint32_t seed, double scale = 1.0) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> dist(0.0, scale);
  std::vector<double> v(n);
  for (double& x : v) x = dist(gen);
  return v;
}

std::vector<float> ToFloat(const std::vector<double>& v) { return {v.begin(), v.end()}; }

double Dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Checks analytic[i] == dJ/dx[i] for the given indices (all if empty) by central differences.
// J() recomputes the objective from the current x. Returns the largest relative error.
double CheckGradient(const char* what, std::vector<double>& x, const std::vector<double>& analytic,
                     const std::function<double()>& J, std::vector<size_t> indices = {}) {
  if (indices.empty()) {
    for (size_t i = 0; i < x.size(); ++i) indices.push_back(i);
  }
  double worst = 0;
  for (size_t i : indices) {
    const double x0 = x[i];
    x[i] = x0 + kFdStep;
    const double jp = J();
    x[i] = x0 - kFdStep;
    const double jm = J();
    x[i] = x0;
    const double numeric = (jp - jm) / (2 * kFdStep);
    const double rel = std::abs(analytic[i] - numeric) / std::max(std::abs(numeric), kFdFloor);
    worst = std::max(worst, rel);
    EXPECT_LE(rel, kFdRtol) << what << "[" << i << "]: analytic " << analytic[i] << " numeric "
                            << numeric;
  }
  std::printf("  %-8s %5zu elements, max rel err %.1e\n", what, indices.size(), worst);
  return worst;
}

// Largest |a - b| / max(|b|) over the buffer: the normalized error of a float result against its
// double reference.
double NormalizedError(const std::vector<float>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(double(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / std::max(den, 1e-30);
}

// Runs f with 1 and with 2 OpenMP threads; f returns the bytes to compare.
void ExpectSameForThreadCounts(const std::function<std::vector<float>()>& f) {
  const int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  const std::vector<float> one = f();
  omp_set_num_threads(2);
  const std::vector<float> two = f();
  omp_set_num_threads(saved);
  ASSERT_EQ(one.size(), two.size());
  EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)))
      << "results differ between 1 and 2 threads";
}

class OpsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { InitBackend(); }
};

// ---- Encoder ----------------------------------------------------------------------------------

TEST_F(OpsTest, FiniteDiffEncoder) {
  const int B = 2, T = 5, C = 6, V = 7;
  std::vector<int32_t> inp = {1, 3, 3, 0, 6, 3, 1, 1, 2, 5};  // repeats exercise the scatter-add
  auto wte = RandomVec(size_t(V) * C, 1), wpe = RandomVec(size_t(T) * C, 2);
  const auto R = RandomVec(size_t(B) * T * C, 3);
  std::vector<double> out(R.size());
  auto J = [&] {
    EncoderForward(out.data(), inp.data(), wte.data(), wpe.data(), B, T, C);
    return Dot(out, R);
  };
  std::vector<double> dwte(wte.size()), dwpe(wpe.size());
  EncoderBackward(dwte.data(), dwpe.data(), R.data(), inp.data(), B, T, C);
  CheckGradient("dwte", wte, dwte, J);
  CheckGradient("dwpe", wpe, dwpe, J);
}

// ---- LayerNorm --------------------------------------------------------------------------------

TEST_F(OpsTest, FiniteDiffLayerNorm) {
  const int N = 7, C = 10;
  auto inp = RandomVec(size_t(N) * C, 4, 2.0), w = RandomVec(C, 5), b = RandomVec(C, 6);
  for (double& x : inp) x += 0.5;  // a nonzero mean
  const auto R = RandomVec(inp.size(), 7);
  std::vector<double> out(inp.size()), mean(N), rstd(N);
  auto J = [&] {
    LayerNormForward(out.data(), mean.data(), rstd.data(), inp.data(), w.data(), b.data(), N, C);
    return Dot(out, R);
  };
  J();
  std::vector<double> dinp(inp.size(), 0.0), dw(C, 0.0), db(C, 0.0);
  LayerNormBackward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), mean.data(),
                    rstd.data(), N, C);
  CheckGradient("dinp", inp, dinp, J);
  CheckGradient("dweight", w, dw, J);
  CheckGradient("dbias", b, db, J);
}

// ---- Matmul -----------------------------------------------------------------------------------

TEST_F(OpsTest, FiniteDiffMatmul) {
  const int N = 9, IC = 6, OC = 5;
  auto inp = RandomVec(size_t(N) * IC, 8), w = RandomVec(size_t(IC) * OC, 9), b = RandomVec(OC, 10);
  const auto R = RandomVec(size_t(N) * OC, 11);
  std::vector<double> out(R.size());
  auto J = [&] {
    MatmulForward(out.data(), inp.data(), w.data(), b.data(), N, IC, OC);
    return Dot(out, R);
  };
  std::vector<double> dinp(inp.size(), 0.5), dw(w.size(), -0.25), db(OC, 1.0);  // backward adds
  MatmulBackward(dinp.data(), dw.data(), db.data(), R.data(), inp.data(), w.data(), N, IC, OC);
  for (double& x : dinp) x -= 0.5;
  for (double& x : dw) x += 0.25;
  for (double& x : db) x -= 1.0;
  CheckGradient("dinp", inp, dinp, J);
  CheckGradient("dweight", w, dw, J);
  CheckGradient("dbias", b, db, J);
}

// ---- Attention --------------------------------------------------------------------------------

void RunAttentionFiniteDiff(int B, int T, int C, int NH) {
  auto qkv = RandomVec(size_t(B) * T * 3 * C, 12);
  const auto R = RandomVec(size_t(B) * T * C, 13);
  std::vector<double> out(R.size()), att(size_t(B) * NH * T * T);
  auto J = [&] {
    AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
    return Dot(out, R);
  };
  J();
  // Causality: probabilities are zero above the diagonal and rows sum to 1.
  for (int row = 0; row < B * NH * T; ++row) {
    const int i = row % T;
    double s = 0;
    for (int j = 0; j < T; ++j) {
      if (j > i) {
        EXPECT_EQ(att[size_t(row) * T + j], 0.0);
      }
      s += att[size_t(row) * T + j];
    }
    EXPECT_NEAR(s, 1.0, 1e-12);
  }
  std::vector<double> dqkv(qkv.size(), 0.0), scratch(att.size());
  AttentionBackward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  CheckGradient("dqkv", qkv, dqkv, J);
}

TEST_F(OpsTest, FiniteDiffAttention) { RunAttentionFiniteDiff(2, 6, 8, 2); }

// More rows than one causal query block (64): a full block then a partial one.
TEST_F(OpsTest, FiniteDiffAttentionBlocked) { RunAttentionFiniteDiff(1, 70, 4, 2); }

// ---- GELU and residual ------------------------------------------------------------------------

TEST_F(OpsTest, FiniteDiffGelu) {
  const size_t n = 101;  // not a multiple of 16: the masked tail
  auto x = RandomVec(n, 14, 2.0);
  const auto R = RandomVec(n, 15);
  std::vector<double> out(n);
  auto J = [&] {
    GeluForward(out.data(), x.data(), n);
    return Dot(out, R);
  };
  J();
  for (size_t i = 0; i < n; ++i) {  // against the tanh form of the definition
    const double u = std::sqrt(2.0 / M_PI) * (x[i] + 0.044715 * x[i] * x[i] * x[i]);
    EXPECT_NEAR(out[i], 0.5 * x[i] * (1 + std::tanh(u)), 1e-14);
  }
  std::vector<double> dx(n, 0.0);
  GeluBackward(dx.data(), x.data(), R.data(), n);
  CheckGradient("dinp", x, dx, J);
}

TEST_F(OpsTest, FiniteDiffResidual) {
  const size_t n = 33;
  auto a = RandomVec(n, 16), b = RandomVec(n, 17);
  const auto R = RandomVec(n, 18);
  std::vector<double> out(n);
  auto J = [&] {
    ResidualForward(out.data(), a.data(), b.data(), n);
    return Dot(out, R);
  };
  std::vector<double> da(n, 0.0), db(n, 0.0);
  ResidualBackward(da.data(), db.data(), R.data(), n);
  CheckGradient("da", a, da, J);
  CheckGradient("db", b, db, J);
}

// ---- Classifier (tied head + softmax cross-entropy) -------------------------------------------

// Shapes large enough to cross every tile boundary of the fused backward: several vocab tiles
// split over the groups unevenly, a partial last tile, and more rows than one row block.
struct ClassifierCase {
  int N, C, V;
};

void RunClassifierFiniteDiff(ClassifierCase cs, int samples) {
  const int N = cs.N, C = cs.C, V = cs.V;
  auto x = RandomVec(size_t(N) * C, 19), wte = RandomVec(size_t(V) * C, 20, 0.5);
  std::vector<int32_t> targets(N);
  std::mt19937 gen(21);
  for (int32_t& t : targets) t = int32_t(gen() % V);
  targets[0] = V - 1;  // the last column of the partial tile
  std::vector<double> logits(size_t(N) * V), lse(N), losses(N), fs(ClassifierForwardScratch(N, V));
  const double dloss = 1.0 / N;
  auto J = [&] {
    return dloss * N *
           ClassifierForward(logits.data(), lse.data(), losses.data(), fs.data(), x.data(),
                             wte.data(), targets.data(), N, C, V);
  };
  const double mean = J() / (dloss * N);
  // The loss against a direct computation.
  double ref = 0;
  for (int n = 0; n < N; ++n) {
    double mx = -1e300, s = 0;
    for (int v = 0; v < V; ++v) mx = std::max(mx, logits[size_t(n) * V + v]);
    for (int v = 0; v < V; ++v) s += std::exp(logits[size_t(n) * V + v] - mx);
    ref += mx + std::log(s) - logits[size_t(n) * V + targets[n]];
  }
  EXPECT_NEAR(mean, ref / N, 1e-12 * std::abs(ref / N));
  std::vector<double> dx(x.size(), 0.0), dwte(wte.size(), 0.0);
  std::vector<double> scratch(ClassifierBackwardScratch(N, C, V));
  ClassifierBackward(dx.data(), dwte.data(), scratch.data(), logits.data(), lse.data(), x.data(),
                     wte.data(), targets.data(), dloss, N, C, V);
  std::vector<size_t> xi, wi;
  for (int s = 0; s < samples; ++s) {
    xi.push_back(gen() % x.size());
    wi.push_back(gen() % wte.size());
  }
  for (int c = 0; c < C; ++c) wi.push_back(size_t(targets[0]) * C + c);  // a target row
  CheckGradient("dx", x, dx, J, xi);
  CheckGradient("dwte", wte, dwte, J, wi);
}

TEST_F(OpsTest, FiniteDiffClassifierSmall) { RunClassifierFiniteDiff({5, 4, 11}, 0); }

// 600 rows: two row blocks in backward, three in forward. V 9000: 36 vocab tiles over 32 groups
// (some groups chain two tiles), and partial tiles at the end in both passes.
TEST_F(OpsTest, FiniteDiffClassifierTiled) { RunClassifierFiniteDiff({600, 6, 9000}, 40); }

// ---- Float against double ---------------------------------------------------------------------

// Float tolerance: a float result carries rounding of ~6e-8 relative per operation; LayerNorm,
// softmax and GEMM rows accumulate at most a few hundred terms here, and the vectorized exp has
// ~1-2 ulp error, so normalized errors are ~1e-6. We allow 1e-5.
constexpr double kFloatTol = 1e-5;

TEST_F(OpsTest, FloatMatchesDoubleLayerNormGeluMatmul) {
  const int N = 37, C = 48;
  auto inp = RandomVec(size_t(N) * C, 30), w = RandomVec(C, 31), b = RandomVec(C, 32);
  auto W = RandomVec(size_t(C) * 4 * C, 33, 0.1), bias = RandomVec(4 * C, 34);
  std::vector<double> ln(inp.size()), m(N), r(N), fc(size_t(N) * 4 * C), ge(fc.size());
  LayerNormForward(ln.data(), m.data(), r.data(), inp.data(), w.data(), b.data(), N, C);
  MatmulForward(fc.data(), ln.data(), W.data(), bias.data(), N, C, 4 * C);
  GeluForward(ge.data(), fc.data(), fc.size());
  auto inpf = ToFloat(inp), wf = ToFloat(w), bf = ToFloat(b), Wf = ToFloat(W),
       biasf = ToFloat(bias);
  std::vector<float> lnf(ln.size()), mf(N), rf(N), fcf(fc.size()), gef(fc.size());
  LayerNormForward(lnf.data(), mf.data(), rf.data(), inpf.data(), wf.data(), bf.data(), N, C);
  MatmulForward(fcf.data(), lnf.data(), Wf.data(), biasf.data(), N, C, 4 * C);
  GeluForward(gef.data(), fcf.data(), fcf.size());
  EXPECT_LE(NormalizedError(lnf, ln), kFloatTol);
  EXPECT_LE(NormalizedError(fcf, fc), kFloatTol);
  EXPECT_LE(NormalizedError(gef, ge), kFloatTol);
  // Backward of GELU: the vectorized float path against the double formula.
  const auto R = RandomVec(fc.size(), 35);
  std::vector<double> dx(fc.size(), 0.0);
  std::vector<float> dxf(fc.size(), 0.0f);
  GeluBackward(dx.data(), fc.data(), R.data(), fc.size());
  auto Rf = ToFloat(R);
  GeluBackward(dxf.data(), fcf.data(), Rf.data(), fc.size());
  EXPECT_LE(NormalizedError(dxf, dx), kFloatTol);
}

TEST_F(OpsTest, FloatMatchesDoubleAttention) {
  const int B = 2, T = 150, C = 32, NH = 4;
  auto qkv = RandomVec(size_t(B) * T * 3 * C, 36);
  const auto R = RandomVec(size_t(B) * T * C, 37);
  std::vector<double> out(R.size()), att(size_t(B) * NH * T * T), dqkv(qkv.size(), 0.0),
      scratch(att.size());
  AttentionForward(out.data(), att.data(), qkv.data(), B, T, C, NH);
  AttentionBackward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
  auto qkvf = ToFloat(qkv), Rf = ToFloat(R);
  std::vector<float> outf(out.size()), attf(att.size()), dqkvf(qkv.size(), 0.0f),
      scratchf(att.size());
  AttentionForward(outf.data(), attf.data(), qkvf.data(), B, T, C, NH);
  AttentionBackward(dqkvf.data(), scratchf.data(), Rf.data(), qkvf.data(), attf.data(), B, T, C,
                    NH);
  EXPECT_LE(NormalizedError(outf, out), kFloatTol);
  EXPECT_LE(NormalizedError(attf, att), kFloatTol);
  EXPECT_LE(NormalizedError(dqkvf, dqkv), kFloatTol);
}

TEST_F(OpsTest, FloatMatchesDoubleClassifier) {
  const int N = 70, C = 16, V = 3001;
  auto x = RandomVec(size_t(N) * C, 38), wte = RandomVec(size_t(V) * C, 39, 0.5);
  std::vector<int32_t> targets(N);
  for (int n = 0; n < N; ++n) targets[n] = (n * 977) % V;
  std::vector<double> logits(size_t(N) * V), lse(N), losses(N), dx(x.size(), 0.0),
      dwte(wte.size(), 0.0), scratch(ClassifierBackwardScratch(N, C, V));
  std::vector<double> fs(ClassifierForwardScratch(N, V));
  std::vector<float> fsf(fs.size());
  const double loss = ClassifierForward(logits.data(), lse.data(), losses.data(), fs.data(),
                                        x.data(), wte.data(), targets.data(), N, C, V);
  ClassifierBackward(dx.data(), dwte.data(), scratch.data(), logits.data(), lse.data(), x.data(),
                     wte.data(), targets.data(), 1.0 / N, N, C, V);
  auto xf = ToFloat(x), wtef = ToFloat(wte);
  std::vector<float> logitsf(logits.size()), lsef(N), lossesf(N), dxf(x.size(), 0.0f),
      dwtef(wte.size(), 0.0f), scratchf(scratch.size());
  const float lossf = ClassifierForward(logitsf.data(), lsef.data(), lossesf.data(), fsf.data(),
                                        xf.data(), wtef.data(), targets.data(), N, C, V);
  ClassifierBackward(dxf.data(), dwtef.data(), scratchf.data(), logitsf.data(), lsef.data(),
                     xf.data(), wtef.data(), targets.data(), 1.0f / N, N, C, V);
  EXPECT_NEAR(lossf, loss, kFloatTol * loss);
  EXPECT_LE(NormalizedError(lossesf, losses), kFloatTol);
  EXPECT_LE(NormalizedError(dxf, dx), kFloatTol);
  EXPECT_LE(NormalizedError(dwtef, dwte), kFloatTol);
}

#if ATL_HAVE_AVX512
TEST_F(OpsTest, VectorExpAccuracy) {
  // Relative error of the AVX-512 exp against double exp over the range softmax and GELU use.
  double worst = 0;
  for (int i = 0; i < 200000; ++i) {
    const float x = -87.0f + 175.0f * float(i) / 200000.0f;
    alignas(64) float in[16], out[16];
    for (int l = 0; l < 16; ++l) in[l] = std::nextafter(x, 100.0f) + float(l) * 1e-4f;
    _mm512_store_ps(out, cpu::Exp16(_mm512_load_ps(in)));
    for (int l = 0; l < 16; ++l) {
      const double ref = std::exp(double(in[l]));
      worst = std::max(worst, std::abs(out[l] - ref) / ref);
    }
  }
  EXPECT_LE(worst, 3e-7);  // ~2.5 float ulp
  alignas(64) float in[16] = {-200.0f, -104.0f, 0.0f, 89.0f}, out[16];
  _mm512_store_ps(out, cpu::Exp16(_mm512_load_ps(in)));
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_TRUE(std::isfinite(out[3]));
}
#endif

// ---- GEMM tiling ------------------------------------------------------------------------------

TEST_F(OpsTest, ParallelGemmMatchesNaive) {
  for (int ta = 0; ta < 2; ++ta) {
    for (int tb = 0; tb < 2; ++tb) {
      const int M = 300, N = 270, K = 130;
      auto A = RandomVec(size_t(M) * K, 40), Bm = RandomVec(size_t(K) * N, 41);
      std::vector<double> Cm = RandomVec(size_t(M) * N, 42), ref = Cm;
      const int lda = ta ? M : K, ldb = tb ? K : N;
      cpu::ParallelGemm<double>(ta, tb, M, N, K, 0.5, A.data(), lda, Bm.data(), ldb, 2.0, Cm.data(),
                                N, cpu::GemmTiling{64, 96});
      for (int i = 0; i < M; ++i) {
        for (int j = 0; j < N; ++j) {
          double s = 0;
          for (int k = 0; k < K; ++k) {
            s += (ta ? A[size_t(k) * lda + i] : A[size_t(i) * lda + k]) *
                 (tb ? Bm[size_t(j) * ldb + k] : Bm[size_t(k) * ldb + j]);
          }
          ref[size_t(i) * N + j] = 0.5 * s + 2.0 * ref[size_t(i) * N + j];
        }
      }
      double worst = 0;
      for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(Cm[i] - ref[i]));
      EXPECT_LE(worst, 1e-11) << "trans_a " << ta << " trans_b " << tb;
    }
  }
}

// ---- OpenBLAS kernel family ---------------------------------------------------------------------

TEST_F(OpsTest, SetBlasCoreSwitchesAndGemmStaysCorrect) {
  const std::string before = InitBackend().blas_core;
  const int M = 67, N = 45, K = 33;
  const auto A = ToFloat(RandomVec(size_t(M) * K, 60)), Bm = ToFloat(RandomVec(size_t(K) * N, 61));
  // SkylakeX's kernels are AVX-512: on a CPU without it they die of an illegal instruction.
  __builtin_cpu_init();
  std::vector<const char*> cores = {"Haswell"};
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    cores.push_back("SkylakeX");
  for (const char* core : cores) {
    ASSERT_EQ(SetBlasCore(core), core);
    std::vector<float> Cm(size_t(M) * N);
    cpu::Gemm<float>(false, false, M, N, K, 1.0f, A.data(), K, Bm.data(), N, 0.0f, Cm.data(), N);
    for (int i = 0; i < M; ++i) {
      for (int j = 0; j < N; ++j) {
        double s = 0;
        for (int k = 0; k < K; ++k) s += double(A[size_t(i) * K + k]) * Bm[size_t(k) * N + j];
        ASSERT_NEAR(Cm[size_t(i) * N + j], s, 1e-4) << core;
      }
    }
  }
  SetBlasCore(before);
  EXPECT_EQ(InitBackend().blas_core, before);
}

// ---- Determinism across thread counts -------------------------------------------------------

TEST_F(OpsTest, DeterministicForThreadCounts) {
  const int B = 3, T = 100, C = 96, NH = 4, V = 5000, N = B * T;
  const auto x = ToFloat(RandomVec(size_t(N) * C, 50)), w = ToFloat(RandomVec(C, 51));
  const auto bias = ToFloat(RandomVec(C, 52)), wte = ToFloat(RandomVec(size_t(V) * C, 53, 0.3));
  const auto W = ToFloat(RandomVec(size_t(C) * 3 * C, 54, 0.1));
  const auto b3 = ToFloat(RandomVec(3 * C, 55)), R = ToFloat(RandomVec(size_t(N) * C, 56));
  std::vector<int32_t> tokens(N);
  for (int n = 0; n < N; ++n) tokens[n] = (n * 131) % V;
  ExpectSameForThreadCounts([&] {
    std::vector<float> out;
    auto append = [&](const std::vector<float>& v) { out.insert(out.end(), v.begin(), v.end()); };
    std::vector<float> ln(x.size()), m(N), r(N), qkv(size_t(N) * 3 * C), y(x.size()),
        att(size_t(B) * NH * T * T);
    LayerNormForward(ln.data(), m.data(), r.data(), x.data(), w.data(), bias.data(), N, C);
    MatmulForward(qkv.data(), ln.data(), W.data(), b3.data(), N, C, 3 * C);
    AttentionForward(y.data(), att.data(), qkv.data(), B, T, C, NH);
    std::vector<float> dqkv(qkv.size(), 0.0f), scratch(att.size()), dln(x.size(), 0.0f),
        dW(W.size(), 0.0f), db3(3 * C, 0.0f), dx(x.size(), 0.0f), dw(C, 0.0f), db(C, 0.0f);
    AttentionBackward(dqkv.data(), scratch.data(), R.data(), qkv.data(), att.data(), B, T, C, NH);
    MatmulBackward(dln.data(), dW.data(), db3.data(), dqkv.data(), ln.data(), W.data(), N, C,
                   3 * C);
    LayerNormBackward(dx.data(), dw.data(), db.data(), dln.data(), x.data(), w.data(), m.data(),
                      r.data(), N, C);
    std::vector<float> logits(size_t(N) * V), lse(N), losses(N), dy(y.size(), 0.0f),
        dwte(wte.size(), 0.0f), cs(ClassifierBackwardScratch(N, C, V));
    std::vector<float> fs(ClassifierForwardScratch(N, V));
    const float loss = ClassifierForward(logits.data(), lse.data(), losses.data(), fs.data(),
                                         y.data(), wte.data(), tokens.data(), N, C, V);
    ClassifierBackward(dy.data(), dwte.data(), cs.data(), logits.data(), lse.data(), y.data(),
                       wte.data(), tokens.data(), 1.0f / N, N, C, V);
    std::vector<float> dte(wte.size(), 0.0f), dpe(size_t(T) * C, 0.0f);
    EncoderBackward(dte.data(), dpe.data(), dx.data(), tokens.data(), B, T, C);
    for (const auto* v :
         {&y, &att, &dqkv, &dln, &dW, &db3, &dx, &dw, &db, &losses, &dy, &dwte, &dte, &dpe}) {
      append(*v);
    }
    out.push_back(loss);
    return out;
  });
}

}  // namespace
}  // namespace atl::kernels
