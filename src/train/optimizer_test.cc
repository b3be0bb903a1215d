#include "train/optimizer.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/rng.h"
#include "train/schedule.h"

namespace atl {
namespace {

// A two-tensor layout: a 2x2 weight (decays) and a 2-element bias (does not).
std::vector<ParamTensor> WeightAndBias() {
  return {{"w", ParamKind::kAttnW, 0, {2, 2}, 0, 4}, {"b", ParamKind::kAttnB, 0, {2}, 4, 2}};
}

TEST(AdamW, FirstStepMatchesHandComputedValues) {
  // At t = 1 the bias-corrected moments are g and g^2, so the step is lr * g / (|g| + eps):
  //   weight: 1.0 * (1 - 0.1 * 0.1) - 0.1 * 0.5 / (0.5 + 1e-8)  = 0.890000002
  //   bias:   1.0                   - 0.1 * -2  / (2 + 1e-8)    = 1.1 (no decay)
  AdamW opt(WeightAndBias(), {.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1});
  std::vector<float> p = {1, 1, 1, 1, 1, 1};
  std::vector<float> g = {0.5f, 0.5f, 0.5f, 0.5f, -2.0f, -2.0f};
  opt.Step(p.data(), g.data(), 0.1, 1.0f);
  EXPECT_EQ(opt.step_count(), 1);
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(p[i], 0.890000002, 1e-7);
  for (int i = 4; i < 6; ++i) EXPECT_NEAR(p[i], 1.1, 1e-7);
  EXPECT_NEAR(opt.m()[0], 0.05, 1e-9);    // (1 - 0.9) * 0.5
  EXPECT_NEAR(opt.v()[0], 0.0125, 1e-9);  // (1 - 0.95) * 0.25
  EXPECT_NEAR(opt.m()[4], -0.2, 1e-8);
  EXPECT_NEAR(opt.v()[4], 0.2, 1e-8);
}

TEST(AdamW, SecondStepMatchesTheFormulaInDouble) {
  const double b1 = 0.9, b2 = 0.99, eps = 1e-6, wd = 0.05, lr = 0.01;
  AdamW opt(WeightAndBias(), {.beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd});
  std::vector<float> p = {0.5f, -0.25f, 2.0f, 0.0f, 0.75f, -1.0f};
  const std::vector<float> g1 = {0.1f, -0.2f, 0.3f, 0.0f, 1.5f, -0.01f};
  const std::vector<float> g2 = {-0.3f, 0.2f, 0.1f, 0.05f, 1.0f, 0.02f};
  std::vector<double> ref_p(p.begin(), p.end()), m(6, 0), v(6, 0);
  for (int t = 1; t <= 2; ++t) {
    const auto& g = t == 1 ? g1 : g2;
    for (int i = 0; i < 6; ++i) {
      if (i < 4) ref_p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g[i];
      v[i] = b2 * v[i] + (1 - b2) * double(g[i]) * g[i];
      const double mhat = m[i] / (1 - std::pow(b1, t)), vhat = v[i] / (1 - std::pow(b2, t));
      ref_p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
    opt.Step(p.data(), g.data(), lr, 1.0f);
  }
  for (int i = 0; i < 6; ++i) EXPECT_NEAR(p[i], ref_p[i], 2e-7) << i;
}

TEST(AdamW, GradScaleIsAppliedBeforeTheMoments) {
  AdamW a(WeightAndBias(), {}), b(WeightAndBias(), {});
  std::vector<float> pa(6, 1.0f), pb(6, 1.0f);
  std::vector<float> g = {1, 2, 3, 4, 5, 6}, half = {0.5f, 1, 1.5f, 2, 2.5f, 3};
  a.Step(pa.data(), g.data(), 0.01, 0.5f);
  b.Step(pb.data(), half.data(), 0.01, 1.0f);
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), 6 * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(a.m(), b.m(), 6 * sizeof(float)), 0);
}

TEST(AdamW, DecaysTwoDimensionalTensorsOnly) {
  GPTConfig cfg{.vocab_size = 10, .seq_len = 4, .n_layer = 1, .n_head = 1, .n_embd = 4};
  for (const auto& t : ParameterLayout(cfg)) {
    const bool bias_or_norm =
        t.name.find("bias") != std::string::npos || t.name.find("ln_") != std::string::npos;
    EXPECT_EQ(DecaysWeight(t), !bias_or_norm) << t.name;
  }
  // With zero gradients only decay moves parameters.
  auto layout = ParameterLayout(cfg);
  const size_t n = NumParameters(cfg);
  AdamW opt(layout, {.weight_decay = 0.5});
  std::vector<float> p(n, 1.0f), g(n, 0.0f);
  opt.Step(p.data(), g.data(), 0.1, 1.0f);
  for (const auto& t : layout) {
    EXPECT_FLOAT_EQ(p[t.offset], DecaysWeight(t) ? 0.95f : 1.0f) << t.name;
  }
}

// Random buffers of a size that is not a multiple of the chunk.
std::vector<float> RandomVector(size_t n, uint64_t seed) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = RandomNormal(seed, 0, RngPurpose::kTest, i);
  return x;
}

TEST(AdamW, SameBitsForOneAndTwoThreads) {
  GPTConfig cfg{.vocab_size = 1000, .seq_len = 32, .n_layer = 2, .n_head = 2, .n_embd = 64};
  const auto layout = ParameterLayout(cfg);
  const size_t n = NumParameters(cfg);
  std::vector<float> results[2];
  double norms[2];
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    AdamW opt(layout, {});
    std::vector<float> p = RandomVector(n, 1);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> g = RandomVector(n, 10 + step);
      norms[threads - 1] = GradNorm(g.data(), n);
      opt.Step(p.data(), g.data(), 1e-3, ClipScale(norms[threads - 1], 1.0));
    }
    results[threads - 1] = p;
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(norms[0], norms[1]);
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), n * sizeof(float)), 0);
}

TEST(GradNorm, MatchesNaiveSumAndIsThreadCountIndependent) {
  const size_t n = 100003;
  std::vector<float> g = RandomVector(n, 3);
  long double naive = 0;
  for (float x : g) naive += (long double)x * x;
  omp_set_num_threads(1);
  const double one = GradNorm(g.data(), n);
  omp_set_num_threads(2);
  const double two = GradNorm(g.data(), n);
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(one, two);
  EXPECT_NEAR(one, std::sqrt(double(naive)), 1e-9 * one);
  const float three_four[] = {3.0f, 4.0f};
  EXPECT_EQ(GradNorm(three_four, 2), 5.0);
  EXPECT_EQ(GradNorm(nullptr, 0), 0.0);
}

TEST(GradNorm, IsTheRootOfGradSquaredSumBitwise) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{16384}, size_t{100003}}) {
    std::vector<float> g = RandomVector(n, 5);
    EXPECT_EQ(GradNorm(g.data(), n), std::sqrt(GradSquaredSum(g.data(), n))) << n;
  }
  const float three_four[] = {3.0f, 4.0f};
  EXPECT_EQ(GradSquaredSum(three_four, 2), 25.0);
}

// Shards of [0, n): cut at `cuts` (sorted, inside (0, n)), piece j goes to shard j % shards, and
// each shard lists its pieces in increasing order (as ZeRO's buckets do) or, with `reversed`, in
// decreasing order (state order unlike local order).
std::vector<std::vector<AdamW::OwnedRange>> Shards(size_t n, std::vector<size_t> cuts, int shards,
                                                   bool reversed) {
  cuts.insert(cuts.begin(), 0);
  cuts.push_back(n);
  std::vector<std::vector<AdamW::OwnedRange>> out(static_cast<size_t>(shards));
  for (size_t j = 0; j + 1 < cuts.size(); ++j)
    out[j % size_t(shards)].push_back({cuts[j], cuts[j + 1] - cuts[j]});
  if (reversed)
    for (auto& o : out) std::reverse(o.begin(), o.end());
  return out;
}

// A sharded AdamW gives every parameter and moment bitwise the unsharded value, whatever the
// split: cuts anywhere inside tensors, at decay / no-decay boundaries and one element off them,
// empty pieces, several pieces per shard in either order, and any thread count.
TEST(AdamW, ShardedMatchesUnshardedBitwise) {
  GPTConfig cfg{.vocab_size = 1000, .seq_len = 32, .n_layer = 2, .n_head = 2, .n_embd = 64};
  const auto layout = ParameterLayout(cfg);
  const size_t n = NumParameters(cfg);
  const AdamW::Hyper hyper{.beta1 = 0.9, .beta2 = 0.95, .eps = 1e-8, .weight_decay = 0.1};
  // Decay boundaries: where a 2-D tensor meets a 1-D one.
  std::vector<size_t> boundaries;
  for (size_t i = 1; i < layout.size(); ++i)
    if (DecaysWeight(layout[i]) != DecaysWeight(layout[i - 1]))
      boundaries.push_back(layout[i].offset);
  ASSERT_GT(boundaries.size(), 4u);
  const int steps = 3;
  std::vector<std::vector<float>> grads;
  for (int s = 0; s < steps; ++s) grads.push_back(RandomVector(n, 20 + s));
  const std::vector<float> init = RandomVector(n, 2);

  AdamW whole(layout, hyper);
  std::vector<float> want = init;
  for (int s = 0; s < steps; ++s)
    whole.Step(want.data(), grads[size_t(s)].data(), 1e-2 * (s + 1), s == 1 ? 0.5f : 1.0f);

  uint32_t x = 7;
  for (int shards : {1, 2, 3, 5}) {
    for (bool reversed : {false, true}) {
      // Random cuts, decay boundaries and their neighbours, and a repeated cut (an empty piece).
      std::vector<size_t> cuts;
      for (int j = 0; j < 4 * shards; ++j) {
        x = x * 1664525u + 1013904223u;
        cuts.push_back(1 + x % (n - 1));
      }
      for (size_t j = 0; j < boundaries.size(); j += 2) {
        cuts.push_back(boundaries[j]);
        cuts.push_back(boundaries[j + 1 < boundaries.size() ? j + 1 : j] + 1);
        cuts.push_back(boundaries[j] - 1);
      }
      cuts.push_back(cuts.front());
      std::sort(cuts.begin(), cuts.end());
      const auto owned = Shards(n, cuts, shards, reversed);
      const int threads = shards % 2 + 1;
      omp_set_num_threads(threads);
      std::vector<float> got = init, m(n, 0.0f), v(n, 0.0f);
      size_t owned_total = 0;
      for (const auto& o : owned) {
        AdamW opt(layout, hyper, o);
        size_t total = 0;
        for (const auto& [b, len] : o) total += len;
        ASSERT_EQ(opt.size(), total);
        owned_total += total;
        std::vector<float> g(total);
        for (int s = 0; s < steps; ++s) {
          size_t k = 0;
          for (const auto& [b, len] : o)
            for (size_t i = 0; i < len; ++i) g[k++] = grads[size_t(s)][b + i];
          opt.Step(got.data(), g.data(), 1e-2 * (s + 1), s == 1 ? 0.5f : 1.0f);
        }
        size_t k = 0;
        for (const auto& [b, len] : o)
          for (size_t i = 0; i < len; ++i, ++k) {
            m[b + i] = opt.m()[k];
            v[b + i] = opt.v()[k];
          }
      }
      omp_set_num_threads(omp_get_num_procs());
      ASSERT_EQ(owned_total, n);
      EXPECT_EQ(std::memcmp(got.data(), want.data(), n * sizeof(float)), 0)
          << shards << " shards, reversed " << reversed;
      EXPECT_EQ(std::memcmp(m.data(), whole.m(), n * sizeof(float)), 0) << shards;
      EXPECT_EQ(std::memcmp(v.data(), whole.v(), n * sizeof(float)), 0) << shards;
    }
  }
}

// What the step guard reads: the update's squares per tensor, summed inside the update's pass,
// equal what the parameters moved (float accumulation: to 1e-5), the same bits for any thread
// count, and split between shards as their elements are.
TEST(AdamW, UpdateSquaresAreWhatTheStepMovedPerTensor) {
  GPTConfig cfg{.vocab_size = 1000, .seq_len = 32, .n_layer = 2, .n_head = 2, .n_embd = 64};
  const auto layout = ParameterLayout(cfg);
  const size_t n = NumParameters(cfg);
  const std::vector<float> init = RandomVector(n, 3), g = RandomVector(n, 4);
  std::vector<std::vector<double>> by_threads;
  for (int threads : {1, 2}) {
    omp_set_num_threads(threads);
    AdamW opt(layout, {});
    std::vector<float> p = init;
    opt.Step(p.data(), g.data(), 1e-2, 1.0f);
    ASSERT_EQ(opt.update_squares().size(), layout.size());
    for (size_t t = 0; t < layout.size(); ++t) {
      double want = 0;
      for (size_t i = layout[t].offset; i < layout[t].offset + layout[t].numel; ++i)
        want += (double(p[i]) - double(init[i])) * (double(p[i]) - double(init[i]));
      ASSERT_GT(want, 0);
      EXPECT_NEAR(opt.update_squares()[t], want, 1e-5 * want) << layout[t].name;
      EXPECT_EQ(opt.owned_numel()[t], layout[t].numel);
    }
    by_threads.push_back(opt.update_squares());
  }
  omp_set_num_threads(omp_get_num_procs());
  EXPECT_EQ(by_threads[0], by_threads[1]);
  // Two shards cut inside a tensor: each sums its own elements.
  const size_t cut = layout[3].offset + layout[3].numel / 3;
  AdamW a(layout, {}, {{0, cut}}), b(layout, {}, {{cut, n - cut}});
  std::vector<float> p = init;
  a.Step(p.data(), g.data(), 1e-2, 1.0f);
  b.Step(p.data(), g.data() + cut, 1e-2, 1.0f);
  for (size_t t = 0; t < layout.size(); ++t) {
    EXPECT_EQ(a.owned_numel()[t] + b.owned_numel()[t], layout[t].numel);
    const double sum = a.update_squares()[t] + b.update_squares()[t];
    EXPECT_NEAR(sum, by_threads[0][t], 1e-5 * by_threads[0][t]) << layout[t].name;
  }
  EXPECT_GT(a.owned_numel()[3], 0u);
  EXPECT_GT(b.owned_numel()[3], 0u);
}

// A shard touches only the parameters it owns, and decides decay by the tensor of each element.
TEST(AdamW, ShardUpdatesOnlyItsRangesWithTheirTensorsDecay) {
  // w: 2x2 at 0..4 (decays), b: 2 at 4..6 (does not). Own [3, 5) and [0, 1), in that order.
  AdamW opt(WeightAndBias(), {.weight_decay = 0.5}, {{3, 2}, {0, 1}});
  ASSERT_EQ(opt.size(), 3u);
  std::vector<float> p(6, 1.0f);
  const std::vector<float> g(3, 0.0f);  // state coordinates; zero: only decay moves parameters
  opt.Step(p.data(), g.data(), 0.1, 1.0f);
  EXPECT_EQ(p, (std::vector<float>{0.95f, 1, 1, 0.95f, 1, 1}));
  // Nothing owned: nothing changes.
  AdamW none(WeightAndBias(), {.weight_decay = 0.5}, {{2, 0}});
  EXPECT_EQ(none.size(), 0u);
  none.Step(p.data(), nullptr, 0.1, 1.0f);
  EXPECT_EQ(p, (std::vector<float>{0.95f, 1, 1, 0.95f, 1, 1}));
}

TEST(ClipScale, ScalesOnlyAboveTheThreshold) {
  EXPECT_EQ(ClipScale(0.5, 1.0), 1.0f);
  EXPECT_EQ(ClipScale(1.0, 1.0), 1.0f);
  EXPECT_FLOAT_EQ(ClipScale(4.0, 1.0), float(1.0 / (4.0 + 1e-6)));
  EXPECT_EQ(ClipScale(1e9, 0.0), 1.0f);  // 0 disables
  // Clipped gradients have norm max_norm (to float rounding).
  std::vector<float> g = {30.0f, 40.0f};
  const float s = ClipScale(GradNorm(g.data(), 2), 2.0);
  for (float& x : g) x *= s;
  EXPECT_NEAR(GradNorm(g.data(), 2), 2.0, 1e-6);
}

TEST(LearningRate, WarmupThenCosineToMinAtTheLastStep) {
  TrainConfig t;
  t.steps = 100;
  t.warmup_steps = 10;
  t.lr = 1.0;
  t.min_lr = 0.1;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 0.1);  // (0 + 1) / 10
  EXPECT_DOUBLE_EQ(LearningRate(t, 4), 0.5);
  EXPECT_DOUBLE_EQ(LearningRate(t, 9), 1.0);   // warmup reaches the peak
  EXPECT_DOUBLE_EQ(LearningRate(t, 10), 1.0);  // cosine starts at the peak
  EXPECT_EQ(LearningRate(t, 99), 0.1);         // and ends exactly at min_lr
  // Halfway through the decay: (lr + min_lr) / 2.
  t.steps = 21;  // decay over steps 10..20
  EXPECT_NEAR(LearningRate(t, 15), 0.55, 1e-15);
  t.steps = 100;
  for (int64_t s = 10; s < 99; ++s) EXPECT_GT(LearningRate(t, s), LearningRate(t, s + 1)) << s;
  t.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1.0);
  t.steps = 1;
  EXPECT_DOUBLE_EQ(LearningRate(t, 0), 1.0);
}

}  // namespace
}  // namespace atl
