// The live-site exchange when things go wrong, on purpose: a site dying in the middle (redone over
// the survivors), below the quorum (nothing changes), a corrupt piece (retried, committed alike),
// a site whose part keeps failing (committed nowhere), sites that disagree on the result
// (kCorruption everywhere).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>

#include "core/hash.h"
#include "core/log.h"
#include "world/exchange.h"
#include "world/exchange_test_world.h"
#include "world/wan.h"

namespace atl {
namespace {

using namespace testing_exchange;  // NOLINT: the shared test world

// A Communicator that forwards every call to another: what the fault-injecting communicators
// below override a part of.
class ForwardingComm : public Communicator {
 public:
  explicit ForwardingComm(Communicator* inner) : inner_(inner) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string label() const override { return inner_->label(); }
  CommHandle IAllReduce(void* d, size_t c, DType t) override { return inner_->IAllReduce(d, c, t); }
  CommHandle IReduceScatter(const void* s, void* r, size_t c, DType t) override {
    return inner_->IReduceScatter(s, r, c, t);
  }
  CommHandle IAllGather(const void* s, void* r, size_t c, DType t) override {
    return inner_->IAllGather(s, r, c, t);
  }
  CommHandle IBroadcast(void* d, size_t c, DType t, int root) override {
    return inner_->IBroadcast(d, c, t, root);
  }
  CommHandle IBarrier() override { return inner_->IBarrier(); }
  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
    return Status::Internal("no split");
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override {
    return inner_->ISend(data, count, dtype, dest, tag);
  }
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    return inner_->IRecv(data, count, dtype, source, tag);
  }

 protected:
  Communicator* inner_;
};

// A Communicator that forwards to another until the first operation whose tag differs from the
// first one's (the all-gather, after the reduce-scatter): then the site "dies" (on_death runs
// once) and every later send and receive fails.
class DyingComm final : public ForwardingComm {
 public:
  DyingComm(Communicator* inner, std::function<void()> on_death)
      : ForwardingComm(inner), on_death_(std::move(on_death)) {}
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override {
    if (Dies(tag)) return Dead();
    return inner_->ISend(data, count, dtype, dest, tag);
  }
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    if (Dies(tag)) return Dead();
    return inner_->IRecv(data, count, dtype, source, tag);
  }

 private:
  bool Dies(int tag) {
    if (first_tag_ < 0) first_tag_ = tag;
    if (tag != first_tag_ && !dead_) {
      dead_ = true;
      on_death_();
    }
    return dead_;
  }
  CommHandle Dead() { return CommHandle::Done(Status::Unavailable("this site died")); }

  std::function<void()> on_death_;
  int first_tag_ = -1;
  bool dead_ = false;
};

// A Communicator that forwards to another but spoils the magic of the first message it sends to
// site `victim` (the reduce-scatter piece), as a corrupt link would.
class CorruptingComm final : public ForwardingComm {
 public:
  CorruptingComm(Communicator* inner, int victim) : ForwardingComm(inner), victim_(victim) {}
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override {
    if (dest == victim_ && !done_) {
      done_ = true;
      spoiled_.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + count);
      spoiled_[0] ^= 0xFF;
      return inner_->ISend(spoiled_.data(), count, dtype, dest, tag);
    }
    return inner_->ISend(data, count, dtype, dest, tag);
  }

 private:
  int victim_;
  bool done_ = false;
  std::vector<uint8_t> spoiled_;
};

// A Communicator whose receives of all-gather messages from `source` fail: the first `times`
// (-1: every time, so this site can never complete its part of an exchange).
class DeafComm final : public ForwardingComm {
 public:
  DeafComm(Communicator* inner, int source, int times = -1)
      : ForwardingComm(inner), source_(source), left_(times) {}
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    if (source == source_ && (tag & 1) == 1 && left_ != 0) {  // exchange.cc: phase 1 all-gather
      if (left_ > 0) --left_;
      return CommHandle::Done(Status::Unavailable("this receive fails on purpose"));
    }
    return inner_->IRecv(data, count, dtype, source, tag);
  }

 private:
  int source_;
  int left_;
};

TEST(Exchange, ASiteDyingMidExchangeIsRedoneOverTheSurvivors) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  const size_t n = 40009;
  const int64_t round = 5;
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4);
  for (int s = 0; s < 4; ++s) residual[s] = Input(10 + s, n, 0.01f);
  auto ref_residual = residual;
  DyingComm dying(w.comms[3].get(), [&] { rounds.Kill(3); });
  auto out = RunAll(w, rounds, {0, 1, 2, 3}, Codec::kInt4, 3, round, data, residual, {{3, &dying}},
                    [&](int s) {
                      if (s == 3) w.Drop(3);  // its endpoint vanishes
                    });
  const std::vector<int> live{0, 1, 2};
  auto expect = Reference(Codec::kInt4, live, inputs, &ref_residual);
  const int64_t base = kRoundsPerExchange * round;
  for (int s : live) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
    // The residual was restored before the redo: as if only the second attempt had run.
    EXPECT_TRUE(SameBits(residual[s], ref_residual[s])) << "site " << s;
    EXPECT_EQ(out[s].result.sites, live);
    EXPECT_EQ(out[s].result.attempts, 2);
    EXPECT_EQ(rounds.calls(s), (std::vector<int64_t>{base, base + 1, base + 2, base + 3}));
  }
  EXPECT_EQ(out[3].status.code(), StatusCode::kUnavailable) << out[3].status.ToString();
  EXPECT_EQ(rounds.calls(3), (std::vector<int64_t>{base, base + 1}));
}

// A death that leaves too few sites for the redo: the call fails and leaves data and residual
// exactly as they were (the failed attempt wrote neither).
TEST(Exchange, ADeathBelowTheQuorumLeavesDataAndResidualAlone) {
  World w(3);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(3);
  const size_t n = 10007;
  auto inputs = Inputs(3, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(3);
  for (int s = 0; s < 3; ++s) residual[s] = Input(20 + s, n, 0.01f);
  const auto residual0 = residual;
  DyingComm dying(w.comms[2].get(), [&] { rounds.Kill(2); });
  auto out =
      RunAll(w, rounds, {0, 1, 2}, Codec::kInt8, 3, 2, data, residual, {{2, &dying}}, [&](int s) {
        if (s == 2) w.Drop(2);
      });
  for (int s : {0, 1}) {
    EXPECT_EQ(out[s].status.code(), StatusCode::kUnavailable) << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("quorum of 3"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], inputs[s])) << "site " << s;
    EXPECT_TRUE(SameBits(residual[s], residual0[s])) << "site " << s;
  }
}

// Site 1's piece for site 0 arrives corrupt once while every site stays live: site 0 cannot
// average its piece and tells the others so (its all-gather message); site 0 votes failure in
// the commit round, so no site commits that attempt, and all of them redo it. The second attempt
// succeeds: every site commits the same bits, after 2 attempts.
TEST(Exchange, ACorruptPieceIsRetriedAndEverySiteCommitsTheSame) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  const size_t n = 9001;
  const std::vector<int> all{0, 1, 2, 3};
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4);
  CorruptingComm corrupt(w.comms[1].get(), 0);
  auto out = RunAll(w, rounds, all, Codec::kInt8, 2, 1, data, residual, {{1, &corrupt}});
  const auto expect = Reference(Codec::kInt8, all, inputs, nullptr);
  for (int s : all) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_EQ(out[s].result.attempts, 2) << "site " << s;
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
  }
}

// Site 1 misses site 0's averaged piece once (the all-gather, after every reduce-scatter went
// well): it votes failure, no site commits that attempt, and the second attempt commits the same
// bits everywhere.
TEST(Exchange, AnAllGatherReceiveFailingOnceIsRetriedAndCommittedAlike) {
  World w(3);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(3);
  const size_t n = 7001;
  const std::vector<int> all{0, 1, 2};
  auto inputs = Inputs(3, n);
  auto data = inputs;
  // Error feedback too: the failed attempt's residual is given back, so the committed one is
  // exactly one exchange's.
  std::vector<std::vector<float>> residual(3, std::vector<float>(n, 0.125f));
  auto ref_residual = residual;
  DeafComm deaf_once(w.comms[1].get(), 0, /*times=*/1);
  auto out = RunAll(w, rounds, all, Codec::kInt8, 2, 5, data, residual, {{1, &deaf_once}});
  const auto expect = Reference(Codec::kInt8, all, inputs, &ref_residual);
  for (int s : all) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_EQ(out[s].result.attempts, 2) << "site " << s;
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
    EXPECT_TRUE(SameBits(residual[s], ref_residual[s])) << "site " << s << "'s residual";
  }
}

// Site 1 can never receive site 0's averaged piece while every site stays live. The others got
// everything; yet no site may commit a result site 1 does not have: all four fail, naming site
// 1, and every site's data and residual are as they were.
TEST(Exchange, APartThatKeepsFailingCommitsNowhere) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  const size_t n = 5003;
  const std::vector<int> all{0, 1, 2, 3};
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4, std::vector<float>(n, 0.25f));
  const auto residual_before = residual;
  DeafComm deaf(w.comms[1].get(), 0);
  auto out = RunAll(w, rounds, all, Codec::kInt4, 2, 3, data, residual, {{1, &deaf}});
  for (int s : all) {
    EXPECT_EQ(out[s].status.code(), StatusCode::kUnavailable) << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("site(s) 1 could not do their part"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], inputs[s])) << "site " << s << "'s data changed";
    EXPECT_TRUE(SameBits(residual[s], residual_before[s])) << "site " << s << "'s residual";
  }
}

// Site 2 contributes a NaN (a diverged or corrupt replica), with codecs that carry it as it is:
// the owner of its piece refuses it (naming site 2 and the non-finite value), so no site commits,
// every site fails, and nobody's data changes.
TEST(Exchange, ANonFiniteContributionCommitsNowhere) {
  for (Codec codec : {Codec::kNone, Codec::kBf16}) {
    SCOPED_TRACE(CodecName(codec));
    World w(3);
    ASSERT_TRUE(w.ok());
    FakeRounds rounds(3);
    const size_t n = 3001;
    const std::vector<int> all{0, 1, 2};
    auto inputs = Inputs(3, n);
    inputs[2][7] = std::nanf("");
    auto data = inputs;
    std::vector<std::vector<float>> residual(3);
    auto out = RunAll(w, rounds, all, codec, 2, 3, data, residual);
    int named = 0;  // the owner of the NaN's piece (site 0) names it; the others see it missed
    for (int s : all) {
      EXPECT_EQ(out[s].status.code(), StatusCode::kUnavailable) << out[s].status.ToString();
      named += out[s].status.message().find("non-finite value") != std::string::npos;
      EXPECT_TRUE(SameBits(data[s], inputs[s])) << "site " << s << "'s data changed";
    }
    EXPECT_EQ(named, 1);
    EXPECT_NE(out[0].status.message().find("site 2"), std::string::npos) << out[0].status.ToString();
  }
}

// Every site receives everything, but site 2 would commit something else (its digest of the
// result differs: another build's arithmetic, or a flipped bit): nobody commits, every site
// fails with kCorruption naming the two camps.
TEST(Exchange, SitesThatDisagreeOnTheResultCommitNothing) {
  World w(3);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(3);
  const size_t n = 3000;
  const std::vector<int> all{0, 1, 2};
  auto inputs = Inputs(3, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(3);
  auto out = RunAll(w, rounds, all, Codec::kNone, 2, 0, data, residual, {}, nullptr,
                    [](int site) -> SiteExchange::Digest {
                      return [site](std::span<const float> mean) {
                        uint64_t h = Hash64(mean.data(), mean.size_bytes());
                        return site == 2 ? h ^ 1 : h;
                      };
                    });
  for (int s : all) {
    EXPECT_EQ(out[s].status.code(), StatusCode::kCorruption) << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("disagree"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("site(s) 2:"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("site(s) 0,1:"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], inputs[s])) << "site " << s;
  }
}

}  // namespace
}  // namespace atl
