#include "train/strategy.h"

#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "core/hash.h"

namespace atl {
namespace {

TEST(OuterNesterov, MatchesPyTorchSgdWithNesterov) {
  // torch.optim.SGD([p], lr=0.7, momentum=0.9, nesterov=True), grad d, two steps.
  std::vector<float> p = {1.0f, -2.0f}, m = {0.0f, 0.0f};
  const std::vector<float> d1 = {0.5f, 0.25f}, d2 = {-1.0f, 0.125f};
  OuterNesterov(p, d1, m, 0.7f, 0.9f);
  // buf = d1; p -= 0.7 * (d1 + 0.9 * buf) = 0.7 * 1.9 * d1
  EXPECT_FLOAT_EQ(m[0], 0.5f);
  EXPECT_FLOAT_EQ(p[0], 1.0f - 0.7f * 1.9f * 0.5f);
  EXPECT_FLOAT_EQ(p[1], -2.0f - 0.7f * 1.9f * 0.25f);
  const float p0 = p[0];
  OuterNesterov(p, d2, m, 0.7f, 0.9f);
  const float buf = 0.9f * 0.5f + -1.0f;
  EXPECT_FLOAT_EQ(m[0], buf);
  EXPECT_FLOAT_EQ(p[0], p0 - 0.7f * (-1.0f + 0.9f * buf));
}

TEST(SplitEvenly, CoversEverythingInOrder) {
  const auto r = SplitEvenly(10, 4);
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].begin, 0u);
  EXPECT_EQ(r[0].end, 3u);
  EXPECT_EQ(r[1].end, 6u);
  EXPECT_EQ(r[2].end, 8u);
  EXPECT_EQ(r[3].end, 10u);
}

TEST(LowCommSync, StaggeredScheduleSendsEachFragmentEveryHSteps) {
  LowCommOptions o;
  o.fragments = 4;
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

// Two sites in threads, averaging through a shared slot (what SiteExchange does over the WAN).
class TwoSiteAverage {
 public:
  LowCommSync::Average For(int site) {
    return [this, site](int64_t round, std::span<float> data,
                        std::span<float>) -> StatusOr<ExchangeResult> {
      {
        std::lock_guard lock(mu_);
        rounds_[site].push_back(round);
        auto& slot = slots_[round];
        slot.resize(2);
        slot[size_t(site)].assign(data.begin(), data.end());
      }
      sync_.arrive_and_wait();
      {
        std::lock_guard lock(mu_);
        const auto& slot = slots_[round];
        for (size_t i = 0; i < data.size(); ++i) data[i] = (slot[0][i] + slot[1][i]) * 0.5f;
      }
      sync_.arrive_and_wait();
      ExchangeResult r;
      r.sites = {0, 1};
      r.bytes_sent = data.size() * sizeof(float);
      return r;
    };
  }
  std::vector<int64_t> rounds(int site) {
    std::lock_guard lock(mu_);
    return rounds_[site];
  }

 private:
  std::barrier<> sync_{2};
  std::mutex mu_;
  std::map<int64_t, std::vector<std::vector<float>>> slots_;
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
      for (int64_t c = 1; c <= 5; ++c) {
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
  o.fragments = 2;
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
  st.fragments = 2;
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
  o.fragments = 2;
  o.inner_steps = 4;
  o.overlap = 3;  // tau >= H / P: never quiet
  o.total_steps = 100;
  std::vector<float> p(4, 0.0f);
  LowCommSync s(
      o,
      [](int64_t, std::span<float>, std::span<float>) -> StatusOr<ExchangeResult> {
        return ExchangeResult{};
      },
      p.data(), p.size());
  for (int64_t c = 1; c <= 12; ++c) {
    ASSERT_TRUE(s.AfterStep(c, p.data()).ok());
    EXPECT_EQ(s.QuietState(c, p.data()), nullptr) << "step " << c;
  }
}

// An in-memory parameter server (the coordinator's semantics, world/ps.h).
class MemoryServer : public ParameterServer {
 public:
  StatusOr<int64_t> Init(std::span<const float> p, int64_t s) override {
    std::lock_guard lock(mu_);
    if (params_.empty()) {
      params_.assign(p.begin(), p.end());
      staleness_ = s;
    }
    return int64_t(0);
  }
  StatusOr<int64_t> Pull(std::span<float> p) override {
    std::lock_guard lock(mu_);
    std::copy(params_.begin(), params_.end(), p.begin());
    return version_;
  }
  StatusOr<PsPushResult> Push(const PsUpdate& u) override {
    std::lock_guard lock(mu_);
    PsPushResult r;
    r.update_id = next_id_++;
    if (version_ - u.base_version <= staleness_) {
      std::vector<float> d(params_.size());
      ATOLL_RETURN_IF_ERROR(Decode(u.encoded, d));
      ApplyUpdate(params_, d, u.weight);
      r.accepted = true;
      r.applied_version = ++version_;
    }
    r.current_version = version_;
    log_.push_back(u);
    return r;
  }
  std::vector<PsUpdate> log_;
  std::vector<float> params_;
  int64_t version_ = 0;

 private:
  std::mutex mu_;
  int64_t staleness_ = 0, next_id_ = 0;
};

TEST(AsyncClient, PushesProgressEveryHStepsAndPullsTheServersParameters) {
  MemoryServer ps;
  const size_t n = 4;
  std::vector<float> p(n, 1.0f);
  AsyncClient c({.site = 1, .sites = 2, .inner_steps = 3, .max_staleness = 0}, &ps, n);
  ASSERT_TRUE(c.Start(p.data()).ok());
  for (int64_t step = 1; step <= 7; ++step) {
    for (float& x : p) x += 2.0f;  // progress of 2 per step
    auto changed = c.AfterStep(step, p.data());
    ASSERT_TRUE(changed.ok());
    EXPECT_EQ(*changed, step % 3 == 0);
    if (step == 3) {
      EXPECT_FLOAT_EQ(p[0], 1.0f + 0.5f * 6.0f);  // weight 1 / sites
    }
  }
  ASSERT_TRUE(c.Finish(7, p.data(), nullptr).ok());
  ASSERT_EQ(ps.log_.size(), 3u);  // steps 1..3, 4..6, 7..7
  EXPECT_EQ(ps.log_[0].first_step, 1);
  EXPECT_EQ(ps.log_[0].last_step, 3);
  EXPECT_EQ(ps.log_[1].base_version, 1);
  EXPECT_EQ(ps.log_[2].first_step, 7);
  EXPECT_EQ(ps.log_[2].last_step, 7);
  EXPECT_FLOAT_EQ(p[0], 1.0f + 0.5f * (6 + 6 + 2));
  EXPECT_EQ(c.pushes(), 3);
  EXPECT_EQ(c.bytes_sent(), 3 * EncodedBytes(Codec::kNone, n));
}

TEST(AsyncClient, AStaleUpdateIsRefusedAndTheSiteGoesOnFromTheServer) {
  MemoryServer ps;
  const size_t n = 2;
  std::vector<float> a(n, 0.0f), b(n, 0.0f);
  AsyncClient ca({.site = 0, .sites = 2, .inner_steps = 1, .max_staleness = 0}, &ps, n);
  AsyncClient cb({.site = 1, .sites = 2, .inner_steps = 1, .max_staleness = 0}, &ps, n);
  ASSERT_TRUE(ca.Start(a.data()).ok());
  ASSERT_TRUE(cb.Start(b.data()).ok());
  a[0] += 2.0f;
  ASSERT_TRUE(ca.AfterStep(1, a.data()).ok());  // applied: version 1
  b[0] += 4.0f;
  ASSERT_TRUE(cb.AfterStep(1, b.data()).ok());  // base 0, now 1 > 0 behind: refused
  EXPECT_EQ(cb.refused(), 1);
  EXPECT_EQ(ps.version_, 1);
  EXPECT_EQ(b, ps.params_);  // b pulled the server's parameters
  EXPECT_FLOAT_EQ(b[0], 1.0f);
}

}  // namespace
}  // namespace atl
