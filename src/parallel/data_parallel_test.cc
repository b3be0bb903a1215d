#include "parallel/data_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "comm/inprocess.h"

namespace atl {
namespace {

GPTConfig Small() {
  return {.vocab_size = 64, .seq_len = 8, .n_layer = 4, .n_head = 2, .n_embd = 16};
}

TEST(GradBuckets, CoverTheBufferFromTheEndInWholeBlocks) {
  const GPTConfig cfg = Small();
  const size_t n = NumParameters(cfg);
  for (double bytes : {1.0, 4000.0, 1e9}) {
    auto b = MakeGradBuckets(cfg, bytes);
    ASSERT_FALSE(b.empty());
    EXPECT_EQ(b.front().end, n);
    EXPECT_EQ(b.back().begin, 0u);
    EXPECT_EQ(b.back().ready_after, -1);  // wte, wpe: only after Backward
    for (size_t i = 1; i < b.size(); ++i) {
      EXPECT_EQ(b[i].end, b[i - 1].begin);
      EXPECT_LT(b[i].ready_after, b[i - 1].ready_after);
      if (b[i].ready_after >= 0) {
        EXPECT_EQ(b[i].begin, ParamOffset(cfg, ParamKind::kLn1W, b[i].ready_after));
      }
    }
  }
  EXPECT_EQ(MakeGradBuckets(cfg, 1.0).size(), size_t(cfg.n_layer));  // one per block, 0 + emb
  EXPECT_EQ(MakeGradBuckets(cfg, 1e9).size(), 1u);
}

// Per-micro-batch "gradients": varied magnitudes, both signs.
std::vector<std::vector<float>> MicroGrads(size_t n, int k) {
  std::vector<std::vector<float>> g(static_cast<size_t>(k), std::vector<float>(n));
  uint32_t x = 12345;
  for (auto& v : g)
    for (auto& e : v) {
      x = x * 1664525u + 1013904223u;
      e = (float(int32_t(x)) / 2147483648.0f) * float(1 << (x % 20)) * 1e-4f;
    }
  return g;
}

// Reproducible reduction: the same bits whichever replica holds which micro-batch.
TEST(GradientReducer, ReproducibleSumIsTheSameBitsForAnySplit) {
  const GPTConfig cfg = Small();
  const size_t n = NumParameters(cfg);
  const int k = 4;
  const auto g = MicroGrads(n, k);
  std::vector<std::vector<float>> results;
  for (int dp : {1, 2, 4}) {
    std::vector<std::vector<float>> out(static_cast<size_t>(dp), std::vector<float>(n));
    auto st = RunInProcessRanks(dp, [&](Communicator& c) -> Status {
      GradientReducer r(&c, cfg, /*bucket_mb=*/0.001, /*reproducible=*/true, k);
      r.BeginFixedPoint();
      // Reverse order inside a replica, to show the order does not matter.
      // The last micro-batch goes through the backward hook, as in the trainer.
      std::vector<float> buf;
      for (int j = k / dp - 1; j >= 1; --j) {
        buf = g[size_t(c.rank() * (k / dp) + j)];
        ATOLL_RETURN_IF_ERROR(r.Add(buf.data()));
        for (float x : buf)
          if (x != 0.0f) return Status::Internal("Add did not zero the gradients");
      }
      buf = g[size_t(c.rank() * (k / dp))];
      auto hook = r.Hook(buf.data());
      for (int l = cfg.n_layer - 1; l >= 0; --l) hook(l);
      ATOLL_RETURN_IF_ERROR(r.Finish(buf.data()));
      out[size_t(c.rank())] = buf;
      return Status::Ok();
    });
    for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
    for (int r = 1; r < dp; ++r)
      EXPECT_EQ(std::memcmp(out[0].data(), out[size_t(r)].data(), n * 4), 0);
    results.push_back(out[0]);
  }
  EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(results[0].data(), results[2].data(), n * 4), 0);
  for (size_t i = 0; i < n; ++i) {
    double sum = 0;
    for (int j = 0; j < k; ++j) sum += g[size_t(j)][i];
    EXPECT_NEAR(results[0][i], sum, 1e-6 * std::fabs(sum) + 1e-11);
  }
}

TEST(GradientReducer, ReproducibleRefusesValuesOutOfRange) {
  const GPTConfig cfg = Small();
  GradientReducer r(nullptr, cfg, 4.0, true, 1);
  r.BeginFixedPoint();
  std::vector<float> g(NumParameters(cfg), 0.0f);
  g[7] = 1e7f;
  const Status s = r.Add(g.data());
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("fixed-point range"), std::string::npos) << s.ToString();
  g[7] = std::nanf("");
  EXPECT_FALSE(r.Add(g.data()).ok());
}

// Normal mode through the backward hook: buckets start as their blocks finish; the result is
// the sum over replicas.
TEST(GradientReducer, HookAndFinishSumOverReplicas) {
  const GPTConfig cfg = Small();
  const size_t n = NumParameters(cfg);
  std::vector<std::vector<float>> grads(2, std::vector<float>(n));
  for (size_t i = 0; i < n; ++i) {
    grads[0][i] = float(i % 97);
    grads[1][i] = float(i % 13) * 0.5f;
  }
  auto st = RunInProcessRanks(2, [&](Communicator& c) -> Status {
    GradientReducer r(&c, cfg, 0.001, false, 2);
    float* g = grads[size_t(c.rank())].data();
    r.Begin();
    auto hook = r.Hook(g);
    for (int l = cfg.n_layer - 1; l >= 0; --l) hook(l);
    return r.Finish(g);
  });
  for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  for (size_t i = 0; i < n; ++i) {
    const float want = float(i % 97) + float(i % 13) * 0.5f;
    ASSERT_EQ(grads[0][i], want) << i;
    ASSERT_EQ(grads[1][i], want) << i;
  }
}

}  // namespace
}  // namespace atl
