// AsyncClient against an in-memory parameter server: pushes every H steps, pulls, stale
// updates refused, and a refused push gives back the error feedback it consumed.
#include "train/strategies/async_client.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

namespace atl {
namespace {

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

// A refused update changed nothing on the server, so the residual it was encoded with (what int4
// dropped from earlier pushes, folded into this one) must be as before the push: otherwise that
// part of the site's progress is lost for good. The next accepted push carries it.
TEST(AsyncClient, ARefusedPushGivesBackTheResidualItConsumed) {
  MemoryServer ps;
  const size_t n = 64;
  std::vector<float> a(n, 0.0f), b(n, 0.0f);
  const AsyncClient::Options oa{
      .site = 0, .sites = 2, .inner_steps = 1, .max_staleness = 0, .codec = Codec::kInt4};
  AsyncClient ca(oa, &ps, n);
  AsyncClient cb(
      {.site = 1, .sites = 2, .inner_steps = 1, .max_staleness = 0, .codec = Codec::kInt4}, &ps, n);
  ASSERT_TRUE(cb.Start(b.data()).ok());
  // Site 1's first push is accepted and leaves a residual (int4 cannot hold these values).
  for (size_t i = 0; i < n; ++i) b[i] += 0.001f * float(i % 7) + (i == 0 ? 1.0f : 0.0f);
  ASSERT_TRUE(cb.AfterStep(1, b.data()).ok());
  ASSERT_EQ(cb.refused(), 0);
  ASSERT_TRUE(ca.Start(a.data()).ok());  // starts from version 1
  const std::vector<float> residual(cb.residual().begin(), cb.residual().end());
  float mag = 0;
  for (float r : residual) mag += std::abs(r);
  ASSERT_GT(mag, 0.0f) << "int4 left no residual: the test proves nothing";
  // Site 0 pushes: version 2. Site 1's next push is from version 1: refused.
  a[0] += 1.0f;
  ASSERT_TRUE(ca.AfterStep(1, a.data()).ok());
  ASSERT_EQ(ca.refused(), 0);
  for (size_t i = 0; i < n; ++i) b[i] += 0.002f * float(i % 5);
  ASSERT_TRUE(cb.AfterStep(2, b.data()).ok());
  ASSERT_EQ(cb.refused(), 1);
  const std::vector<float> after(cb.residual().begin(), cb.residual().end());
  EXPECT_EQ(after, residual) << "the refused push consumed the residual";
}

// A checkpoint's step with a barrier: push, meet (phase 0), pull, meet (phase 1), in that order;
// the pull takes what every site pushed before the first meeting.
TEST(AsyncClient, ABarrierStepPushesMeetsPullsAndMeetsAgain) {
  MemoryServer ps;
  const size_t n = 2;
  std::vector<float> p(n, 0.0f), other(n, 0.0f);
  AsyncClient c({.site = 0, .sites = 2, .inner_steps = 2, .max_staleness = 4}, &ps, n);
  AsyncClient d({.site = 1, .sites = 2, .inner_steps = 2, .max_staleness = 4}, &ps, n);
  ASSERT_TRUE(c.Start(p.data()).ok());
  ASSERT_TRUE(d.Start(other.data()).ok());
  std::vector<std::string> order;
  for (float& x : p) x += 4.0f;
  for (float& x : other) x += 2.0f;
  auto meet = [&](int phase) -> Status {
    order.push_back(fmt::format("meet {} after {} pushes", phase, ps.log_.size()));
    // The other site pushes before the first meeting ends (it meets too).
    if (phase == 0) EXPECT_TRUE(d.AfterStep(2, other.data()).ok());
    return Status::Ok();
  };
  auto changed = c.AfterStep(2, p.data(), meet);
  ASSERT_TRUE(changed.ok()) << changed.status().ToString();
  EXPECT_TRUE(*changed);
  EXPECT_EQ(order, (std::vector<std::string>{"meet 0 after 1 pushes", "meet 1 after 2 pushes"}));
  EXPECT_FLOAT_EQ(p[0], 0.5f * 4 + 0.5f * 2);  // both pushes are in the pulled parameters
  // A failed meeting fails the step.
  auto failed = c.AfterStep(4, p.data(), [](int) { return Status::Unavailable("site 1 lost"); });
  EXPECT_EQ(failed.status().code(), StatusCode::kUnavailable);
}

TEST(AsyncSiteState, RoundTripsAndCatchesDamage) {
  AsyncSiteState st;
  st.completed = 8;
  st.pushes = 2;
  st.refused = 1;
  st.adam_steps = 8;
  st.residual = {0.5f, -0.25f, 1e-3f};
  st.adam_m = {1, 2, 3};
  st.adam_v = {4, 5, 6};
  const std::string bytes = EncodeAsyncSiteState(st);
  auto back = DecodeAsyncSiteState(bytes, 3);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->completed, 8);
  EXPECT_EQ(back->pushes, 2);
  EXPECT_EQ(back->refused, 1);
  EXPECT_EQ(back->adam_steps, 8);
  EXPECT_EQ(back->residual, st.residual);
  EXPECT_EQ(back->adam_m, st.adam_m);
  EXPECT_EQ(back->adam_v, st.adam_v);
  EXPECT_EQ(DecodeAsyncSiteState(bytes, 4).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(DecodeAsyncSiteState(bytes.substr(0, bytes.size() - 1), 3).status().code(),
            StatusCode::kCorruption);
  for (size_t at : {size_t(20), size_t(50), bytes.size() - 2}) {
    std::string bad = bytes;
    bad[at] ^= 0x10;
    auto d = DecodeAsyncSiteState(bad, 3);
    EXPECT_EQ(d.status().code(), StatusCode::kCorruption) << "flip at " << at;
  }
}

}  // namespace
}  // namespace atl
