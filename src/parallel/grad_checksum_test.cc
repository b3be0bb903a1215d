#include "parallel/grad_checksum.h"

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <cstring>
#include <vector>

#include "comm/inprocess.h"
#include "parallel/data_parallel.h"

namespace atl {
namespace {

GPTConfig Small() {
  return {.vocab_size = 64, .seq_len = 8, .n_layer = 4, .n_head = 2, .n_embd = 16};
}

// A gradient-like buffer: both signs, magnitudes over six decades, no zeros.
std::vector<float> Grads(size_t n, uint32_t seed) {
  std::vector<float> g(n);
  uint32_t x = seed;
  for (float& e : g) {
    x = x * 1664525u + 1013904223u;
    const float m = float((x >> 8) % 1000 + 1) * 1e-3f;
    e = ((x & 1) ? -m : m) * float(1 << (x % 6)) * 1e-4f;
  }
  return g;
}

float Flip(float v, int bit) {
  return std::bit_cast<float>(std::bit_cast<uint32_t>(v) ^ (1u << bit));
}

TEST(GradChecksum, SegmentsFollowTheChunksAndTheCuts) {
  const GradChecksum c(2500, 1024, {100, 3000, 2048, 100});
  // 0 100 1024 2048 2500: the duplicate and the cut beyond n are dropped.
  EXPECT_EQ(c.segments(), 4u);
  const GradChecksum empty(0, 1024, {});
  EXPECT_EQ(empty.segments(), 1u);
}

// One process: the gradient the optimizer reads is the one backward recorded; every exponent
// and sign flip of an ordinary element changes its segment's sum past the bound.
TEST(GradChecksum, OneReplicaFindsEveryExponentAndSignFlip) {
  const size_t n = 5000;
  std::vector<float> g = Grads(n, 7);
  GradChecksum c(n, 1024, {});
  c.Begin();
  c.Predict(g.data(), 0, n);
  GradChecksum::Mismatch clean;
  c.Check(g.data(), 0, n, 1, &clean);
  EXPECT_EQ(clean.count, 0);
  for (size_t i : {size_t(3), size_t(1500), size_t(4999)}) {
    for (int bit = 23; bit < 32; ++bit) {
      std::vector<float> x = g;
      x[i] = Flip(x[i], bit);
      GradChecksum::Mismatch mm;
      c.Check(x.data(), 0, n, 1, &mm);
      ASSERT_EQ(mm.count, 1) << "element " << i << " bit " << bit;
      EXPECT_LE(mm.begin, i);
      EXPECT_GT(mm.end, i);
    }
  }
  // A low mantissa bit moves the sum by less than the rounding bound: not seen (the limit).
  std::vector<float> x = g;
  x[10] = Flip(x[10], 0);
  GradChecksum::Mismatch low;
  c.Check(x.data(), 0, n, 1, &low);
  EXPECT_EQ(low.count, 0);
  // A part of the buffer, read from elsewhere (a ZeRO shard).
  GradChecksum::Mismatch part;
  x = g;
  x[2100] = Flip(x[2100], 30);
  c.Check(x.data() + 2048, 2048, n, 1, &part);
  EXPECT_EQ(part.count, 1);
  EXPECT_EQ(part.begin, 2048u);
}

// The reducer records each replica's part before its reduction starts and sums the records:
// a clean reduction passes (float and fixed-point sums, with and without ZeRO, 3 replicas), a
// flip of one replica's reduced gradient fails in that replica only.
TEST(GradChecksum, CarriedThroughTheReducerInEveryMode) {
  const GPTConfig cfg = Small();
  const size_t n = NumParameters(cfg);
  const int dp = 3;
  for (bool reproducible : {false, true}) {
    for (bool zero : {false, true}) {
      std::vector<int64_t> clean(dp, -1), flipped(dp, -1);
      auto st = RunInProcessRanks(dp, [&](Communicator& c) -> Status {
        GradientReducer r(
            &c, ParameterLayout(cfg),
            {.bucket_mb = 0.001, .reproducible = reproducible, .micro_batches = dp, .zero = zero});
        GradChecksum sums(n, 64, r.Cuts());
        r.set_checksum(&sums);
        std::vector<float> g = Grads(n, 100 + uint32_t(c.rank()));
        if (reproducible)
          r.BeginFixedPoint();
        else
          r.Begin();
        auto hook = r.Hook(g.data());
        for (int l = cfg.n_layer - 1; l >= 0; --l) hook(l);
        ATOLL_RETURN_IF_ERROR(r.Finish(g.data()));
        float* x = zero ? r.shard_grads() : g.data();
        auto check = [&]() {
          GradChecksum::Mismatch mm;
          if (!zero) {
            sums.Check(x, 0, n, dp, &mm);
          } else {
            for (const OwnedRange& o : r.owned())
              if (o.length > 0)
                sums.Check(x + o.shard_begin, o.local_begin, o.local_begin + o.length, dp, &mm);
          }
          return mm.count;
        };
        clean[size_t(c.rank())] = check();
        if (c.rank() == 1) x[5] = Flip(x[5], 27);
        flipped[size_t(c.rank())] = check();
        return Status::Ok();
      });
      for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
      for (int r = 0; r < dp; ++r) {
        EXPECT_EQ(clean[size_t(r)], 0) << "reproducible " << reproducible << " zero " << zero;
        EXPECT_EQ(flipped[size_t(r)], r == 1 ? 1 : 0)
            << "reproducible " << reproducible << " zero " << zero << " rank " << r;
      }
    }
  }
}

}  // namespace
}  // namespace atl
