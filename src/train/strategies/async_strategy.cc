// world.strategy = "async" in the training loop: AsyncClient (train/strategies/async_client.h) on
// the site's leader after every optimizer step, the pulled parameters broadcast to the site's
// other ranks, the take-over by a process that replaces a lost site (it goes on after the site's
// last decided push), and checkpoints a run resumes from: at a checkpoint's step the live sites
// meet around their push and pull (a consistent cut: they all hold the parameter server's
// parameters, which the checkpoint holds), and each keeps its error feedback and AdamW beside it;
// a resumed run's parameter server starts from the checkpoint's parameters.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <numeric>

#include "core/log.h"
#include "train/strategies/async_client.h"
#include "train/strategies/world_strategy.h"

namespace atl {

namespace {

class AsyncStrategy final : public WorldStrategy {
 public:
  AsyncStrategy(const StrategyContext& c, AsyncClient::Options o)
      : c_(c), client_(o, c.world->ps, c.n_params) {}

  StatusOr<int64_t> Start(int64_t start, float* params) override {
    const WorldHooks& w = *c_.world;
    const int64_t steps = c_.cfg->train.steps;
    if (c_.leader && w.rejoin) {
      // A new process for a lost site: a member from a checkpoint's cut on (or the barrier at
      // the end), then it goes on after the site's last decided push.
      if (!w.join) return Status::InvalidArgument("rejoin: no way to join the world");
      ATOLL_ASSIGN_OR_RETURN(join_cut_, Join(w, steps));
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&join_cut_, 1)));
    if (c_.leader) ATOLL_RETURN_IF_ERROR(client_.Start(params, c_.resumed ? start : 0));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
    // The leader's (only it has the world's hooks), to the site's ranks: whether this process
    // takes a lost site over, and whether it goes on from the site's state beside the checkpoint
    // it resumes from: the first process of a resumed run, and one that takes over a site that
    // had not pushed since the resume (its predecessor changed nothing anywhere, so it does what
    // that one would have done; the op log has no rejoin then, and replay re-executes one).
    int64_t flags[2] = {w.rejoin ? 1 : 0,
                        c_.resumed && (!w.rejoin || client_.start_step() == start) ? 1 : 0};
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(flags, 2)));
    rejoined_ = flags[0] != 0;
    // Not among the sites that meet at checkpoints: once one may have moved the lead, it does
    // not know who leads until the end (without any, site 0 leads throughout, as everywhere).
    if (rejoined_ && AnyCut(start)) lead_ = -1;
    if (flags[1] != 0) {
      int64_t adam_steps = 0;
      if (c_.leader) {
        ATOLL_ASSIGN_OR_RETURN(const std::string bytes, ReadSiteState(c_));
        ATOLL_ASSIGN_OR_RETURN(const AsyncSiteState st, DecodeAsyncSiteState(bytes, c_.n_params));
        if (st.completed != start)
          return Status::InvalidArgument(
              fmt::format("--resume: {} is of step {}, the checkpoint of step {}",
                          SiteStatePath(c_.resume_path, w.site), st.completed, start));
        client_.Restore(st);
        AdamW& o = *c_.optimizer;
        std::copy(st.adam_m.begin(), st.adam_m.end(), o.m());
        std::copy(st.adam_v.begin(), st.adam_v.end(), o.v());
        adam_steps = st.adam_steps;
      }
      ATOLL_RETURN_IF_ERROR(ShareOptimizerInSite(c_, adam_steps));
      if (rejoined_ && c_.leader)
        LogInfo(
            "site {}: rejoin: took over at step {} from the site's state beside {} (no push "
            "since)",
            w.site, start, c_.resume_path);
      return start;
    }
    if (!rejoined_) return start;
    if (c_.resumed) {
      // It goes on after its site's last push with a fresh inner optimizer, as any process that
      // takes a site over (not the checkpoint's, which another site's moments filled).
      AdamW& o = *c_.optimizer;
      std::fill(o.m(), o.m() + o.size(), 0.0f);
      std::fill(o.v(), o.v() + o.size(), 0.0f);
      o.set_step_count(0);
    }
    double at = 0;
    if (c_.leader) {
      at = double(client_.start_step());
      LogInfo("site {}: rejoin: took over after step {} (the site's last push)", w.site,
              client_.start_step());
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<double>(&at, 1)));
    if (int64_t(at) >= steps)
      return Status::Unavailable(
          fmt::format("site {}: rejoin: the site's pushes already reach the last step {}",
                      c_.world->site, steps));
    return int64_t(at);
  }

  StatusOr<bool> AfterBackward(int64_t, const SiteSums&) override { return true; }

  Status AfterStep(int64_t completed, float* params, bool last) override {
    const std::span<float> all(params, c_.n_params);
    if (last) {
      if (c_.leader)
        ATOLL_RETURN_IF_ERROR(client_.Finish(completed, params, c_.world->finish_barrier));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, all));
      finished_ = true;
    } else {
      const bool cut = CutAt(completed);
      int64_t lead = lead_;
      if (c_.leader) {
        AsyncClient::Barrier meet;
        if (cut && c_.world->commit)
          meet = [this, completed, &lead](int phase) -> Status {
            const int64_t round = AsyncCheckpointRound(completed, phase);
            StatusOr<Membership> met = c_.world->commit(round, std::nullopt);
            if (!met.ok())
              return met.status().WithContext(
                  fmt::format("the checkpoint of step {}: round {}", completed, round));
            // The lowest site that met here leads from now on (site 0 may be lost).
            if (const std::vector<int> live = met->LiveInRound(round); phase == 1 && !live.empty())
              lead = live.front();
            return Status::Ok();
          };
        ATOLL_RETURN_IF_ERROR(client_.AfterStep(completed, params, meet).status());
      }
      if (client_.PullsAt(completed)) ATOLL_RETURN_IF_ERROR(ShareInSite(c_, all));
      if (cut) {
        cut_at_ = completed;
        ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&lead, 1)));
        lead_ = int(lead);
      }
    }
    return Status::Ok();
  }

  // At a consistent cut (a checkpoint's step where the sites met, or the end): the error feedback,
  // the AdamW moments and the counters; the parameters are the checkpoint's.
  Status SaveSiteState(const std::string& dir, int64_t step, const float*) override {
    if (!c_.leader) return Status::Ok();
    if (!finished_ && cut_at_ != step) {
      LogWarning(
          "site {}: checkpoint of step {}: {}, so this site's state is not kept beside it (a "
          "resume from it is refused)",
          c_.world->site, step,
          rejoined_ && step < join_cut_
              ? fmt::format("this process took the site over and meets the others from {} on",
                            join_cut_ < c_.cfg->train.steps
                                ? fmt::format("the cut at step {}", join_cut_)
                                : std::string("the end"))
              : fmt::format("not a push step (a multiple of world.diloco.inner_steps = {})",
                            c_.cfg->world.diloco.inner_steps));
      // Not one an earlier run left in the same place: a resume must find none.
      ::unlink(SiteStatePath(dir, c_.world->site).c_str());
      return Status::Ok();
    }
    const AdamW& o = *c_.optimizer;
    AsyncSiteState st;
    st.completed = step;
    st.pushes = client_.pushes();
    st.refused = client_.refused();
    st.residual.assign(client_.residual().begin(), client_.residual().end());
    st.adam_m.assign(o.m(), o.m() + o.size());
    st.adam_v.assign(o.v(), o.v() + o.size());
    st.adam_steps = o.step_count();
    return WriteSiteState(c_, dir, EncodeAsyncSiteState(st));
  }

  void Fill(StepMetrics* m) const override {
    m->site = c_.world->site;
    m->wan_ms = client_.last_wait_s() * 1e3;
    m->wan_bytes_sent = client_.bytes_sent();
    m->sync_bytes_sent = SyncBytesByStep(*c_.cfg, m->step);
    m->outer_rounds = client_.pushes();
  }

  std::string Summary() const override {
    if (!c_.leader) return "";
    return fmt::format(
        "site {}: {} pushes ({} refused as stale), {:.1f} MB pushed, {:.1f} MB "
        "pulled",
        c_.world->site, client_.pushes(), client_.refused(), double(client_.bytes_sent()) / 1e6,
        double(client_.bytes_received()) / 1e6);
  }
  bool whole_batch() const override { return false; }
  int lead_site() const override { return lead_; }

  // The agreements take the rounds after the barrier at the end. Before it, site 0 leads, then
  // the lowest site that met at the last checkpoint's cut (the sites are at different steps; a
  // process that took a site over meets them only at the end, and leads nothing before it).
  Status AgreeOnLive() override {
    if (!finished_) return Status::Ok();
    ATOLL_ASSIGN_OR_RETURN(
        lead_,
        LowestLiveAfterTheEnd(c_, AsyncEndRound(c_.cfg->train.steps) + 1 + agreements_++, lead_));
    return Status::Ok();
  }

 private:
  // Whether the sites meet around the push after step `completed` (a checkpoint's step before the
  // last that is a push step; not a process that took a site over: it is a member only from the
  // end on).
  bool CutAt(int64_t completed) const {
    const int64_t every = c_.cfg->train.checkpoint_every;
    return every > 0 && completed % every == 0 && client_.PullsAt(completed) &&
           completed < c_.cfg->train.steps && completed >= join_cut_;
  }

  // A new process for a lost site registers for the cut after the next one past the latest
  // coordinator round any process of the world reached (its predecessor's too, which may have
  // pushed at the next cut's step before it died: this process goes on after that push, so it
  // could not meet there), or for the barrier at the end when there is no such cut. The others
  // wait for it at that cut while it catches up. The cut's step (train.steps: the end).
  StatusOr<int64_t> Join(const WorldHooks& w, int64_t steps) {
    const std::string who = fmt::format("site {}: rejoin", w.site);
    const int64_t every = c_.cfg->train.checkpoint_every, h = c_.cfg->world.diloco.inner_steps;
    for (int tries = 0; every > 0 && w.current_round && tries < 8; ++tries) {
      ATOLL_ASSIGN_OR_RETURN(const int64_t reached, w.current_round());
      const int64_t l = std::lcm(every, h);
      // The first cut whose first round (2c - 1) is past `reached`, then the one after it.
      const int64_t k = ((std::max<int64_t>(reached, 0) + 1) / 2 / l + 2) * l;
      if (k >= steps) break;
      Status st = w.join(AsyncCheckpointRound(k, 0), 0);
      if (st.ok()) {
        LogInfo("{}: meets the others from the checkpoint cut at step {} on", who, k);
        return k;
      }
      if (st.code() != StatusCode::kNotFound) return st.WithContext(who);
      // A live site began that round meanwhile: the next cut.
    }
    ATOLL_RETURN_IF_ERROR(w.join(AsyncEndRound(steps), 0).WithContext(who));
    return steps;
  }

  // Whether the run has a cut after step `from`: a checkpoint step before the last that is a
  // push step (CutAt).
  bool AnyCut(int64_t from) const {
    const int64_t every = c_.cfg->train.checkpoint_every, h = c_.cfg->world.diloco.inner_steps;
    if (every <= 0) return false;
    const int64_t l = std::lcm(every, h);
    return (from / l + 1) * l < c_.cfg->train.steps;
  }

  const StrategyContext c_;
  AsyncClient client_;
  int lead_ = 0;
  bool finished_ = false;   // after the barrier at the end
  bool rejoined_ = false;   // this process took a lost site over
  int64_t join_cut_ = 0;    // ... and meets the others from this cut's step on (steps: the end)
  int64_t cut_at_ = -1;     // the step of the last consistent cut
  int64_t agreements_ = 0;  // AgreeOnLive's rounds after it
};

}  // namespace

StatusOr<std::unique_ptr<WorldStrategy>> MakeAsyncStrategy(const StrategyContext& c) {
  const WorldConfig& w = c.cfg->world;
  if (c.leader && c.world->ps == nullptr)
    return Status::InvalidArgument("world.strategy = \"async\" needs the parameter server");
  ATOLL_ASSIGN_OR_RETURN(const Codec codec, ParseCodec(w.codec));
  return std::unique_ptr<WorldStrategy>(std::make_unique<AsyncStrategy>(
      c, AsyncClient::Options{.site = c.world->site,
                              .sites = int(w.sites),
                              .inner_steps = w.diloco.inner_steps,
                              .max_staleness = w.async.max_staleness,
                              .codec = codec}));
}

}  // namespace atl
