// LowCommSync (DiLoCo and Streaming DiLoCo) with an in-memory exchange: the staggered schedule,
// outer steps, merges with alpha, the final plain average, digests that agree across sites, and
// a site taken over by a new process.
#include "train/strategies/lowcomm.h"

#include <gtest/gtest.h>

#include <array>
#include <barrier>
#include <cmath>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/hash.h"
#include "fmt/format.h"

namespace atl {
namespace {

// P contiguous fragments of n elements (the trainer's are by blocks; the schedule does not care).
std::vector<Fragment> Contiguous(size_t n, int parts) {
  std::vector<Fragment> out;
  for (const Range& r : SplitEvenly(n, parts)) out.push_back(Fragment{{r}});
  return out;
}

TEST(LowCommSync, StaggeredScheduleSendsEachFragmentEveryHSteps) {
  LowCommOptions o;
  o.fragments = Contiguous(16, 4);
  o.inner_steps = 8;
  o.overlap = 1;
  const std::vector<float> p(16, 0.0f);
  LowCommSync s(o, nullptr, p.data(), p.size());
  std::map<int, std::vector<int64_t>> sends, merges;
  for (int64_t c = 1; c <= 24; ++c) {
    for (int f : s.Sends(c)) sends[f].push_back(c);
    for (int f : s.Merges(c)) merges[f].push_back(c);
  }
  EXPECT_EQ(sends[0], (std::vector<int64_t>{2, 10, 18}));
  EXPECT_EQ(sends[1], (std::vector<int64_t>{4, 12, 20}));
  EXPECT_EQ(sends[2], (std::vector<int64_t>{6, 14, 22}));
  EXPECT_EQ(sends[3], (std::vector<int64_t>{8, 16, 24}));
  EXPECT_EQ(merges[0], (std::vector<int64_t>{3, 11, 19}));
  EXPECT_EQ(merges[3], (std::vector<int64_t>{9, 17}));  // 25 is past the run: Finish merges it
  // DiLoCo: one fragment, every H steps, merged at once.
  LowCommOptions d;
  d.inner_steps = 5;
  LowCommSync dl(d, nullptr, p.data(), p.size());
  EXPECT_TRUE(dl.Sends(4).empty());
  EXPECT_EQ(dl.Sends(5), std::vector<int>{0});
  EXPECT_EQ(dl.Merges(5), std::vector<int>{0});
  EXPECT_EQ(dl.Sends(10), std::vector<int>{0});
}

// Two sites in threads, averaging through a shared slot (what SiteExchange does over the WAN),
// and comparing the digests of the result as its commit round does; the paces the sites pass
// come back in every site's result, as the commit votes carry them.
class TwoSiteAverage {
 public:
  LowCommSync::Average For(int site) {
    return
        [this, site](int64_t round, std::span<float> data, std::span<float>,
                     const SiteExchange::Digest& digest, double pace) -> StatusOr<ExchangeResult> {
          {
            std::lock_guard lock(mu_);
            rounds_[site].push_back(round);
            paces_[round][size_t(site)] = pace;
            auto& slot = slots_[round];
            slot.resize(2);
            slot[size_t(site)].assign(data.begin(), data.end());
          }
          sync_.arrive_and_wait();
          std::vector<float> mean(data.size());
          {
            std::lock_guard lock(mu_);
            const auto& slot = slots_[round];
            for (size_t i = 0; i < data.size(); ++i) mean[i] = (slot[0][i] + slot[1][i]) * 0.5f;
            digests_[round][size_t(site)] = digest ? digest(mean) : 0;
          }
          sync_.arrive_and_wait();
          {
            std::lock_guard lock(mu_);
            if (digests_[round][0] != digests_[round][1])
              return Status::Corruption(fmt::format("round {}: the digests differ", round));
          }
          std::copy(mean.begin(), mean.end(), data.begin());
          ExchangeResult r;
          r.sites = {0, 1};
          r.bytes_sent = data.size() * sizeof(float);
          std::lock_guard lock(mu_);
          r.paces.assign(paces_[round].begin(), paces_[round].end());
          return r;
        };
  }
  std::vector<int64_t> rounds(int site) {
    std::lock_guard lock(mu_);
    return rounds_[site];
  }
  std::map<int64_t, std::array<uint64_t, 2>> digests() {
    std::lock_guard lock(mu_);
    return digests_;
  }

 private:
  std::barrier<> sync_{2};
  std::mutex mu_;
  std::map<int64_t, std::vector<std::vector<float>>> slots_;
  std::map<int64_t, std::array<uint64_t, 2>> digests_;
  std::map<int64_t, std::array<double, 2>> paces_;
  std::map<int, std::vector<int64_t>> rounds_;
};

TEST(LowCommSync, DiLoCoAveragesTheSitesAndEndsIdentical) {
  // Each site "trains" by adding its own constant every step; outer lr 1, momentum 0, H = 2:
  // after each outer step both sites hold the average of their progress.
  LowCommOptions o;
  o.inner_steps = 2;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  o.total_steps = 5;
  o.final_sync = true;
  TwoSiteAverage avg;
  const size_t n = 6;
  std::vector<std::vector<float>> params(2, std::vector<float>(n, 1.0f));
  std::vector<Status> st(2);
  std::vector<std::thread> th;
  for (int site = 0; site < 2; ++site) {
    th.emplace_back([&, site] {
      LowCommSync s(o, avg.For(site), params[size_t(site)].data(), n);
      // world.balance: each exchange carries the pace set before it started, and every site
      // learns both at the merge.
      const double pace = site == 0 ? 0.25 : 0.75;
      for (int64_t c = 1; c <= 5; ++c) {
        s.SetPace(pace * double(c));
        for (float& x : params[size_t(site)]) x += site == 0 ? 1.0f : 3.0f;
        if (Status e = s.AfterStep(c, params[size_t(site)].data()); !e.ok()) {
          st[size_t(site)] = e;
          return;
        }
        if (c == 2 || c == 4) {
          // The average of 1 + 2 * 1 and 1 + 2 * 3 after the first round, + 4 after the second.
          const float want = c == 2 ? 5.0f : 9.0f;
          for (float x : params[size_t(site)])
            if (x != want) st[size_t(site)] = Status::Internal("bad average");
          if (s.last_paces() != std::vector<double>{0.25 * double(c), 0.75 * double(c)})
            st[size_t(site)] = Status::Internal("the exchange did not carry the sites' paces");
        }
      }
      st[size_t(site)] = s.Finish(params[size_t(site)].data());
      if (s.exchanges() != 3) st[size_t(site)] = Status::Internal("not 3 exchanges");
    });
  }
  for (auto& t : th) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(params[0], params[1]);
  EXPECT_FLOAT_EQ(params[0][0], 11.0f);  // 9 + (1 + 3) / 2
  EXPECT_EQ(avg.rounds(0), (std::vector<int64_t>{0, 1, 2}));
}

TEST(LowCommSync, StreamingMergesEachFragmentTauStepsLaterWithAlpha) {
  // Two fragments, H = 4, tau = 1, alpha = 0.5, outer lr 1, momentum 0: fragment 0 is sent after
  // step 2 and merged after step 3, when the local value has moved on by one more step.
  LowCommOptions o;
  o.fragments = Contiguous(4, 2);
  o.inner_steps = 4;
  o.overlap = 1;
  o.alpha = 0.5f;
  o.outer_lr = 1.0f;
  o.outer_momentum = 0.0f;
  o.total_steps = 4;
  TwoSiteAverage avg;
  std::vector<std::vector<float>> params(2, std::vector<float>(4, 0.0f));
  std::vector<std::vector<float>> after3(2);
  std::vector<Status> st(2);
  std::vector<std::thread> th;
  for (int site = 0; site < 2; ++site) {
    th.emplace_back([&, site] {
      auto& p = params[size_t(site)];
      LowCommSync s(o, avg.For(site), p.data(), p.size());
      for (int64_t c = 1; c <= 4; ++c) {
        for (float& x : p) x += site == 0 ? 1.0f : 3.0f;
        if (Status e = s.AfterStep(c, p.data()); !e.ok()) {
          st[size_t(site)] = e;
          return;
        }
        if (c == 3) after3[size_t(site)] = p;
      }
      st[size_t(site)] = s.Finish(p.data());
    });
  }
  for (auto& t : th) t.join();
  for (const auto& s : st) ASSERT_TRUE(s.ok()) << s.ToString();
  // Fragment 0 (elements 0, 1): global after the outer step = mean at step 2 = (2 + 6) / 2 = 4;
  // site 0's local at step 3 is 3, merged 0.5 * 3 + 0.5 * 4 = 3.5; site 1's 9 -> 6.5.
  EXPECT_FLOAT_EQ(after3[0][0], 3.5f);
  EXPECT_FLOAT_EQ(after3[1][0], 6.5f);
  // Fragment 1 (elements 2, 3) not merged yet at step 3.
  EXPECT_FLOAT_EQ(after3[0][2], 3.0f);
  EXPECT_FLOAT_EQ(after3[1][2], 9.0f);
  // The end: every site holds the same parameters.
  EXPECT_EQ(params[0], params[1]);
}

// A site's process is replaced after step 2 by a new one that takes over site 0's state at its
// quiet point: the run goes on exactly as if nothing had happened (DiLoCo's local parameters are
// the global ones after an outer step; the toy "training" has no optimizer state).
TEST(LowCommSync, ARejoiningSiteTakesOverAPeersStateAndStaysInStep) {
  LowCommOptions o;
  o.inner_steps = 2;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.total_steps = 6;
  o.final_sync = false;  // the last exchange is at the last step (as the trainer sets it)
  const size_t n = 5;
  auto run = [&](bool replace) {
    TwoSiteAverage avg;
    std::vector<std::vector<float>> params(2, std::vector<float>(n, 1.0f));
    std::promise<std::shared_ptr<const std::string>> published;
    std::vector<Status> st(2);
    std::vector<int> quiet_steps;
    std::vector<std::thread> th;
    for (int site = 0; site < 2; ++site) {
      th.emplace_back([&, site] {
        auto& p = params[size_t(site)];
        auto s = std::make_unique<LowCommSync>(o, avg.For(site), p.data(), n);
        for (int64_t c = 1; c <= 6; ++c) {
          for (size_t i = 0; i < n; ++i) p[i] += float(site + 1) * float(i + c);
          if (Status e = s->AfterStep(c, p.data()); !e.ok()) {
            st[size_t(site)] = e;
            return;
          }
          auto state = s->QuietState(c, p.data());
          if (site == 0 && state != nullptr) quiet_steps.push_back(int(c));
          if (site == 0 && c == 2) published.set_value(state);
          if (replace && site == 1 && c == 2) {
            // A crash: this process's state is gone; a new one starts from garbage and takes over.
            std::fill(p.begin(), p.end(), -99.0f);
            s = std::make_unique<LowCommSync>(o, avg.For(site), p.data(), n);
            auto blob = published.get_future().get();
            auto taken = DecodeLowCommState(*blob, n);
            if (!taken.ok()) {
              st[size_t(site)] = taken.status();
              return;
            }
            if (taken->completed != 2 || taken->rounds != 1 || taken->exchanges != 1)
              st[size_t(site)] = Status::Internal("bad counters");
            s->Restore(*taken);
            p = taken->params;
          }
        }
        st[size_t(site)] = s->Finish(p.data());
      });
    }
    for (auto& t : th) t.join();
    for (const auto& x : st) EXPECT_TRUE(x.ok()) << x.ToString();
    EXPECT_EQ(quiet_steps, (std::vector<int>{2, 4}));  // not 6: the run's last step
    EXPECT_EQ(avg.rounds(1), (std::vector<int64_t>{0, 1, 2}));
    return params;
  };
  const auto reference = run(false);
  const auto replaced = run(true);
  EXPECT_EQ(reference[0], reference[1]);
  EXPECT_EQ(replaced[0], reference[0]);
  EXPECT_EQ(replaced[1], reference[1]);
}

TEST(LowCommSync, StepOfExchangeFollowsTheSchedule) {
  const std::vector<float> p(8, 0.0f);
  LowCommOptions d;
  d.inner_steps = 5;
  d.total_steps = 20;
  LowCommSync dl(d, nullptr, p.data(), p.size());
  EXPECT_EQ(dl.StepOfExchange(0), 5);
  EXPECT_EQ(dl.StepOfExchange(3), 20);
  EXPECT_EQ(dl.StepOfExchange(4), -1);  // past the end (a final exchange is not scheduled)
  EXPECT_EQ(dl.StepOfExchange(-1), -1);
  LowCommOptions st;
  st.fragments = Contiguous(8, 2);
  st.inner_steps = 4;
  st.overlap = 1;
  st.total_steps = 9;
  LowCommSync sl(st, nullptr, p.data(), p.size());
  EXPECT_EQ(sl.StepOfExchange(0), 2);
  EXPECT_EQ(sl.StepOfExchange(1), 4);
  EXPECT_EQ(sl.StepOfExchange(3), 8);
  EXPECT_EQ(sl.StepOfExchange(4), -1);
}

TEST(LowCommState, RoundTripsAndRefusesBadBytes) {
  LowCommState st;
  st.completed = 30;
  st.rounds = 4;
  st.exchanges = 3;
  st.global = {1, 2, 3};
  st.momentum = {-1, 0.5f, 0};
  st.params = {7, 8, 9};
  const std::string b = EncodeLowCommState(st);
  auto back = DecodeLowCommState(b, 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->completed, 30);
  EXPECT_EQ(back->rounds, 4);
  EXPECT_EQ(back->exchanges, 3);
  EXPECT_EQ(back->global, st.global);
  EXPECT_EQ(back->momentum, st.momentum);
  EXPECT_EQ(back->params, st.params);
  EXPECT_EQ(DecodeLowCommState(b, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeLowCommState(b.substr(0, b.size() - 1), 3).status().code(),
            StatusCode::kCorruption);
  std::string bad = b;
  bad[0] = 'X';
  EXPECT_EQ(DecodeLowCommState(bad, 3).status().code(), StatusCode::kCorruption);
  // A streaming site with an exchange in flight has no quiet state.
  LowCommOptions o;
  o.fragments = Contiguous(4, 2);
  o.inner_steps = 4;
  o.overlap = 3;  // tau >= H / P: never quiet
  o.total_steps = 100;
  std::vector<float> p(4, 0.0f);
  LowCommSync s(
      o,
      [](int64_t, std::span<float>, std::span<float>, const SiteExchange::Digest&,
         double) -> StatusOr<ExchangeResult> { return ExchangeResult{}; },
      p.data(), p.size());
  for (int64_t c = 1; c <= 12; ++c) {
    ASSERT_TRUE(s.AfterStep(c, p.data()).ok());
    EXPECT_EQ(s.QuietState(c, p.data()), nullptr) << "step " << c;
    // Nor a resume state once the first fragment was sent (step 2): one is always in flight.
    EXPECT_EQ(s.ResumeState(c, p.data()) == nullptr, c >= 2) << "step " << c;
  }
  // A resume's state (version 2) carries the error feedback and the inner optimizer too.
  st.residual = {0.25f, -0.5f, 1};
  st.adam_m = {1, 1, 1};
  st.adam_v = {2, 3, 4};
  st.adam_steps = 29;
  const std::string r = EncodeLowCommState(st);
  EXPECT_EQ(r.size(), b.size() + 3 * 3 * sizeof(float) + 8);
  back = DecodeLowCommState(r, 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->params, st.params);
  EXPECT_EQ(back->residual, st.residual);
  EXPECT_EQ(back->adam_v, st.adam_v);
  EXPECT_EQ(back->adam_steps, 29);
  EXPECT_EQ(DecodeLowCommState(r.substr(0, r.size() - 4), 3).status().code(),
            StatusCode::kCorruption);
  // A version 2 state of no parameters keeps its update count through a round trip (the
  // site_state fuzzer's find: it was encoded as version 1, without it).
  LowCommState none;
  none.completed = 5;
  none.rounds = 6;
  none.exchanges = 2;
  none.adam_steps = 7;
  back = DecodeLowCommState(EncodeLowCommState(none), 0);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->adam_steps, 7);
  EXPECT_EQ(back->completed, 5);
}

// The final exchange of a run is a plain average: every site ends with the mean of the sites'
// replicas (global - mean(global - local)), not one more outer Nesterov step (outer lr 0.7,
// momentum 0.9 here would move the result far from it). Every exchange's digest, the hash of the
// new global parameters, was the same on both sites.
TEST(LowCommSync, TheFinalExchangeIsAPlainAverage) {
  LowCommOptions o;
  o.inner_steps = 2;
  o.outer_lr = 0.7f;
  o.outer_momentum = 0.9f;
  o.total_steps = 5;
  o.final_sync = true;  // 5 is not a multiple of H
  TwoSiteAverage avg;
  const size_t n = 7;
  std::vector<std::vector<float>> params(2, std::vector<float>(n, 1.0f)), at4(2), at5(2);
  std::vector<Status> st(2);
  std::vector<std::thread> th;
  for (int site = 0; site < 2; ++site)
    th.emplace_back([&, site] {
      auto& p = params[size_t(site)];
      LowCommSync s(o, avg.For(site), p.data(), n);
      for (int64_t c = 1; c <= 5; ++c) {
        for (size_t i = 0; i < n; ++i) p[i] += float(site + 1) * 0.1f * float(i + c);
        if (c == 5) at5[size_t(site)] = p;
        if (Status e = s.AfterStep(c, p.data()); !e.ok()) {
          st[size_t(site)] = e;
          return;
        }
        if (c == 4) at4[size_t(site)] = p;  // after the outer step: the global parameters
      }
      st[size_t(site)] = s.Finish(p.data());
    });
  for (auto& t : th) t.join();
  for (const auto& e : st) ASSERT_TRUE(e.ok()) << e.ToString();
  ASSERT_EQ(at4[0], at4[1]);
  for (size_t i = 0; i < n; ++i) {
    const float g = at4[0][i];
    const float mean_delta = ((g - at5[0][i]) + (g - at5[1][i])) * 0.5f;
    EXPECT_EQ(params[0][i], g - mean_delta) << i;
    EXPECT_EQ(params[1][i], params[0][i]) << i;
  }
  const auto digests = avg.digests();
  ASSERT_EQ(digests.size(), 3u);  // two outer steps and the final average
  for (const auto& [round, d] : digests) {
    EXPECT_EQ(d[0], d[1]) << "round " << round;
    EXPECT_NE(d[0], 0u) << "round " << round;
  }
}

// Sites whose outer momentum differs by one ulp (another build's rounding, a flipped bit) must
// not commit: with outer lr 0 and no progress the new global parameters are the same on both, so
// only the momentum in the digest tells them apart. Both refuse (kCorruption) and neither
// site's parameters change.
TEST(LowCommSync, SitesWhoseMomentumDisagreesCommitNothing) {
  LowCommOptions o;
  o.inner_steps = 2;
  o.outer_lr = 0.0f;
  o.outer_momentum = 1.0f;
  o.total_steps = 4;
  TwoSiteAverage avg;
  const size_t n = 5;
  std::vector<std::vector<float>> params(2, std::vector<float>(n, 1.0f));
  std::vector<Status> st(2);
  std::vector<std::thread> th;
  for (int site = 0; site < 2; ++site)
    th.emplace_back([&, site] {
      auto& p = params[size_t(site)];
      LowCommSync s(o, avg.For(site), p.data(), n);
      LowCommState state;
      state.global = p;
      state.momentum.assign(n, 0.5f);
      if (site == 1) state.momentum[3] = std::nextafter(0.5f, 1.0f);
      state.params = p;
      s.Restore(state);
      for (int64_t c = 1; c <= 2; ++c) {
        st[size_t(site)] = s.AfterStep(c, p.data());
        if (!st[size_t(site)].ok()) return;
      }
    });
  for (auto& t : th) t.join();
  for (int site = 0; site < 2; ++site) {
    EXPECT_EQ(st[size_t(site)].code(), StatusCode::kCorruption) << st[size_t(site)].ToString();
    EXPECT_EQ(params[size_t(site)], std::vector<float>(n, 1.0f)) << "site " << site;
  }
}

}  // namespace
}  // namespace atl
