// The outer step and the merge: PyTorch's Nesterov SGD, and the same bits as each operation
// rounded on its own (no fused multiply-add, whatever -march the build targets).
#include "train/strategies/outer.h"

#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <vector>

namespace atl {
namespace {

TEST(OuterNesterov, MatchesPyTorchSgdWithNesterov) {
  // torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True), grad d, two steps.
  std::vector<float> p = {1.0f, -2.0f}, m = {0.0f, 0.0f};
  const std::vector<float> d1 = {0.5f, 0.25f}, d2 = {-1.0f, 0.125f};
  OuterNesterov(p, d1, m, 0.7f, 0.9f);
  // buf = d1; p -= 0.7 * (d1 + 0.9 * buf) = 0.7 * 1.9 * d1
  EXPECT_FLOAT_EQ(m[0], 0.5f);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.7f * 1.9f * 0.5f);
  EXPECT_FLOAT_EQ(p[1], -2.0f - 0.7f * 1.9f * 0.25f);
  const float p0 = p[0];
  OuterNesterov(p, d2, m, 0.7f, 0.9f);
  const float buf = 0.9f * 0.5f + -1.0f;
  EXPECT_FLOAT_EQ(m[0], buf);
  EXPECT_FLOAT_EQ(p[0], p0 - 0.7f * (-1.0f + 0.9f * buf));
}

// Every operation rounded to float32 on its own: a volatile store cannot be fused with the next
// operation, so this is the reference on any compiler and flags.
float Mul(float a, float b) {
  volatile float r = a * b;
  return r;
}
float Add(float a, float b) {
  volatile float r = a + b;
  return r;
}
float Sub(float a, float b) {
  volatile float r = a - b;
  return r;
}

std::vector<float> Random(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b, size_t* first) {
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0) {
      *first = i;
      return false;
    }
  return true;
}

// With contraction, mu * m + d and g - lr * (...) become FMAs on a CPU that has them (one
// rounding instead of two) and the sites' global parameters would depend on the CPU the binary
// was built for. Over 100k random elements the two differ somewhere unless no FMA is used.
TEST(OuterNesterov, SameBitsAsEveryOperationRoundedOnItsOwn) {
  const size_t n = 100000;
  auto g = Random(n, 1, 1.0f), d = Random(n, 2, 1e-2f), m = Random(n, 3, 1e-2f);
  auto g_ref = g, m_ref = m;
  const float lr = 0.7f, mu = 0.9f;
  for (size_t i = 0; i < n; ++i) {
    const float mi = Add(Mul(mu, m_ref[i]), d[i]);
    m_ref[i] = mi;
    g_ref[i] = Sub(g_ref[i], Mul(lr, Add(d[i], Mul(mu, mi))));
  }
  OuterNesterov(g, d, m, lr, mu);
  size_t at = 0;
  EXPECT_TRUE(SameBits(m, m_ref, &at)) << "momentum differs at " << at;
  EXPECT_TRUE(SameBits(g, g_ref, &at))
      << "global differs at " << at << ": " << g[at] << " vs " << g_ref[at];
}

TEST(MergeLocal, SameBitsAsEveryOperationRoundedOnItsOwnAndAlphaZeroCopies) {
  const size_t n = 100000;
  auto local = Random(n, 4, 1.0f), global = Random(n, 5, 1.0f);
  auto ref = local;
  const float alpha = 0.3f, beta = 1.0f - alpha;
  for (size_t i = 0; i < n; ++i) ref[i] = Add(Mul(alpha, ref[i]), Mul(beta, global[i]));
  MergeLocal(local, global, alpha);
  size_t at = 0;
  EXPECT_TRUE(SameBits(local, ref, &at)) << "differs at " << at;
  MergeLocal(local, global, 0.0f);
  EXPECT_TRUE(SameBits(local, global, &at)) << "alpha 0 differs at " << at;
}

}  // namespace
}  // namespace atl
