// The live-site exchange on loopback: WAN endpoints in one process (a thread per site) and a
// fake round barrier. Exact float32 means, identical bits on every site, quantization error
// bounds, error feedback, the quorum, a site dead at the start or joining later, bad arguments,
// the time of a large average. Failures: exchange_failure_test.cc.
#include "world/exchange.h"

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

TEST(Exchange, NoneGivesTheExactFloat32MeanInSiteOrder) {
  World w(4);
  ASSERT_TRUE(w.ok());
  const std::vector<int> all{0, 1, 2, 3};
  int64_t round = 0;
  for (size_t n : {size_t(0), size_t(3), size_t(1000), size_t(100003)}) {
    FakeRounds rounds(4);
    auto inputs = Inputs(4, n);
    auto data = inputs;
    std::vector<std::vector<float>> residual(4);
    auto out = RunAll(w, rounds, all, Codec::kNone, 4, round, data, residual);
    // The plain float32 mean, summed in site order then scaled by 1/4.
    std::vector<float> expect(n);
    for (size_t i = 0; i < n; ++i) {
      float acc = 0.0f;
      for (int s : all) acc += inputs[s][i];
      expect[i] = acc * (1.0f / 4.0f);
    }
    for (int s : all) {
      ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
      EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s << " n " << n;
      EXPECT_EQ(out[s].result.sites, all);
      EXPECT_EQ(out[s].result.attempts, 1);
      // Three pieces of its contribution out, its averaged piece to three sites.
      const Piece p = PieceOf(n, 4, size_t(s));
      uint64_t sent = 3 * EncodedBytes(Codec::kNone, p.size);
      for (int k : all)
        if (k != s) sent += EncodedBytes(Codec::kNone, PieceOf(n, 4, size_t(k)).size);
      EXPECT_EQ(out[s].result.bytes_sent, sent) << "site " << s;
      const int64_t base = kRoundsPerExchange * round;
      EXPECT_EQ(rounds.calls(s), (std::vector<int64_t>{base, base + 1}));
    }
    ++round;
  }
}

TEST(Exchange, ThreeSitesNotAPowerOfTwo) {
  World w(3);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(3);
  const size_t n = 5001;
  auto inputs = Inputs(3, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(3);
  auto out = RunAll(w, rounds, {0, 1, 2}, Codec::kNone, 2, 7, data, residual);
  auto expect = Reference(Codec::kNone, {0, 1, 2}, inputs, nullptr);
  for (int s = 0; s < 3; ++s) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
  }
  // The mean by 1/3 (not /3), summed in order: a plain loop agrees.
  for (size_t i = 0; i < n; ++i) {
    float acc = ((0.0f + inputs[0][i]) + inputs[1][i]) + inputs[2][i];
    ASSERT_EQ(expect[i], acc * (1.0f / 3.0f));
  }
}

// Quantized codecs: the same bits everywhere (as the reference computes them), within the
// codec's error of the true mean; with and without error feedback.
void CheckQuantized(Codec codec, float levels) {
  World w(4);
  ASSERT_TRUE(w.ok());
  const std::vector<int> all{0, 1, 2, 3};
  const size_t n = 20011;
  for (bool feedback : {false, true}) {
    FakeRounds rounds(4);
    auto inputs = Inputs(4, n);
    auto data = inputs;
    std::vector<std::vector<float>> residual(4);
    if (feedback)
      for (int s : all) residual[s].assign(n, 0.0f);
    auto ref_residual = residual;
    auto out = RunAll(w, rounds, all, codec, 4, 3, data, residual);
    auto expect = Reference(codec, all, inputs, &ref_residual);
    for (int s : all) {
      ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
      EXPECT_TRUE(SameBits(data[s], data[0])) << "site " << s;
      EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
      EXPECT_TRUE(SameBits(residual[s], ref_residual[s])) << "site " << s;
      EXPECT_LT(out[s].result.bytes_sent, 2 * n * sizeof(float) * 3 / 4);  // less than none
    }
    // Each site's piece is off by at most half a step (absmax / levels / 2), so is their mean;
    // the all-gather adds at most half a step of the mean's block.
    double absmax = 0, worst = 0;
    for (int s : all)
      for (float x : inputs[s]) absmax = std::max(absmax, double(std::fabs(x)));
    const auto mean = TrueMean(all, inputs);
    for (size_t i = 0; i < n; ++i) worst = std::max(worst, std::fabs(data[0][i] - mean[i]));
    const double bound = absmax / levels * (1 + 0.5 / levels) + 1e-6;
    EXPECT_LE(worst, bound) << CodecName(codec) << " feedback " << feedback;
    LogInfo("exchange_test: {} (feedback {}): worst error {:.4g} (bound {:.4g}, absmax {:.3g})",
            CodecName(codec), feedback, worst, bound, absmax);
  }
}

TEST(Exchange, Int8SameBitsEverywhereWithinQuantizationError) { CheckQuantized(Codec::kInt8, 127); }
TEST(Exchange, Int4SameBitsEverywhereWithinQuantizationError) { CheckQuantized(Codec::kInt4, 7); }
TEST(Exchange, Bf16SameBitsEverywhere) { CheckQuantized(Codec::kBf16, 256); }

// Error feedback: averaging the same inputs again and again, the running sum of the results
// follows the running sum of the true means: what the codec loses, in the reduce-scatter (each
// site's encoding) and in the all-gather (the owner's encoding of the mean), is sent the next
// time. Without it the error of each call adds up (linearly: the same inputs lose the same every
// time); with it the error stays bounded by what the residuals hold, however many calls.
TEST(Exchange, ErrorFeedbackKeepsTheRunningSumOnTrack) {
  World w(4);
  ASSERT_TRUE(w.ok());
  const std::vector<int> all{0, 1, 2, 3};
  const size_t n = 4099;
  const int calls = 40;
  const auto inputs = Inputs(4, n);
  const auto mean = TrueMean(all, inputs);
  double err[2] = {0, 0}, half_way = 0;
  for (int feedback : {0, 1}) {
    FakeRounds rounds(4);
    std::vector<std::vector<float>> residual(4);
    if (feedback)
      for (int s : all) residual[s].assign(n, 0.0f);
    std::vector<double> sum(n, 0.0);
    for (int c = 0; c < calls; ++c) {
      auto data = inputs;
      auto out = RunAll(w, rounds, all, Codec::kInt4, 4, c, data, residual);
      for (int s : all) ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
      for (size_t i = 0; i < n; ++i) sum[i] += data[0][i];
      if (feedback && c + 1 == calls / 2)
        for (size_t i = 0; i < n; ++i)
          half_way = std::max(half_way, std::fabs(sum[i] - (c + 1) * mean[i]));
    }
    for (size_t i = 0; i < n; ++i)
      err[feedback] = std::max(err[feedback], std::fabs(sum[i] - calls * mean[i]));
  }
  double absmax = 0;
  for (int s : all)
    for (float x : inputs[s]) absmax = std::max(absmax, double(std::fabs(x)));
  LogInfo(
      "exchange_test: int4, {} calls: worst error of the running sum {:.3g} with error "
      "feedback ({:.3g} after {}), {:.3g} without (one step: {:.3g})",
      calls, err[1], half_way, calls / 2, err[0], absmax / 7);
  EXPECT_LT(err[1], err[0] / 10);
  // Bounded, not growing with the calls: within a few steps of one site's contribution.
  EXPECT_LE(err[1], 2 * absmax / 7);
  EXPECT_LE(half_way, 2 * absmax / 7);
}

TEST(Exchange, FewerLiveSitesThanTheQuorumIsUnavailable) {
  World w(3);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(3);
  rounds.Kill(2);
  auto inputs = Inputs(3, 1000);
  auto data = inputs;
  std::vector<std::vector<float>> residual(3, std::vector<float>(1000, 0.25f));
  const auto residual0 = residual;
  const uint64_t received = w.eps[2]->stats().bytes_received;
  auto out = RunAll(w, rounds, {0, 1}, Codec::kInt8, 3, 0, data, residual);
  for (int s : {0, 1}) {
    EXPECT_EQ(out[s].status.code(), StatusCode::kUnavailable) << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("2 live sites"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_NE(out[s].status.message().find("quorum of 3"), std::string::npos)
        << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], inputs[s]));
    EXPECT_TRUE(SameBits(residual[s], residual0[s]));
  }
  EXPECT_EQ(w.eps[2]->stats().bytes_received, received);
}

TEST(Exchange, ASiteDeadAtTheStartIsLeftOut) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  rounds.Kill(2);
  const size_t n = 30001;
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4);
  const uint64_t received = w.eps[2]->stats().bytes_received;
  auto out = RunAll(w, rounds, {0, 1, 3}, Codec::kNone, 3, 4, data, residual);
  const std::vector<int> live{0, 1, 3};
  auto expect = Reference(Codec::kNone, live, inputs, nullptr);
  for (int s : live) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
    EXPECT_EQ(out[s].result.sites, live);
    EXPECT_EQ(out[s].result.attempts, 1);
    // Every live site's pace, from its commit vote; none for the dead one.
    EXPECT_EQ(out[s].result.paces, (std::vector<double>{PaceOf(0), PaceOf(1), 0, PaceOf(3)}));
  }
  EXPECT_TRUE(rounds.calls(2).empty());
  EXPECT_EQ(w.eps[2]->stats().bytes_received, received);  // nothing was sent to the dead site
}

// A site whose new process joins at a later round is alive but not in this exchange.
TEST(Exchange, ASiteJoiningLaterIsNotInTheExchange) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  rounds.JoinAt(2, kRoundsPerExchange * 10);
  const size_t n = 3001;
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4);
  auto out = RunAll(w, rounds, {0, 1, 3}, Codec::kNone, 3, 4, data, residual);
  const std::vector<int> live{0, 1, 3};
  auto expect = Reference(Codec::kNone, live, inputs, nullptr);
  for (int s : live) {
    ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], expect)) << "site " << s;
    EXPECT_EQ(out[s].result.sites, live);
  }
  EXPECT_TRUE(rounds.calls(2).empty());
}

// Site 3 dies after its reduce-scatter sends (its WAN endpoint goes away); the coordinator
// reports it dead at the commit; the survivors redo the exchange among themselves.
TEST(Exchange, BadArgumentsAreRefused) {
  World w(2);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(2);
  ExchangeOptions o;
  o.site = 0;
  o.sites = 2;
  o.round = rounds.For(0);
  SiteExchange ex(w.comms[0].get(), o);
  std::vector<float> data(10), residual(9);
  EXPECT_EQ(ex.Average(0, data, residual).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(ex.Average(-1, data, {}).status().code(), StatusCode::kInvalidArgument);
  o.site = 1;  // not the communicator's rank
  SiteExchange wrong(w.comms[0].get(), o);
  EXPECT_EQ(wrong.Average(0, data, {}).status().code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(rounds.calls(0).empty());
}

// 11.5M floats (a 46 MB pseudo-gradient) over 4 sites on loopback: the time of one Average.
TEST(Exchange, TimeOfALargeAverage) {
  World w(4);
  ASSERT_TRUE(w.ok());
  const size_t n = 11'500'000;
  const std::vector<int> all{0, 1, 2, 3};
  auto inputs = Inputs(4, n);
  int64_t round = 0;
  for (Codec codec : {Codec::kNone, Codec::kInt4}) {
    FakeRounds rounds(4);
    auto data = inputs;
    std::vector<std::vector<float>> residual(4);
    if (codec != Codec::kNone)
      for (int s : all) residual[s].assign(n, 0.0f);
    const double t0 = NowSeconds();
    auto out = RunAll(w, rounds, all, codec, 4, round++, data, residual);
    const double wall = NowSeconds() - t0;
    for (int s : all) {
      ASSERT_TRUE(out[s].status.ok()) << out[s].status.ToString();
      EXPECT_TRUE(SameBits(data[s], data[0]));
    }
    LogInfo(
        "exchange_test: Average of {} floats over 4 sites on loopback, codec {}: {:.3f} s "
        "(site 0: {:.3f} s, {:.1f} MB sent)",
        n, CodecName(codec), wall, out[0].result.seconds, out[0].result.bytes_sent / 1e6);
  }
}

}  // namespace
}  // namespace atl
