// The live-site exchange on loopback: WAN endpoints in one process (a thread per site) and a
// fake round barrier. Exact float32 means, identical bits on every site, quantization error
// bounds, error feedback, the quorum, a site dead at the start, a site dying mid-exchange.
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

#include "core/log.h"
#include "world/wan.h"

namespace atl {
namespace {

WorldSecurity Insecure() {
  WorldSecurity s;
  s.insecure = true;
  return s;
}

// The coordinator's round barrier, in memory: Round(site, r) returns when every live site has
// reached r, with the same Membership for every caller of r. Kill(site) marks a site dead (a dead
// site's Round is kUnavailable; the rounds it held up complete without it).
class FakeRounds {
 public:
  explicit FakeRounds(int sites) : alive_(sites, true), join_(sites, 0), calls_(sites) {}

  StatusOr<Membership> Round(int site, int64_t r) {
    std::unique_lock<std::mutex> lk(mu_);
    calls_[site].push_back(r);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      if (!alive_[site]) return Status::Unavailable(fmt::format("site {} is dead", site));
      arrived_[r].insert(site);
      auto done = done_.find(r);
      if (done != done_.end()) return done->second;
      bool all = true;
      for (int s = 0; s < int(alive_.size()); ++s)
        if (alive_[s] && join_[s] <= r && !arrived_[r].count(s)) all = false;
      if (all) {
        done_[r] = Snapshot();
        cv_.notify_all();
        return done_[r];
      }
      if (cv_.wait_until(lk, deadline) == std::cv_status::timeout)
        return Status::Unavailable(fmt::format("round {} timed out at site {}", r, site));
    }
  }
  // A rejoined process for `site`: alive, but in the rounds only from r on.
  void JoinAt(int site, int64_t r) {
    std::lock_guard<std::mutex> lk(mu_);
    join_[site] = r;
    ++epoch_;
  }
  void Kill(int site) {
    std::lock_guard<std::mutex> lk(mu_);
    alive_[site] = false;
    ++epoch_;
    cv_.notify_all();
  }
  std::vector<int64_t> calls(int site) {
    std::lock_guard<std::mutex> lk(mu_);
    return calls_[site];
  }
  std::function<StatusOr<Membership>(int64_t)> For(int site) {
    return [this, site](int64_t r) { return Round(site, r); };
  }

 private:
  Membership Snapshot() const {
    Membership m;
    m.epoch = epoch_;
    for (int s = 0; s < int(alive_.size()); ++s)
      m.sites.push_back({s, "", bool(alive_[s]), 0, join_[s]});
    return m;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<char> alive_;
  std::vector<int64_t> join_;
  int64_t epoch_ = 1;
  std::map<int64_t, std::set<int>> arrived_;
  std::map<int64_t, Membership> done_;
  std::vector<std::vector<int64_t>> calls_;
};

// A Communicator that forwards to another until the first operation whose tag differs from the
// first one's (the all-gather, after the reduce-scatter): then the site "dies" (on_death runs
// once) and every later operation fails.
class DyingComm final : public Communicator {
 public:
  DyingComm(Communicator* inner, std::function<void()> on_death)
      : inner_(inner), on_death_(std::move(on_death)) {}
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string label() const override { return inner_->label(); }
  CommHandle IAllReduce(void*, size_t, DType) override { return Dead(); }
  CommHandle IReduceScatter(const void*, void*, size_t, DType) override { return Dead(); }
  CommHandle IAllGather(const void*, void*, size_t, DType) override { return Dead(); }
  CommHandle IBroadcast(void*, size_t, DType, int) override { return Dead(); }
  CommHandle IBarrier() override { return Dead(); }
  StatusOr<std::unique_ptr<Communicator>> Split(int, int) override {
    return Status::Internal("no split");
  }
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

  Communicator* inner_;
  std::function<void()> on_death_;
  int first_tag_ = -1;
  bool dead_ = false;
};

// A Communicator that forwards to another but spoils the magic of the first message it sends to
// site `victim` (the reduce-scatter piece), as a corrupt link would.
class CorruptingComm final : public Communicator {
 public:
  CorruptingComm(Communicator* inner, int victim) : inner_(inner), victim_(victim) {}
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
    if (dest == victim_ && !done_) {
      done_ = true;
      spoiled_.assign(static_cast<const uint8_t*>(data), static_cast<const uint8_t*>(data) + count);
      spoiled_[0] ^= 0xFF;
      return inner_->ISend(spoiled_.data(), count, dtype, dest, tag);
    }
    return inner_->ISend(data, count, dtype, dest, tag);
  }
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    return inner_->IRecv(data, count, dtype, source, tag);
  }

 private:
  Communicator* inner_;
  int victim_;
  bool done_ = false;
  std::vector<uint8_t> spoiled_;
};

// n sites, each with its own endpoint, connected concurrently.
struct World {
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::unique_ptr<Communicator>> comms;

  explicit World(int n) {
    std::vector<WanPeer> peers;
    for (int s = 0; s < n; ++s) {
      auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
      EXPECT_TRUE(ep.ok()) << ep.status().ToString();
      if (!ep.ok()) return;
      peers.push_back({s, (*ep)->address()});
      eps.push_back(std::move(*ep));
    }
    comms.resize(n);
    std::vector<std::thread> threads;
    for (int s = 0; s < n; ++s) {
      threads.emplace_back([&, s] {
        WanOptions o;
        o.site = s;
        o.peers = peers;
        o.timeout_s = 15;
        o.choose_ring = false;
        auto c = eps[s]->Connect(o);
        EXPECT_TRUE(c.ok()) << c.status().ToString();
        if (c.ok()) comms[s] = std::move(*c);
      });
    }
    for (auto& t : threads) t.join();
  }
  ~World() {
    comms.clear();
    eps.clear();
  }
  bool ok() const {
    for (const auto& c : comms)
      if (!c) return false;
    return !comms.empty();
  }
  // Destroys a site's communicator and endpoint: its peers see it vanish.
  void Drop(int s) {
    comms[s].reset();
    eps[s].reset();
  }
};

std::vector<float> Input(int site, size_t n, float scale = 1.0f) {
  std::mt19937 rng(1234 + site);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Piece {
  size_t begin, size;
};
Piece PieceOf(size_t n, size_t m, size_t k) {
  const size_t base = n / m, rem = n % m;
  return {k * base + std::min(k, rem), base + (k < rem ? 1 : 0)};
}

// The protocol of exchange.h computed in one place: the mean over `live` of inputs[s] (with
// error feedback when residuals is not null: residuals[s] is updated as the site would).
std::vector<float> Reference(Codec codec, const std::vector<int>& live,
                             const std::vector<std::vector<float>>& inputs,
                             std::vector<std::vector<float>>* residuals) {
  const size_t n = inputs[live[0]].size(), m = live.size();
  std::vector<float> out(n);
  for (size_t k = 0; k < m; ++k) {
    const Piece p = PieceOf(n, m, k);
    std::vector<float> acc(p.size, 0.0f), dec(p.size);
    std::vector<uint8_t> bytes;
    for (int s : live) {
      std::span<float> r;
      if (residuals && !(*residuals)[s].empty())
        r = std::span<float>((*residuals)[s]).subspan(p.begin, p.size);
      Encode(codec, std::span<const float>(inputs[s].data() + p.begin, p.size), &bytes, r);
      EXPECT_TRUE(Decode(bytes, dec).ok());
      for (size_t i = 0; i < p.size; ++i) acc[i] += dec[i];
    }
    const float inv = 1.0f / float(m);
    for (float& v : acc) v *= inv;
    Encode(codec, acc, &bytes);
    EXPECT_TRUE(Decode(bytes, std::span<float>(out.data() + p.begin, p.size)).ok());
    // The owner's error feedback for the all-gather.
    if (residuals && !(*residuals)[live[k]].empty())
      for (size_t i = 0; i < p.size; ++i)
        (*residuals)[live[k]][p.begin + i] += float(m) * (acc[i] - out[p.begin + i]);
  }
  return out;
}

// The true mean (double) over `live`.
std::vector<double> TrueMean(const std::vector<int>& live,
                             const std::vector<std::vector<float>>& inputs) {
  std::vector<double> mean(inputs[live[0]].size(), 0.0);
  for (int s : live)
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += inputs[s][i];
  for (double& v : mean) v /= double(live.size());
  return mean;
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

struct Outcome {
  Status status;
  ExchangeResult result;
};

// Runs Average(round) on every site in `sites` (each on its own thread) over `world`.
std::vector<Outcome> RunAll(World& w, FakeRounds& rounds, const std::vector<int>& sites,
                            Codec codec, int quorum, int64_t round,
                            std::vector<std::vector<float>>& data,
                            std::vector<std::vector<float>>& residual,
                            std::map<int, Communicator*> comm_override = {},
                            std::function<void(int)> after = nullptr) {
  std::vector<Outcome> out(w.comms.size());
  std::vector<std::thread> threads;
  for (int s : sites) {
    threads.emplace_back([&, s] {
      ExchangeOptions o;
      o.site = s;
      o.sites = int(w.comms.size());
      o.codec = codec;
      o.quorum = quorum;
      o.round = rounds.For(s);
      Communicator* c = comm_override.count(s) ? comm_override[s] : w.comms[s].get();
      SiteExchange ex(c, o);
      auto r = ex.Average(round, data[s], residual[s]);
      if (r.ok())
        out[s].result = *r;
      else
        out[s].status = r.status();
      if (after) after(s);
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::vector<std::vector<float>> Inputs(int sites, size_t n, float scale = 1.0f) {
  std::vector<std::vector<float>> v;
  for (int s = 0; s < sites; ++s) v.push_back(Input(s, n, scale));
  return v;
}

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

// Site 1's piece for site 0 arrives corrupt while every site stays live: site 0 cannot average
// its piece and tells the others so (its all-gather message), so no site commits; every one
// fails naming the site it could not get a good piece from, and data is left alone everywhere.
TEST(Exchange, ACorruptPieceFailsEverySiteAndNoneCommits) {
  World w(4);
  ASSERT_TRUE(w.ok());
  FakeRounds rounds(4);
  const size_t n = 9001;
  auto inputs = Inputs(4, n);
  auto data = inputs;
  std::vector<std::vector<float>> residual(4);
  CorruptingComm corrupt(w.comms[1].get(), 0);
  auto out = RunAll(w, rounds, {0, 1, 2, 3}, Codec::kInt8, 2, 1, data, residual, {{1, &corrupt}});
  for (int s = 0; s < 4; ++s) {
    EXPECT_EQ(out[s].status.code(), StatusCode::kUnavailable) << out[s].status.ToString();
    EXPECT_TRUE(SameBits(data[s], inputs[s])) << "site " << s;
  }
  EXPECT_NE(out[0].status.message().find("site(s) 1 failed"), std::string::npos)
      << out[0].status.ToString();
  for (int s = 1; s < 4; ++s)
    EXPECT_NE(out[s].status.message().find("site 0 could not average its piece"), std::string::npos)
        << out[s].status.ToString();
  LogInfo("exchange_test: site 0 says: {}", out[0].status.ToString());
}

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
