// NormRanges counts every element of the whole model once across a tp x pp mesh; ExactSquareSum
// gives the same bits however the elements are split.
#include "parallel/grad_norm.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

namespace atl {
namespace {

TEST(GradNormTest, NormRangesCountEveryElementOnce) {
  GPTConfig cfg;
  cfg.vocab_size = 40;
  cfg.seq_len = 8;
  cfg.n_layer = 3;
  cfg.n_head = 4;
  cfg.n_embd = 16;
  const size_t n = NumParameters(cfg);
  EXPECT_EQ(NormRanges(cfg, {}), (std::vector<std::pair<size_t, size_t>>{{0, n}}));
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3}) {
      std::vector<int> count(n, 0);
      for (int stage = 0; stage < pp; ++stage) {
        for (int r = 0; r < tp; ++r) {
          const ModelShard shard{r, tp, stage * 3 / pp, (stage + 1) * 3 / pp};
          const auto layout = ShardLayout(cfg, shard);
          // Mark the whole-model elements of the counted local ranges.
          std::vector<float> local(layout.back().offset + layout.back().numel, 0.0f);
          for (const auto& [b, e] : NormRanges(cfg, shard))
            for (size_t i = b; i < e; ++i) local[i] = 1.0f;
          std::vector<float> whole(n, 0.0f);
          CopyShard(cfg, shard, whole.data(), local.data(), false);
          for (size_t i = 0; i < n; ++i) count[i] += int(whole[i]);
        }
      }
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(count[i], 1) << i << " tp " << tp << " pp " << pp;
    }
  }
}

TEST(GradNormTest, IntersectRanges) {
  using R = std::vector<std::pair<size_t, size_t>>;
  EXPECT_EQ(IntersectRanges(R{{0, 10}, {20, 30}}, R{{5, 25}}), (R{{5, 10}, {20, 25}}));
  EXPECT_EQ(IntersectRanges(R{{0, 10}}, R{{10, 20}}), R{});
  EXPECT_EQ(IntersectRanges(R{{0, 10}}, R{{3, 3}, {4, 6}}), (R{{4, 6}}));
}

// Sums of parts over any split (and any thread count) are the same integers; the value is within
// double rounding of the float64 sum.
TEST(GradNormTest, ExactSquareSumIsSplitIndependent) {
  std::mt19937 gen(5);
  std::normal_distribution<float> d(0.0f, 1e-2f);
  std::vector<float> g(300000);
  for (float& x : g) x = d(gen);
  g[7] = 300.0f;
  g[8] = 1e-30f;
  g[9] = 2e6f;  // near the limit of 2^21 (the old one was 2^11)
  g[10] = -4097.5f;
  // The reference: squares summed smallest first in long double (a 2e6 element's square is
  // 4e12, beside which double would drop the 1e-4 squares one by one).
  std::vector<long double> sq;
  for (float x : g) sq.push_back((long double)x * x);
  std::sort(sq.begin(), sq.end());
  long double acc = 0;
  for (long double q : sq) acc += q;
  const double ref = double(acc);
  ExactSquareSum whole;
  whole.Add(g.data(), g.size());
  const double v = ExactSquareSum::Value(whole.parts(), 1);
  EXPECT_NEAR(v, ref, 1e-14 * ref);
  for (size_t pieces : {2, 3, 7}) {
    std::vector<int64_t> summed(4, 0);
    for (size_t p = 0; p < pieces; ++p) {
      const size_t b = g.size() * p / pieces, e = g.size() * (p + 1) / pieces;
      ExactSquareSum part;
      part.Add(g.data() + b, (e - b) / 2);  // two Adds per piece
      part.Add(g.data() + b + (e - b) / 2, e - b - (e - b) / 2);
      const auto parts = part.parts();
      for (int i = 0; i < 4; ++i) summed[size_t(i)] += parts[size_t(i)];
    }
    EXPECT_EQ(ExactSquareSum::Value(summed, int(pieces)), v) << pieces;
  }
  // Out of range or NaN: the value is NaN (the trainer reports divergence).
  ExactSquareSum bad;
  const float big[] = {1.0f, 3e6f};
  bad.Add(big, 2);
  EXPECT_TRUE(std::isnan(ExactSquareSum::Value(bad.parts(), 1)));
  ExactSquareSum nan;
  const float nans[] = {NAN};
  nan.Add(nans, 1);
  EXPECT_TRUE(std::isnan(ExactSquareSum::Value(nan.parts(), 1)));
}

}  // namespace
}  // namespace atl
