// What the live-site exchange's tests share: n WAN endpoints in one process on loopback, an
// in-memory round barrier with votes (FakeRounds), the exchange protocol computed in one place
// (Reference), and running Average on every site at once. Included by exchange_test.cc and
// exchange_failure_test.cc (one binary each).
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <vector>

#include "core/log.h"
#include "world/exchange.h"
#include "world/transport/test_world.h"
#include "world/wan.h"

namespace atl::testing_exchange {

using testing_wan::Insecure;

// The coordinator's round barrier, in memory: Round(site, r) returns when every live site has
// reached r, with the same Membership for every caller of r. Kill(site) marks a site dead (a dead
// site's Round is kUnavailable; the rounds it held up complete without it).
class FakeRounds {
 public:
  explicit FakeRounds(int sites) : alive_(sites, true), join_(sites, 0), calls_(sites) {}

  StatusOr<Membership> Round(int site, int64_t r, std::optional<RoundVote> vote = std::nullopt) {
    std::unique_lock<std::mutex> lk(mu_);
    calls_[site].push_back(r);
    if (vote) votes_[r][site] = *vote;
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
        for (const auto& [voter, v] : votes_[r])
          if (alive_[voter]) done_[r].votes[voter] = v;
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
  std::function<StatusOr<Membership>(int64_t, std::optional<RoundVote>)> For(int site) {
    return [this, site](int64_t r, std::optional<RoundVote> v) { return Round(site, r, v); };
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
  std::map<int64_t, std::map<int, RoundVote>> votes_;
  std::map<int64_t, Membership> done_;
  std::vector<std::vector<int64_t>> calls_;
};

// n sites, each with its own endpoint, connected concurrently in site order (ok(): all did).
struct World : testing_wan::World {
  explicit World(int n) {
    testing_wan::TryStart(*this, n, [](WanOptions& o) {
      o.timeout_s = 15;
      o.choose_ring = false;
    });
  }
};

inline std::vector<float> Input(int site, size_t n, float scale = 1.0f) {
  std::mt19937 rng(1234 + site);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

struct Piece {
  size_t begin, size;
};
inline Piece PieceOf(size_t n, size_t m, size_t k) {
  const size_t base = n / m, rem = n % m;
  return {k * base + std::min(k, rem), base + (k < rem ? 1 : 0)};
}

// The protocol of exchange.h computed in one place: the mean over `live` of inputs[s] (with
// error feedback when residuals is not null: residuals[s] is updated as the site would).
inline std::vector<float> Reference(Codec codec, const std::vector<int>& live,
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
    // The owner's error feedback for the all-gather, every operation rounded on its own as
    // exchange.cc does it (core/fp_exact.h): the volatile keeps the compiler from fusing the
    // product into the sum.
    if (residuals && !(*residuals)[live[k]].empty())
      for (size_t i = 0; i < p.size; ++i) {
        const volatile float lost = float(m) * (acc[i] - out[p.begin + i]);
        (*residuals)[live[k]][p.begin + i] += lost;
      }
  }
  return out;
}

// The true mean (double) over `live`.
inline std::vector<double> TrueMean(const std::vector<int>& live,
                                    const std::vector<std::vector<float>>& inputs) {
  std::vector<double> mean(inputs[live[0]].size(), 0.0);
  for (int s : live)
    for (size_t i = 0; i < mean.size(); ++i) mean[i] += inputs[s][i];
  for (double& v : mean) v /= double(live.size());
  return mean;
}

inline bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

struct Outcome {
  Status status;
  ExchangeResult result;
};

// The pace site s votes with in RunAll (ExchangeResult::paces).
inline double PaceOf(int s) { return 0.25 * (s + 1); }

// Runs Average(round) on every site in `sites` (each on its own thread) over `world`.
inline std::vector<Outcome> RunAll(World& w, FakeRounds& rounds, const std::vector<int>& sites,
                                   Codec codec, int quorum, int64_t round,
                                   std::vector<std::vector<float>>& data,
                                   std::vector<std::vector<float>>& residual,
                                   std::map<int, Communicator*> comm_override = {},
                                   std::function<void(int)> after = nullptr,
                                   std::function<SiteExchange::Digest(int)> digest = nullptr) {
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
      auto r = ex.Average(round, data[s], residual[s], digest ? digest(s) : nullptr, PaceOf(s));
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

inline std::vector<std::vector<float>> Inputs(int sites, size_t n, float scale = 1.0f) {
  std::vector<std::vector<float>> v;
  for (int s = 0; s < sites; ++s) v.push_back(Input(s, n, scale));
  return v;
}

}  // namespace atl::testing_exchange
