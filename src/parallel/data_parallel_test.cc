#include "parallel/data_parallel.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
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

// ---- Buckets over local layouts (tensor / pipeline parallel). ----

// The tensors of `cfg` that a rank holding blocks [lo, hi] (and the named extras) has, with
// offsets contiguous from 0 and global layer numbers.
std::vector<ParamTensor> Subset(const GPTConfig& cfg, bool wte, bool wpe, int lo, int hi,
                                bool ln_f) {
  std::vector<ParamTensor> out;
  size_t offset = 0;
  for (ParamTensor t : ParameterLayout(cfg)) {
    const bool keep = t.kind == ParamKind::kWte   ? wte
                      : t.kind == ParamKind::kWpe ? wpe
                      : t.layer < 0               ? ln_f
                                                  : t.layer >= lo && t.layer <= hi;
    if (!keep) continue;
    t.offset = offset;
    offset += t.numel;
    out.push_back(t);
  }
  return out;
}

size_t LayoutSize(const std::vector<ParamTensor>& layout) {
  return layout.empty() ? 0 : layout.back().offset + layout.back().numel;
}

GPTConfig Tiny() {
  return {.vocab_size = 64, .seq_len = 8, .n_layer = 3, .n_head = 2, .n_embd = 8};
}

TEST(GradBuckets, TheModelOverloadIsTheFullLayout) {
  const GPTConfig cfg = Small();
  for (double bytes : {1.0, 4000.0, 1e9})
    for (size_t elem : {sizeof(float), sizeof(int64_t)}) {
      const auto a = MakeGradBuckets(cfg, bytes, elem);
      const auto b = MakeGradBuckets(ParameterLayout(cfg), bytes, elem);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].begin, b[i].begin);
        EXPECT_EQ(a[i].end, b[i].end);
        EXPECT_EQ(a[i].ready_after, b[i].ready_after);
      }
    }
}

// A pipeline stage's layout: blocks 1..2 of 3 and ln_f, no embeddings. Buckets name global
// layers, ln_f rides with the top bucket, the final bucket (the lowest block) starts at 0.
TEST(GradBuckets, SubsetLayoutUsesGlobalLayersAndPutsLnfInTheTopBucket) {
  const GPTConfig cfg = Tiny();
  const auto layout = Subset(cfg, false, false, 1, 2, true);
  const size_t n = LayoutSize(layout);
  const size_t block =
      ParamOffset(cfg, ParamKind::kLn1W, 2) - ParamOffset(cfg, ParamKind::kLn1W, 1);
  const auto b = MakeGradBuckets(layout, 1.0);
  ASSERT_EQ(b.size(), 2u);
  EXPECT_EQ(b[0].begin, block);  // block 2 and ln_f
  EXPECT_EQ(b[0].end, n);
  EXPECT_EQ(n - block, block + 2 * size_t(cfg.n_embd));
  EXPECT_EQ(b[0].ready_after, 2);
  EXPECT_EQ(b[1].begin, 0u);  // block 1
  EXPECT_EQ(b[1].end, block);
  EXPECT_EQ(b[1].ready_after, -1);
  EXPECT_EQ(MakeGradBuckets(layout, 1e9).size(), 1u);

  // The first stage: wte and blocks 0..1, no wpe (as a stage may hold).
  const auto first = Subset(cfg, true, false, 0, 1, false);
  const size_t wte = size_t(cfg.vocab_size) * size_t(cfg.n_embd);
  const auto f = MakeGradBuckets(first, 1.0);
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].begin, wte + block);
  EXPECT_EQ(f[0].end, LayoutSize(first));
  EXPECT_EQ(f[0].ready_after, 1);
  EXPECT_EQ(f[1].begin, 0u);  // wte and block 0
  EXPECT_EQ(f[1].end, wte + block);
  EXPECT_EQ(f[1].ready_after, -1);

  // No blocks: one bucket.
  for (const auto& l :
       {Subset(cfg, true, true, 0, -1, false), Subset(cfg, false, false, 0, -1, true)}) {
    const auto one = MakeGradBuckets(l, 1.0);
    ASSERT_EQ(one.size(), 1u);
    EXPECT_EQ(one[0].begin, 0u);
    EXPECT_EQ(one[0].end, LayoutSize(l));
    EXPECT_EQ(one[0].ready_after, -1);
  }
}

// ---- ZeRO-1. ----

// A toy layout of odd sizes: wte, wpe, blocks 0..3 (block 2 has 2 elements: a bucket shorter than
// the number of ranks), ln_f.
std::vector<ParamTensor> Toy() {
  std::vector<ParamTensor> out;
  size_t offset = 0;
  auto add = [&](ParamKind kind, int layer, size_t numel) {
    out.push_back({fmt::format("t{}", out.size()), kind, layer, {int64_t(numel)}, offset, numel});
    offset += numel;
  };
  add(ParamKind::kWte, -1, 37);
  add(ParamKind::kWpe, -1, 11);
  add(ParamKind::kLn1W, 0, 13);
  add(ParamKind::kAttnW, 0, 7);
  add(ParamKind::kLn1W, 1, 29);
  add(ParamKind::kAttnW, 1, 3);
  add(ParamKind::kLn1W, 2, 2);
  add(ParamKind::kLn1W, 3, 5);
  add(ParamKind::kAttnW, 3, 17);
  add(ParamKind::kLnfW, -1, 9);
  add(ParamKind::kLnfB, -1, 9);
  return out;
}

struct ZeroCase {
  std::string name;
  std::vector<ParamTensor> layout;
  double bucket_mb;
};

std::vector<ZeroCase> ZeroCases() {
  const GPTConfig cfg = Tiny();
  return {
      {"toy, a bucket per block", Toy(), 1e-9},
      {"toy, one bucket", Toy(), 1e3},
      {"tiny model, a bucket per block", ParameterLayout(cfg), 1e-9},
      {"tiny model, 4 KiB buckets", ParameterLayout(cfg), 4e-3},
      {"blocks 1..2 + ln_f", Subset(cfg, false, false, 1, 2, true), 1e-9},
      {"wte + blocks 0..1, no wpe", Subset(cfg, true, false, 0, 1, false), 1e-9},
  };
}

// One step of reduction on every rank: micro_batches gradients per rank (all but the last added
// with Add in reproducible mode; normal mode sums them locally in order first), the last through
// the backward hook. Returns each rank's reducer state via `inspect`.
Status ReduceOnce(GradientReducer& r, const std::vector<std::vector<float>>& micro, int rank,
                  int per_rank, std::vector<float>& grads) {
  const size_t first = size_t(rank * per_rank);
  grads.assign(micro[first].size(), 0.0f);
  if (r.reproducible()) {
    r.BeginFixedPoint();
    for (int j = 1; j < per_rank; ++j) {
      grads = micro[first + size_t(j)];
      ATOLL_RETURN_IF_ERROR(r.Add(grads.data()));
    }
    grads = micro[first];
  } else {
    r.Begin();
    grads = micro[first];
    for (int j = 1; j < per_rank; ++j)
      for (size_t i = 0; i < grads.size(); ++i) grads[i] += micro[first + size_t(j)][i];
  }
  auto hook = r.Hook(grads.data());
  for (int l = 7; l >= 0; --l) hook(l);
  return r.Finish(grads.data());
}

// ZeRO on D = 1..4 ranks: the owned pieces partition the buffer; shard_grads is bitwise the
// all-reduce's sum on them (in-process sums are in rank order for both collectives), in the
// normal and the reproducible mode; AllGather and AllGatherInPlace rebuild the whole buffer.
TEST(GradientReducer, ZeroReduceScattersOwnedPiecesAndAllGathers) {
  for (const ZeroCase& zc : ZeroCases()) {
    const size_t n = LayoutSize(zc.layout);
    for (bool reproducible : {false, true}) {
      for (int D : {1, 2, 3, 4}) {
        SCOPED_TRACE(
            fmt::format("{}, {}, D = {}", zc.name, reproducible ? "reproducible" : "normal", D));
        const int per_rank = 2;
        const auto micro = MicroGrads(n, D * per_rank);
        std::vector<std::vector<OwnedRange>> owned(static_cast<size_t>(D));
        std::vector<std::vector<float>> full(static_cast<size_t>(D)), shard(owned.size()),
            gathered(owned.size()), in_place(owned.size());
        std::vector<size_t> num_buckets(owned.size());
        auto st = RunInProcessRanks(D, [&](Communicator& c) -> Status {
          const size_t rank = size_t(c.rank());
          const GradientReducer::Options base{.bucket_mb = zc.bucket_mb,
                                              .reproducible = reproducible,
                                              .micro_batches = D * per_rank};
          GradientReducer all(&c, zc.layout, base);
          GradientReducer::Options zo = base;
          zo.zero = true;
          GradientReducer z(&c, zc.layout, zo);
          if (z.size() != n || z.buckets().size() != all.buckets().size())
            return Status::Internal("sizes differ");
          num_buckets[rank] = z.buckets().size();
          std::vector<float> g;
          ATOLL_RETURN_IF_ERROR(ReduceOnce(all, micro, c.rank(), per_rank, g));
          full[rank] = g;
          ATOLL_RETURN_IF_ERROR(ReduceOnce(z, micro, c.rank(), per_rank, g));
          if (z.last_wait_s() < 0) return Status::Internal("last_wait_s");
          owned[rank] = z.owned();
          shard[rank].assign(z.shard_grads(), z.shard_grads() + z.shard_size());
          // AllGather from a shard buffer: the owned pieces of the all-reduced gradient.
          std::vector<float> local(n, -1.0f);
          ATOLL_RETURN_IF_ERROR(z.AllGather(local.data(), shard[rank].data()));
          gathered[rank] = local;
          // In place: this rank's pieces hold f(i) = i + 0.25, everything else garbage.
          local.assign(n, std::nanf(""));
          for (const OwnedRange& o : z.owned())
            for (size_t i = o.local_begin; i < o.local_begin + o.length; ++i)
              local[i] = float(i) + 0.25f;
          ATOLL_RETURN_IF_ERROR(z.AllGatherInPlace(local.data()));
          if (z.last_gather_s() < 0) return Status::Internal("last_gather_s");
          in_place[rank] = local;
          return Status::Ok();
        });
        for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();

        // The reference is the same on every rank.
        for (int r = 1; r < D; ++r)
          ASSERT_EQ(std::memcmp(full[0].data(), full[size_t(r)].data(), n * 4), 0);
        const std::vector<float>& want = full[0];
        std::vector<int> cover(n, 0);
        for (size_t r = 0; r < size_t(D); ++r) {
          // One piece per bucket, increasing, shard offsets consecutive from 0.
          ASSERT_EQ(owned[r].size(), num_buckets[r]);
          size_t shard_at = 0, local_at = 0;
          for (const OwnedRange& o : owned[r]) {
            EXPECT_EQ(o.shard_begin, shard_at);
            EXPECT_GE(o.local_begin, local_at);
            shard_at += o.length;
            local_at = o.local_begin + o.length;
            for (size_t k = 0; k < o.length; ++k) {
              ++cover[o.local_begin + k];
              ASSERT_EQ(std::memcmp(&shard[r][o.shard_begin + k], &want[o.local_begin + k], 4), 0)
                  << "rank " << r << " element " << o.local_begin + k;
            }
          }
          EXPECT_EQ(shard[r].size(), shard_at);
          EXPECT_EQ(std::memcmp(gathered[r].data(), want.data(), n * 4), 0) << "rank " << r;
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(in_place[r][i], float(i) + 0.25f) << i;
        }
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(cover[i], 1) << "element " << i;
        // With D ranks each bucket's pieces are ceil(len / D) long (the last ones shorter).
        if (D > 1) {
          const auto buckets =
              MakeGradBuckets(zc.layout, zc.bucket_mb * 1024 * 1024, reproducible ? 8 : 4);
          for (size_t r = 0; r < size_t(D); ++r)
            for (size_t i = 0; i < buckets.size(); ++i) {
              const GradBucket& b = buckets[i];
              const size_t p = (b.end - b.begin + size_t(D) - 1) / size_t(D);
              const OwnedRange& o = owned[r][buckets.size() - 1 - i];
              EXPECT_EQ(o.local_begin, std::min(b.end, b.begin + r * p));
              EXPECT_EQ(o.length, std::min(b.end, o.local_begin + p) - o.local_begin);
            }
        }
      }
    }
  }
}

// Reproducible ZeRO: the float gradient of every element is the same bits for any D (and the
// same as the reproducible all-reduce's, above).
TEST(GradientReducer, ReproducibleZeroIsTheSameBitsForAnyRankCount) {
  const auto layout = ParameterLayout(Tiny());
  const size_t n = LayoutSize(layout);
  const int k = 12;
  const auto micro = MicroGrads(n, k);
  std::vector<float> first;
  for (int D : {1, 2, 3, 4}) {
    std::vector<float> whole(n, std::nanf(""));
    auto st = RunInProcessRanks(D, [&](Communicator& c) -> Status {
      GradientReducer z(
          &c, layout, {.bucket_mb = 1e-9, .reproducible = true, .micro_batches = k, .zero = true});
      std::vector<float> g;
      ATOLL_RETURN_IF_ERROR(ReduceOnce(z, micro, c.rank(), k / D, g));
      // On D > 1 ranks the sum is only in shard_grads; grads are left zeroed.
      for (float x : g)
        if (D > 1 && x != 0.0f) return Status::Internal("reproducible ZeRO left gradients");
      // Each rank writes its own pieces (disjoint).
      for (const OwnedRange& o : z.owned())
        std::memcpy(whole.data() + o.local_begin, z.shard_grads() + o.shard_begin, o.length * 4);
      return Status::Ok();
    });
    for (auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
    if (first.empty()) {
      first = whole;
    } else {
      EXPECT_EQ(std::memcmp(first.data(), whole.data(), n * 4), 0) << "D = " << D;
    }
  }
}

// One replica (no communicator): owns everything, shard coordinates are local coordinates,
// shard_grads is the grads buffer, AllGather copies.
TEST(GradientReducer, ZeroWithoutCommunicatorOwnsEverything) {
  const auto layout = Toy();
  const size_t n = LayoutSize(layout);
  GradientReducer z(nullptr, layout, {.bucket_mb = 1e-9, .zero = true});
  ASSERT_EQ(z.shard_size(), n);
  ASSERT_EQ(z.owned().size(), z.buckets().size());
  size_t at = 0;
  for (const OwnedRange& o : z.owned()) {
    EXPECT_EQ(o.local_begin, at);
    EXPECT_EQ(o.shard_begin, at);
    at += o.length;
  }
  EXPECT_EQ(at, n);
  std::vector<float> g(n, 1.5f);
  z.Begin();
  ASSERT_TRUE(z.Finish(g.data()).ok());
  EXPECT_EQ(z.shard_grads(), g.data());
  std::vector<float> local(n, 0.0f);
  ASSERT_TRUE(z.AllGather(local.data(), g.data()).ok());
  EXPECT_EQ(local, g);
  ASSERT_TRUE(z.AllGatherInPlace(local.data()).ok());
  EXPECT_EQ(local, g);
}

// A communicator of GPU memory (NCCL's kind) sums in the normal mode only: the reproducible
// mode, ZeRO and the gradient checksums read the gradients on the host, and are refused.
TEST(GradientReducer, ACommunicatorOfDeviceMemoryTakesTheNormalModeOnly) {
  struct DeviceComm final : Communicator {
    int rank() const override { return 0; }
    int size() const override { return 2; }
    std::string label() const override { return "fake"; }
    bool device_memory() const override { return true; }
    CommHandle IAllReduce(void*, size_t, DType) override { return Done(); }
    CommHandle IReduceScatter(const void*, void*, size_t, DType) override { return Done(); }
    CommHandle IAllGather(const void*, void*, size_t, DType) override { return Done(); }
    CommHandle IBroadcast(void*, size_t, DType, int) override { return Done(); }
    CommHandle ISend(const void*, size_t, DType, int, int) override { return Done(); }
    CommHandle IRecv(void*, size_t, DType, int, int) override { return Done(); }
    CommHandle IBarrier() override { return Done(); }
    StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
      return Status::Internal("fake");
    }
    static CommHandle Done() { return CommHandle::Done(Status::Ok()); }
  } comm;
  const std::vector<ParamTensor> layout = ParameterLayout(Small());
  GradientReducer normal(&comm, layout, {});
  EXPECT_TRUE(normal.device_memory());
  GradChecksum sums(normal.size(), 64, normal.Cuts());
  EXPECT_THROW(normal.set_checksum(&sums), std::invalid_argument);
  EXPECT_THROW(GradientReducer(&comm, layout, {.reproducible = true}), std::invalid_argument);
  EXPECT_THROW(GradientReducer(&comm, layout, {.zero = true}), std::invalid_argument);
}

}  // namespace
}  // namespace atl
