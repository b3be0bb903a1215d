#include "train/sampling.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace atl {
namespace {

TEST(SampleToken, GreedyPicksTheArgmaxAndBreaksTiesByLowerId) {
  const float logits[] = {0.1f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(SampleToken(logits, 4, 0.0, 0, 0.99), 1);
  EXPECT_EQ(SampleToken(logits, 4, 1.0, 1, 0.99), 1);
}

TEST(SampleToken, TopKNeverLeavesTheTopK) {
  const float logits[] = {5.0f, 4.0f, 3.0f, 2.0f, 1.0f};
  for (int i = 0; i < 1000; ++i) {
    const int t = SampleToken(logits, 5, 10.0, 2, SamplingUniform(1, uint64_t(i)));
    EXPECT_TRUE(t == 0 || t == 1) << t;
  }
}

TEST(SampleToken, FrequenciesFollowTheSoftmax) {
  const float logits[] = {0.0f, std::log(2.0f), std::log(5.0f)};  // p = 1/8, 2/8, 5/8
  int counts[3] = {0, 0, 0};
  const int n = 40000;
  for (int i = 0; i < n; ++i)
    ++counts[SampleToken(logits, 3, 1.0, 0, SamplingUniform(7, uint64_t(i)))];
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 8, 0.01);
  EXPECT_NEAR(counts[1] / double(n), 2.0 / 8, 0.01);
  EXPECT_NEAR(counts[2] / double(n), 5.0 / 8, 0.01);
  // Temperature 0.5 squares the odds: 1 : 4 : 25.
  int hot[3] = {0, 0, 0};
  for (int i = 0; i < n; ++i)
    ++hot[SampleToken(logits, 3, 0.5, 0, SamplingUniform(8, uint64_t(i)))];
  EXPECT_NEAR(hot[2] / double(n), 25.0 / 30, 0.01);
}

TEST(SamplingUniform, IsInRangeAndAPureFunction) {
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = SamplingUniform(3, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ASSERT_EQ(u, SamplingUniform(3, i));
  }
  EXPECT_NE(SamplingUniform(3, 0), SamplingUniform(4, 0));
}

TEST(Generate, IsDeterministicAndRespectsTheContextLength) {
  GPTConfig cfg{.vocab_size = 32, .seq_len = 8, .n_layer = 1, .n_head = 2, .n_embd = 8};
  GPT<float> model(cfg, 1);
  model.InitParameters(5);
  SamplingOptions o;
  o.max_new_tokens = 20;  // more than seq_len: the context slides
  o.seed = 11;
  const std::vector<int> a = Generate(model, {1, 2, 3}, o);
  const std::vector<int> b = Generate(model, {1, 2, 3}, o);
  ASSERT_EQ(a.size(), 20u);
  EXPECT_EQ(a, b);
  for (int t : a) {
    EXPECT_GE(t, 0);
    EXPECT_LT(t, 32);
  }
  o.seed = 12;
  EXPECT_NE(Generate(model, {1, 2, 3}, o), a);
  // A stop token ends generation before it.
  o.seed = 11;
  o.stop_token = a[5];
  const std::vector<int> stopped = Generate(model, {1, 2, 3}, o);
  EXPECT_LE(stopped.size(), 5u);
}

}  // namespace
}  // namespace atl
