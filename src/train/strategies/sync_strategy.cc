// world.strategy = "sync": every step, the sites' gradients are summed over the WAN, so the sites'
// replicas are data-parallel replicas of one model and the loss curve is the single-site one up
// to float rounding (bit for bit with parallel.reproducible, whose int64 sums cross the WAN).
// Hierarchical: the site's ranks have summed their gradients already; the leader sums the site's
// sum with the other leaders' (the WAN's ring while every site is live, world/wan.h), then
// broadcasts it to the site's ranks.
//
// Elastic: the sums of every step are agreed in a coordinator round with votes (did this site's
// sum succeed, and a digest of it). When a site of the step is dead in that round, no site
// commits: the live sites re-form (LiveSites, world/live_sites.h: direct sends among them), take
// over the lost site's micro-batches (lost site i of the sorted lost ones goes to live site
// i mod |live|) and compute the step again, so the global batch and its samples do not change:
// in the reproducible mode the parameters stay bitwise those of a run that lost nothing.
// A lost site's new process registers for a later step, fetches the state the live sites serve
// for it, and is taken in at that step's first round (Join), where the step is computed again.
// Validation and checkpoints move to the lowest live site (AgreeOnLive before them). The
// detectors' collectives over the sites are followed by a round too (Elastic), where a site that
// failed one says so: a site lost in the middle of a collective can fail it on some sites only.
//
// The sites hold one model, so the corruption detectors compare it across them
// (GatherOverSites) and replay a step on every site together (SumOverSites).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "core/hash.h"
#include "core/log.h"
#include "train/sdc/memory.h"
#include "train/strategies/balance.h"
#include "train/strategies/sync_state.h"
#include "train/strategies/world_strategy.h"
#include "world/live_sites.h"

namespace atl {

StatusOr<SyncState> FetchSyncState(const WorldHooks& w, int64_t steps, size_t n, size_t k,
                                   int sites) {
  // Registered before any live site began step J - 1's rounds, so each of them sees it in the
  // reply of its first round of step J - 1 and publishes J's state after it (AfterStep).
  ATOLL_ASSIGN_OR_RETURN(const FetchedState got,
                         RegisterAndFetch(
                             w, kSyncRoundsPerStep, /*early_by=*/kSyncRoundsPerStep,
                             [](int64_t J) { return fmt::format("step {}", J + 1); },
                             [&](int64_t J) { return J >= steps; }));
  ATOLL_ASSIGN_OR_RETURN(SyncState st, DecodeSyncState(got.bytes, n, k, sites));
  if (st.step != got.unit)
    return Status::Internal(fmt::format(
        "site {}: rejoin: a live site's state leads into step {}, not step {} this site "
        "registered for",
        w.site, st.step + 1, got.unit + 1));
  LogInfo("site {}: rejoin: took over at step {} (live sites {})", w.site, st.step + 1,
          SiteList(st.live));
  return st;
}

namespace {

// Sums that every live site voted a failure for, in a row, before the run gives up.
constexpr int kFailedSums = 3;

class SyncStrategy final : public WorldStrategy {
 public:
  explicit SyncStrategy(const StrategyContext& c) : c_(c) {
    for (int s = 0; s < int(c.cfg->world.sites); ++s) live_.push_back(s);
    linked_ = c.world->addresses;
    linked_.resize(size_t(c.cfg->world.sites));
    quorum_ = c.cfg->world.quorum > 0 ? int(c.cfg->world.quorum) : int(live_.size() / 2 + 1);
  }

  StatusOr<int64_t> Start(int64_t start, float* params) override {
    int64_t flags[2] = {c_.world->commit ? 1 : 0, c_.world->rejoin ? 1 : 0};  // the leader's
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(flags)));
    elastic_ = flags[0] == 1;
    return flags[1] == 1 ? TakeOver(params) : start;
  }

  StatusOr<std::vector<int>> TakenOver() override {
    if (joining_ && c_.leader) ATOLL_RETURN_IF_ERROR(Join());
    joining_ = false;
    // The leader may have adopted a new live set in a detector's collective (Elastic): the
    // site's ranks take it before they choose their micro-batches.
    ATOLL_RETURN_IF_ERROR(ShareLive());
    std::vector<int> lost, mine;
    for (int s = 0; s < int(c_.cfg->world.sites); ++s)
      if (!std::binary_search(live_.begin(), live_.end(), s)) lost.push_back(s);
    for (size_t i = 0; i < lost.size(); ++i)
      if (live_[i % live_.size()] == c_.world->site) mine.push_back(lost[i]);
    return mine;
  }

  // world.balance: the shares by the seconds per micro-batch the sites measured in the last
  // agreed step, while the live sites are those it was measured with (after a change: equal
  // shares for a step, which a joiner, with no measurement, computes alike). Fixed for a step.
  std::vector<std::pair<int64_t, int64_t>> Share(int64_t step) override {
    if (!c_.cfg->world.balance) return {};
    if (step != share_step_ || generation_ != share_generation_) {
      const int64_t total = int64_t(c_.cfg->world.sites) * LocalAccum(*c_.cfg);
      const std::vector<double> none;
      const std::vector<int64_t> counts =
          BalancedCounts(live_, measured_generation_ == generation_ ? seconds_ : none, total);
      share_ = ShareOfSite(live_, counts, c_.world->site);
      share_step_ = step;
      share_generation_ = generation_;
      if (c_.leader && counts != last_counts_) {
        std::string list;
        for (size_t i = 0; i < live_.size(); ++i)
          list += fmt::format("{}site {}: {}", i ? ", " : "", live_[i], counts[i]);
        LogInfo("step {}: shares of the {} micro-batches (world.balance): {}", step + 1, total,
                list);
        last_counts_ = counts;
      }
    }
    return share_;
  }

  Status AgreeOnLive() override {
    if (c_.leader && c_.world->commit) {
      ATOLL_ASSIGN_OR_RETURN(const int64_t round, NextRound());
      ATOLL_ASSIGN_OR_RETURN(const Membership agreed, Commit(round, RoundVote{}));
      ATOLL_RETURN_IF_ERROR(Adopt(agreed, round, fmt::format("after step {}", step_ + 1)).status());
    }
    return ShareLive();
  }

  int64_t generation() const override { return generation_; }
  bool elastic() const override { return elastic_; }

  StatusOr<bool> AfterBackward(int64_t step, const SiteSums& sums) override {
    if (step > step_) step_ = step, calls_ = 0;
    ATOLL_ASSIGN_OR_RETURN(const int64_t round, NextRound());
    wan_s_ = 0;
    // The leader's verdict for the site: 1 commit, 0 compute the step again; then the live sites.
    int64_t verdict = -1;
    if (c_.leader) {
      ATOLL_ASSIGN_OR_RETURN(const bool commit, SumAndAgree(step, round, sums));
      verdict = commit ? 1 : 0;
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&verdict, 1)));
    ATOLL_RETURN_IF_ERROR(ShareLive());
    if (verdict == 0) return false;
    if (!sums.fixed.empty())
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, sums.fixed));
    else
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, sums.grads));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, sums.losses));
    if (!sums.seconds.empty() && step > measured_step_) {  // not an audit replay's
      // Smoothed over the steps of this generation (every site alike: the same agreed sums).
      if (measured_generation_ != generation_ || seconds_.size() != sums.seconds.size())
        seconds_.assign(sums.seconds.size(), 0.0);
      for (size_t i = 0; i < seconds_.size(); ++i)
        seconds_[i] = seconds_[i] > 0 ? 0.5 * seconds_[i] + 0.5 * sums.seconds[i] : sums.seconds[i];
      measured_step_ = step;
      measured_generation_ = generation_;
    }
    ++steps_;
    return true;
  }

  // While a new process for a lost site waits to join (it registered before this step's rounds:
  // FetchSyncState), the leader serves the state that leads into the next step, which it takes
  // over (about 12 bytes a parameter copied).
  Status AfterStep(int64_t completed, float* params, bool last) override {
    if (!c_.leader || !c_.world->publish || last || !joiner_pending_) return Status::Ok();
    const AdamW& o = *c_.optimizer;
    c_.world->publish(uint64_t(completed), std::make_shared<const std::string>(EncodeSyncState(
                                               completed, o.step_count(), generation_, live_,
                                               std::span<const float>(params, c_.n_params),
                                               std::span<const float>(o.m(), o.size()),
                                               std::span<const float>(o.v(), o.size()))));
    return Status::Ok();
  }

  void Fill(StepMetrics* m) const override {
    m->site = c_.world->site;
    m->wan_ms = wan_s_ * 1e3;
    if (c_.world->wan_bytes) m->wan_bytes_sent = c_.world->wan_bytes();
  }

  std::string Summary() const override {
    if (!c_.leader || steps_ == 0) return "";
    // steps_ counts executions: an audit replay runs the all-reduce again.
    return fmt::format(
        "site {}: {:.1f} ms per gradient all-reduce over the WAN across {} sites ({}){}",
        c_.world->site, total_s_ * 1e3 / double(steps_), c_.cfg->world.sites, steps_,
        int(live_.size()) < c_.cfg->world.sites
            ? fmt::format("; live sites at the end: {}", SiteList(live_))
            : "");
  }
  bool whole_batch() const override { return true; }
  int lead_site() const override { return live_.front(); }
  // A detector's collective after the step's sums (the leader's) may have adopted new live sites.
  Status ShareLead() override { return ShareLive(); }

  Communicator* PeerSites() override {
    const bool alone = c_.site_comm == nullptr || c_.site_comm->size() == 1;
    return alone && c_.cfg->world.sites > 1 && live_comm_ == nullptr ? c_.world->wan : nullptr;
  }

  StatusOr<int64_t> SumOverSites(int64_t n) override {
    if (c_.leader) {
      const int64_t mine = n;
      ATOLL_RETURN_IF_ERROR(Elastic([&](Communicator* sites) {
        n = mine;
        return sites->AllReduce(std::span<int64_t>(&n, 1));
      }));
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&n, 1)));
    return n;
  }

  StatusOr<int> RepairAcrossSites(bool corrupt, const HostStateFn& state) override {
    int64_t site_corrupt = corrupt ? 1 : 0, root = -1;
    if (c_.site_comm != nullptr && c_.site_comm->size() > 1)
      ATOLL_RETURN_IF_ERROR(c_.site_comm->AllReduce(std::span<int64_t>(&site_corrupt, 1)));
    if (c_.leader) {
      ATOLL_RETURN_IF_ERROR(Elastic([&](Communicator* sites) -> Status {
        ATOLL_ASSIGN_OR_RETURN(const int r,
                               RepairFromReplica(*sites, site_corrupt > 0, state, true));
        root = r < 0 ? -1 : live_[size_t(r)];
        return Status::Ok();
      }));
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&root, 1)));
    if (root >= 0) {
      const HostState h = state();
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(h.params, h.n)));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(h.m, h.k)));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(h.v, h.k)));
    }
    return int(root);
  }

  StatusOr<SiteHashes> GatherOverSites(const std::vector<uint64_t>& mine) override {
    SiteHashes out;
    if (!c_.leader || joining_) return out;
    const size_t n = mine.size();
    std::vector<int64_t> all;
    ATOLL_RETURN_IF_ERROR(Elastic([&](Communicator* sites) {
      all.assign(n * size_t(sites->size()), 0);
      return sites->AllGather(mine.data(), all.data(), n, DType::kInt64)
          .WithContext("the fingerprints' all-gather across sites");
    }));
    const size_t m = live_.size();
    out.sites = live_;
    for (size_t s = 0; s < m; ++s)
      out.hashes.emplace_back(all.begin() + std::ptrdiff_t(s * n),
                              all.begin() + std::ptrdiff_t(s * n + n));
    return out;
  }

 private:
  // The leader's collectives: the WAN's while every site is live, the live sites' after.
  Communicator* Sites() { return live_comm_ != nullptr ? live_comm_.get() : c_.world->wan; }

  // The leader's sum of the site's vector with the other live sites', timed.
  template <class T>
  Status LeaderSum(std::span<T> data) {
    const double t0 = NowSeconds();
    Status s = Sites()->AllReduce(data).WithContext("the WAN all-reduce across sites");
    wan_s_ += NowSeconds() - t0;
    total_s_ += NowSeconds() - t0;
    return s;
  }

  // The next coordinator round of this step: kSyncRoundsPerStep * step + the rounds taken in it.
  StatusOr<int64_t> NextRound() {
    step_ = std::max<int64_t>(step_, 0);
    if (calls_ >= kSyncRoundsPerStep)
      return Status::Internal(
          fmt::format("step {}: {} rounds with the other sites", step_ + 1, kSyncRoundsPerStep));
    return kSyncRoundsPerStep * step_ + calls_++;
  }

  // The live sites of `agreed` (round `round`: a site that came back counts from its join round
  // on): when they differ from live_, they become live_, with a LiveSites among them, and true.
  // A site that came back is a new process: this site makes a new link with it first (and it
  // with every live site). Errors: this site is not live, fewer than the quorum, a link.
  // when: "step N" or "after step N", for the messages.
  StatusOr<bool> Adopt(const Membership& agreed, int64_t round, const std::string& when) {
    const std::vector<int> now = agreed.LiveInRound(round);
    std::vector<int> lost, back;
    for (int s : live_)
      if (!std::binary_search(now.begin(), now.end(), s)) lost.push_back(s);
    for (int s : now)
      if (!std::binary_search(live_.begin(), live_.end(), s)) back.push_back(s);
    if (lost.empty() && back.empty()) return false;
    const int me = c_.world->site;
    if (!std::binary_search(now.begin(), now.end(), me))
      return Status::Unavailable(fmt::format("{}: this site is not live in round {} (live: {})",
                                             when, round, SiteList(now)));
    if (int(now.size()) < quorum_)
      return Status::Unavailable(
          fmt::format("{}: site(s) {} lost; {} live site(s) ({}) are fewer than world.quorum = {}",
                      when, SiteList(lost), now.size(), SiteList(now), quorum_));
    // A new process (one of `back`) has new links with every live site: this site makes them
    // with each one back, or, back itself, with every other.
    const bool me_back = std::binary_search(back.begin(), back.end(), me);
    for (int s : now) {
      const std::string& address = agreed.sites[size_t(s)].wan_address;
      if (s == me || (!me_back && !std::binary_search(back.begin(), back.end(), s))) continue;
      if (!c_.world->reconnect)
        return Status::Unavailable(
            fmt::format("{}: site {} came back, and this world cannot make new links", when, s));
      LogInfo("{}: a new link with site {} at {} (a new process)", when, s, address);
      // A link that cannot be made (the new process died meanwhile) fails the sums with that
      // site, which the next round settles (it is lost, or the sums fail kFailedSums times).
      if (Status r = c_.world->reconnect(s, address); !r.ok()) {
        LogWarning("{}: no new link with site {}: {}", when, s, r.ToString());
        continue;
      }
      linked_[size_t(s)] = address;
    }
    live_ = now;
    ++generation_;
    // Its tags follow the round that adopted it, the same on every site that adopts it (a new
    // process too). Not the coordinator's epoch: a registration and a loss can be revealed in one
    // round and the registered site taken in at a later one, one epoch. Not the generation: a
    // new process takes it over with the state, and the live sites can adopt a loss after they
    // published it. Modulo a prime, as LiveSites keeps 10 bits of it.
    live_comm_ = std::make_unique<LiveSites>(c_.world->wan, live_, uint32_t(round % 1021));
    failed_ = 0;
    if (!lost.empty())
      LogWarning("{}: site(s) {} lost; the live sites {} go on and take over their micro-batches",
                 when, SiteList(lost), SiteList(live_));
    if (!back.empty())
      LogInfo("{}: site(s) {} back; the live sites {} compute their own micro-batches again", when,
              SiteList(back), SiteList(live_));
    return true;
  }

  // A new process for a lost site: every rank takes the state a live site's leader served for
  // step J (the leader fetched it); the site trains from step J. It is not among the live sites
  // until J's first round (its sums, SumAndAgree), where they all adopt it: until then its
  // detectors compare nothing across sites (Elastic).
  StatusOr<int64_t> TakeOver(float* params) {
    AdamW& o = *c_.optimizer;
    SyncState st;
    if (c_.leader) {
      ATOLL_ASSIGN_OR_RETURN(st, FetchSyncState(*c_.world, c_.cfg->train.steps, c_.n_params,
                                                o.size(), int(c_.cfg->world.sites)));
    }
    std::vector<int64_t> head(size_t(c_.cfg->world.sites) + 4, -1);
    head[0] = st.step, head[1] = st.optimizer_steps, head[2] = st.generation;
    head[3] = int64_t(st.live.size());
    std::copy(st.live.begin(), st.live.end(), head.begin() + 4);
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(head)));
    if (c_.leader) {
      std::copy(st.params.begin(), st.params.end(), params);
      std::copy(st.m.begin(), st.m.end(), o.m());
      std::copy(st.v.begin(), st.v.end(), o.v());
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(o.m(), o.size())));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(o.v(), o.size())));
    o.set_step_count(head[1]);
    generation_ = head[2];
    live_.assign(head.begin() + 4, head.begin() + 4 + head[3]);
    step_ = head[0];
    calls_ = 0;
    joining_ = true;
    return head[0];
  }

  // A coordinator round; notes whether a new process registered for a later round
  // (joiner_pending_).
  StatusOr<Membership> Commit(int64_t round, const RoundVote& vote) {
    StatusOr<Membership> agreed = c_.world->commit(round, vote);
    if (agreed.ok()) {
      joiner_pending_ = false;
      for (const SiteInfo& s : agreed->sites)
        if (s.alive && s.join_round > round) joiner_pending_ = true;
    }
    return agreed;
  }

  // A new process's leader, before it computes its first step J: J's first round, where the live
  // sites, which voted with the sums of J computed without it, and it adopt it (Adopt makes the
  // new links); they compute J again with it, and it computes J for the first time. So the live
  // sites wait in that round only for its fetch of the state, not for a step of its own.
  Status Join() {
    ATOLL_ASSIGN_OR_RETURN(const int64_t round, NextRound());
    ATOLL_ASSIGN_OR_RETURN(const Membership agreed, Commit(round, RoundVote{.failed = true}));
    ATOLL_ASSIGN_OR_RETURN(const bool changed,
                           Adopt(agreed, round, fmt::format("step {}", step_ + 1)));
    if (!changed)
      return Status::Internal(fmt::format("step {}: this site is not among the live sites ({})",
                                          step_ + 1, SiteList(live_)));
    return Status::Ok();
  }

  // The leader's live sites (and their generation) to the site's ranks.
  Status ShareLive() {
    std::vector<int64_t> live(size_t(c_.cfg->world.sites) + 2, -1);
    live[0] = generation_;
    live[1] = int64_t(live_.size());
    std::copy(live_.begin(), live_.end(), live.begin() + 2);
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(live)));
    generation_ = live[0];
    live_.assign(live.begin() + 2, live.begin() + 2 + live[1]);
    return Status::Ok();
  }

  // On the leader: op over the live sites, then (with a coordinator) a round where every live site
  // says whether it succeeded: a site lost during op can fail it on some sites and not on others,
  // and only the round tells them all alike. op runs again among the rest when a site was lost,
  // or when it failed somewhere (up to kFailedSums times in a row). So op must give the same
  // result when it runs again.
  template <class Op>
  Status Elastic(Op op) {
    if (joining_) return Status::Ok();  // not among the live sites yet: nothing to compare
    if (!c_.world->commit) return op(Sites());
    for (int failed = 0;;) {
      Status s = op(Sites());
      ATOLL_ASSIGN_OR_RETURN(const int64_t round, NextRound());
      StatusOr<Membership> agreed = Commit(round, RoundVote{.failed = !s.ok()});
      if (!agreed.ok()) return agreed.status().WithContext(s.ToString());
      ATOLL_ASSIGN_OR_RETURN(const bool changed,
                             Adopt(*agreed, round, fmt::format("after step {}", step_ + 1)));
      if (changed) continue;
      std::vector<int> failing;
      for (int site : live_)
        if (auto v = agreed->votes.find(site); v == agreed->votes.end() || v->second.failed)
          failing.push_back(site);
      if (failing.empty()) return s;
      if (++failed >= kFailedSums)
        return Status::Unavailable(fmt::format(
            "after step {}: a collective over the sites failed {} times in a row on site(s) {} "
            "(here: {})",
            step_ + 1, failed, SiteList(failing), s.ok() ? "ok" : s.ToString()));
    }
  }

  // On the leader: the step's sums over the live sites, agreed in coordinator round `round`.
  // true: commit them; false: the live sites changed (live_ is the new set) or a sum failed on
  // some site: compute the step again.
  StatusOr<bool> SumAndAgree(int64_t step, int64_t round, const SiteSums& sums) {
    const std::span<const std::byte> bytes =
        sums.fixed.empty() ? std::as_bytes(sums.grads) : std::as_bytes(sums.fixed);
    if (c_.on_wan) c_.on_wan(bytes, false);
    Status summed = sums.fixed.empty() ? LeaderSum(sums.grads) : LeaderSum(sums.fixed);
    if (summed.ok()) summed = LeaderSum(sums.losses);
    if (summed.ok() && c_.on_wan) c_.on_wan(bytes, true);
    if (!c_.world->commit) {  // no coordinator: every site stays
      if (!summed.ok()) return summed.WithContext(fmt::format("step {}", step + 1));
      return true;
    }
    RoundVote vote;
    vote.failed = !summed.ok();
    if (summed.ok()) vote.digest = Hash64(bytes.data(), bytes.size());
    StatusOr<Membership> round_result = Commit(round, vote);
    if (!round_result.ok())
      return round_result.status().WithContext(fmt::format("step {}", step + 1));
    const Membership& agreed = *round_result;
    ATOLL_ASSIGN_OR_RETURN(const bool changed,
                           Adopt(agreed, round, fmt::format("step {}", step + 1)));
    if (changed) return false;  // compute the step again, with the lost sites' share
    std::vector<int> failed;
    std::map<uint64_t, std::vector<int>> by_digest;
    for (int s : live_) {
      auto v = agreed.votes.find(s);
      if (v == agreed.votes.end() || v->second.failed)
        failed.push_back(s);
      else
        by_digest[v->second.digest].push_back(s);
    }
    if (!failed.empty()) {
      if (++failed_ >= kFailedSums)
        return Status::Unavailable(fmt::format(
            "step {}: the sum over the sites failed {} times in a row on site(s) {} (here: {})",
            step + 1, failed_, SiteList(failed), summed.ok() ? "ok" : summed.ToString()));
      LogWarning(
          "step {}: the sum over the sites failed on site(s) {}{}; computing the step "
          "again",
          step + 1, SiteList(failed), summed.ok() ? "" : " (here: " + summed.ToString() + ")");
      return false;
    }
    failed_ = 0;
    if (by_digest.size() > 1) {
      std::string groups;
      for (const auto& [d, sites] : by_digest)
        groups += fmt::format("{}site(s) {}: {}", groups.empty() ? "" : ", ", SiteList(sites),
                              HashToHex(d));
      return Status::Corruption(fmt::format(
          "step {}: the sites disagree on the summed gradients ({}): their arithmetic or memory "
          "differs (another build or CPU, or silent data corruption)",
          step + 1, groups));
    }
    return true;
  }

  const StrategyContext c_;
  std::vector<int> live_;                 // the sites taking part, sorted
  std::vector<std::string> linked_;       // the address each site's link was made to
  std::unique_ptr<LiveSites> live_comm_;  // once a site was lost
  int64_t generation_ = 0;                // changes of live_
  bool elastic_ = false;                  // with a coordinator: sites can be lost, or leave
  bool joining_ = false;                  // a new process for a lost site, not adopted yet
  bool joiner_pending_ = false;           // a new process registered for a later round
  int quorum_ = 1;
  int failed_ = 0;      // sums failed in a row
  double wan_s_ = 0;    // this step's time in WAN all-reduces
  double total_s_ = 0;  // ... and the run's
  int64_t steps_ = 0;
  int64_t step_ = -1, calls_ = 0;  // AfterBackward calls of step step_
  // world.balance: the last agreed step's seconds per micro-batch by site, that step and the
  // live sites' generation then; the shares of step share_step_ (in generation share_generation_).
  std::vector<double> seconds_;
  int64_t measured_step_ = -1, measured_generation_ = -1;
  std::vector<std::pair<int64_t, int64_t>> share_;
  int64_t share_step_ = -1, share_generation_ = -1;
  std::vector<int64_t> last_counts_;
};

}  // namespace

StatusOr<std::unique_ptr<WorldStrategy>> MakeSyncStrategy(const StrategyContext& c) {
  const ParallelConfig& p = c.cfg->parallel;
  if (c.world->rejoin && (p.tp > 1 || p.pp > 1 || p.zero))
    return Status::InvalidArgument(
        "--rejoin: world.strategy = \"sync\" takes a lost site back with parallel.tp = pp = 1 "
        "and no ZeRO only (the state served is the leader's whole copy)");
  if (c.world->rejoin && !c.world->commit)
    return Status::InvalidArgument("--rejoin: sync needs the coordinator's rounds");
  if (c.optimizer == nullptr) return Status::InvalidArgument("sync: no optimizer");
  if (c.leader && c.world->wan == nullptr)
    return Status::InvalidArgument("world.sites > 1 needs the WAN among the site leaders");
  return std::unique_ptr<WorldStrategy>(std::make_unique<SyncStrategy>(c));
}

}  // namespace atl
