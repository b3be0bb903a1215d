// world.strategy = "diloco" / "streaming" in the training loop: LowCommSync
// (train/strategies/lowcomm.h) on the site's leader after every optimizer step, the merged
// fragments broadcast to the site's other ranks, the quiet-point states published for rejoins,
// and the take-over by a process that replaces a lost site.
#include <fmt/format.h>
#include <unistd.h>

#include "core/file.h"
#include "core/log.h"
#include "train/strategies/balance.h"
#include "train/strategies/lowcomm.h"
#include "train/strategies/world_strategy.h"
#include "world/codec.h"

namespace atl {

namespace {

// A rejoining site's leader: reserves its place at exchange J = (the latest one a live site has
// begun) + 2, so the others wait for it there and not before, then waits for the state that
// leads into J (published when exchange J - 1 is merged), which it fetches (RegisterAndFetch).
// The others wait at J about as long as the fetch takes: the newcomer trains its H steps beside
// theirs.
StatusOr<LowCommState> TakeOver(const WorldHooks& w, const LowCommSync& sync, size_t n) {
  ATOLL_ASSIGN_OR_RETURN(const FetchedState got,
                         RegisterAndFetch(
                             w, kRoundsPerExchange, /*early_by=*/0,
                             [&](int64_t J) {
                               return fmt::format("exchange round {} (after step {})", J,
                                                  sync.StepOfExchange(J));
                             },
                             [&](int64_t J) { return sync.StepOfExchange(J) < 0; }));
  ATOLL_ASSIGN_OR_RETURN(LowCommState st, DecodeLowCommState(got.bytes, n));
  if (st.rounds != got.unit)
    return Status::Internal(
        fmt::format("site {}: rejoin: a live site's state is for exchange round {}, not round {} "
                    "it should wait at",
                    w.site, st.rounds, got.unit));
  LogInfo("site {}: rejoin: took over at step {}; joining at exchange round {}", w.site,
          st.completed, got.unit);
  return st;
}

class LowCommStrategy final : public WorldStrategy {
 public:
  LowCommStrategy(const StrategyContext& c, LowCommOptions options)
      : c_(c), options_(std::move(options)) {}

  StatusOr<int64_t> Start(int64_t start, float* params) override {
    const WorldHooks& w = *c_.world;
    auto average = w.average;  // the leader's; the other ranks only follow the schedule
    sync_ = std::make_unique<LowCommSync>(options_, std::move(average), params, c_.n_params);
    if (c_.resumed) return Resume(start, params);
    // The leader's (only it has the world's hooks): a new process for a lost site on every rank.
    int64_t rejoin = w.rejoin ? 1 : 0;
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&rejoin, 1)));
    if (rejoin == 0) return start;
    // Where the leader goes on from, and its parameters, to the site's other ranks.
    double at = 0;
    if (c_.leader) {
      ATOLL_ASSIGN_OR_RETURN(const LowCommState st, TakeOver(w, *sync_, c_.n_params));
      sync_->Restore(st);
      std::copy(st.params.begin(), st.params.end(), params);
      at = double(st.completed);
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<double>(&at, 1)));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
    // Not among the last merged exchange's sites: no site here leads until its first merge.
    lead_ = -1;
    return int64_t(at);
  }

  // world.balance: the leader's pace (seconds per micro-batch, smoothed over steps), which it
  // votes with in the exchanges it starts. An audit replay's second execution is not counted.
  StatusOr<bool> AfterBackward(int64_t step, const SiteSums& sums) override {
    const size_t me = size_t(c_.world->site);
    if (c_.leader && step > paced_step_ && me < sums.seconds.size() && sums.seconds[me] > 0) {
      pace_ = pace_ > 0 ? 0.5 * pace_ + 0.5 * sums.seconds[me] : sums.seconds[me];
      sync_->SetPace(pace_);
      paced_step_ = step;
    }
    return true;
  }

  // world.balance: after a merge, the step's micro-batches are shared among the sites of the
  // merged exchange by the paces they voted with there (so every site computes the same
  // shares, and a lost site's micro-batches go to the live ones); until the first merge, and on
  // a site that is not among its sites (one that came back and has not merged yet), each site
  // trains on its own part. The sites train apart, so shares change only what each one computes.
  std::vector<std::pair<int64_t, int64_t>> Share(int64_t) override {
    std::vector<int> live;
    std::vector<int64_t> counts;
    for (size_t s = 0; s < counts_.size(); ++s)
      if (counts_[s] > 0) {
        live.push_back(int(s));
        counts.push_back(counts_[s]);
      }
    return ShareOfSite(live, counts, c_.world->site);
  }

  Status AfterStep(int64_t completed, float* params, bool last) override {
    const WorldHooks& w = *c_.world;
    if (c_.leader) {
      ATOLL_RETURN_IF_ERROR(sync_->AfterStep(completed, params));
      if (w.publish)
        if (auto state = sync_->QuietState(completed, params))
          w.publish(uint64_t(sync_->rounds()), std::move(state));
    }
    const std::vector<int> merged = sync_->Merges(completed);
    for (int f : merged)
      for (const Range& r : sync_->fragments()[size_t(f)].ranges)
        ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params + r.begin, r.size())));
    if (!merged.empty()) ATOLL_RETURN_IF_ERROR(AfterMerge(completed));
    wait_s_ = sync_->last_wait_s();
    if (last) {
      if (c_.leader) ATOLL_RETURN_IF_ERROR(sync_->Finish(params));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
      ATOLL_RETURN_IF_ERROR(ShareLead());
      wait_s_ += sync_->last_wait_s();
      finished_ = true;
    }
    return Status::Ok();
  }

  int lead_site() const override { return lead_; }

  // After the final exchange no exchange round follows: the agreements take the rounds after it.
  Status AgreeOnLive() override {
    if (!finished_) return Status::Ok();  // mid-run: the last merged exchange's live sites lead
    ATOLL_ASSIGN_OR_RETURN(
        lead_,
        LowestLiveAfterTheEnd(c_, kRoundsPerExchange * sync_->rounds() + agreements_++, lead_));
    return Status::Ok();
  }

  void Fill(StepMetrics* m) const override {
    m->site = c_.world->site;
    m->wan_ms = wait_s_ * 1e3;
    m->wan_bytes_sent = c_.world->wan_bytes ? c_.world->wan_bytes() : sync_->bytes_sent();
    m->sync_bytes_sent = SyncBytesByStep(*c_.cfg, m->step);
    m->outer_rounds = sync_->exchanges();
  }

  std::string Summary() const override {
    if (!c_.leader) return "";
    return fmt::format("site {}: {} exchanges ({}), {:.1f} MB sent over the WAN", c_.world->site,
                       sync_->exchanges(), c_.cfg->world.strategy,
                       double(sync_->bytes_sent()) / 1e6);
  }
  bool whole_batch() const override { return false; }

 private:
  const StrategyContext c_;
  const LowCommOptions options_;
  // A resumed run: this site's state beside the checkpoint (SaveSiteState): its replica, the
  // global parameters and momentum, the error feedback, its inner optimizer, the counters.
  StatusOr<int64_t> Resume(int64_t start, float* params) {
    AdamW& o = *c_.optimizer;
    int64_t adam_steps = 0;
    if (c_.leader) {
      ATOLL_ASSIGN_OR_RETURN(const std::string bytes, ReadSiteState(c_));
      ATOLL_ASSIGN_OR_RETURN(LowCommState st, DecodeLowCommState(bytes, c_.n_params));
      const std::string path = SiteStatePath(c_.resume_path, c_.world->site);
      if (st.residual.empty() || st.adam_m.size() != o.size())
        return Status::InvalidArgument(fmt::format("--resume: {} is not a resume state", path));
      if (st.completed != start)
        return Status::InvalidArgument(fmt::format(
            "--resume: {} is of step {}, the checkpoint of step {}", path, st.completed, start));
      sync_->Restore(st);
      std::copy(st.params.begin(), st.params.end(), params);
      std::copy(st.adam_m.begin(), st.adam_m.end(), o.m());
      std::copy(st.adam_v.begin(), st.adam_v.end(), o.v());
      adam_steps = st.adam_steps;
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
    ATOLL_RETURN_IF_ERROR(ShareOptimizerInSite(c_, adam_steps));
    return start;  // site 0 leads until the first merge, as at a fresh start
  }

  // Every rank keeps the same inner optimizer (tp = pp = 1, no ZeRO with sites): the leader
  // writes the site's state.
  Status SaveSiteState(const std::string& dir, int64_t step, const float* params) override {
    if (!c_.leader) return Status::Ok();
    std::unique_ptr<LowCommState> st = sync_->ResumeState(step, params);
    if (st == nullptr) {
      LogWarning(
          "site {}: checkpoint of step {}: an exchange is in flight, so this site's state is not "
          "kept beside it (a resume from it is refused)",
          c_.world->site, step);
      ::unlink(SiteStatePath(dir, c_.world->site).c_str());  // not an earlier run's: refused
      return Status::Ok();
    }
    const AdamW& o = *c_.optimizer;
    st->adam_m.assign(o.m(), o.m() + o.size());
    st->adam_v.assign(o.v(), o.v() + o.size());
    st->adam_steps = o.step_count();
    return WriteSiteState(c_, dir, EncodeLowCommState(*st));
  }

  // After a merge: the lead (ShareLead) and, with world.balance, the shares (counts_) that follow
  // from the merged exchange's paces, to the site's ranks.
  Status AfterMerge(int64_t completed) {
    ATOLL_RETURN_IF_ERROR(ShareLead());
    const RunConfig& cfg = *c_.cfg;
    if (!cfg.world.balance || completed >= cfg.train.steps) return Status::Ok();
    const int64_t sites = cfg.world.sites;
    const int64_t total = sites * LocalAccum(cfg);
    std::vector<int64_t> counts(size_t(sites), 0);
    if (c_.leader) {
      const std::vector<int>& live = sync_->last_sites();
      const std::vector<int64_t> got = BalancedCounts(live, sync_->last_paces(), total);
      for (size_t i = 0; i < live.size(); ++i) counts[size_t(live[i])] = got[i];
      if (counts != counts_) {
        std::string list;
        for (size_t i = 0; i < live.size(); ++i)
          list += fmt::format("{}site {}: {}", i ? ", " : "", live[i], got[i]);
        LogInfo("step {}: shares of the {} micro-batches (world.balance): {}", completed + 1, total,
                list);
      }
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(counts)));
    counts_ = std::move(counts);
    return Status::Ok();
  }

  // The lowest live site of the last merged exchange (the leader's) to the site's ranks.
  Status ShareLead() override {
    int64_t lead = c_.leader && !sync_->last_sites().empty() ? sync_->last_sites().front() : lead_;
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&lead, 1)));
    lead_ = int(lead);
    return Status::Ok();
  }

  std::unique_ptr<LowCommSync> sync_;
  double wait_s_ = 0;
  int lead_ = 0;            // lead_site()
  bool finished_ = false;   // after the final exchange
  int64_t agreements_ = 0;  // AgreeOnLive's rounds after it
  // world.balance: the leader's smoothed pace and the last step it counted; the shares by site
  // (0: none; empty: each site its own part).
  double pace_ = 0;
  int64_t paced_step_ = -1;
  std::vector<int64_t> counts_;
};

}  // namespace

StatusOr<std::unique_ptr<WorldStrategy>> MakeLowCommStrategy(const StrategyContext& c) {
  const RunConfig& cfg = *c.cfg;
  const WorldConfig& w = cfg.world;
  if (c.leader && !c.world->average)
    return Status::InvalidArgument(
        fmt::format("world.strategy = \"{}\" needs the exchange among the sites", w.strategy));
  // Fragments are cut from the whole model's layout: a rank holding a shard of it (tp or pp > 1,
  // refused with several sites by the config check) would be written out of bounds.
  if (c.n_params != size_t(NumParameters(cfg.model)))
    return Status::InvalidArgument(fmt::format(
        "world.strategy = \"{}\" needs every rank to hold the whole model ({} parameters, this "
        "rank {}): parallel.tp = parallel.pp = 1",
        w.strategy, NumParameters(cfg.model), c.n_params));
  const bool streaming = w.strategy == "streaming";
  LowCommOptions lo;
  lo.fragments = streaming ? StreamingFragments(cfg.model, int(w.streaming.fragments))
                           : WholeBuffer(c.n_params);
  lo.inner_steps = w.diloco.inner_steps;
  lo.overlap = streaming ? w.streaming.overlap_steps : 0;
  lo.alpha = streaming ? float(w.streaming.alpha) : 0.0f;
  lo.outer_lr = float(w.diloco.outer_lr);
  lo.outer_momentum = float(w.diloco.outer_momentum);
  lo.total_steps = cfg.train.steps;
  lo.final_sync = streaming || cfg.train.steps % w.diloco.inner_steps != 0;
  return std::unique_ptr<WorldStrategy>(std::make_unique<LowCommStrategy>(c, std::move(lo)));
}

}  // namespace atl
