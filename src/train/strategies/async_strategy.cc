// world.strategy = "async" in the training loop: AsyncClient (train/strategies/async_client.h) on
// the site's leader after every optimizer step, the pulled parameters broadcast to the site's
// other ranks, and the take-over by a process that replaces a lost site (it goes on after the
// site's last decided push).
#include <fmt/format.h>

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
      // A new process for a lost site: a member from the barrier at the end on (the only round
      // of async), then it goes on after the site's last decided push.
      if (!w.join) return Status::InvalidArgument("rejoin: no way to join the world");
      ATOLL_RETURN_IF_ERROR(w.join(steps, 0).WithContext(fmt::format("site {}: rejoin", w.site)));
    }
    if (c_.leader) ATOLL_RETURN_IF_ERROR(client_.Start(params));
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, c_.n_params)));
    // The leader's (only it has the world's hooks): a new process for a lost site on every rank.
    int64_t rejoin = w.rejoin ? 1 : 0;
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&rejoin, 1)));
    if (rejoin == 0) return start;
    double at = 0;
    if (c_.leader) {
      at = double(client_.start_step());
      LogInfo("site {}: rejoin: took over after step {} (the site's last push)", w.site,
              client_.start_step());
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<double>(&at, 1)));
    if (int64_t(at) >= steps)
      return Status::Unavailable(fmt::format(
          "site {}: rejoin: the site's pushes already reach the last step {}", c_.world->site,
          steps));
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
      if (c_.leader) ATOLL_RETURN_IF_ERROR(client_.AfterStep(completed, params).status());
      if (client_.PullsAt(completed)) ATOLL_RETURN_IF_ERROR(ShareInSite(c_, all));
    }
    return Status::Ok();
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

  // The barrier at the end (round train.steps) is async's only round: the agreements take the
  // rounds after it. Before it, site 0 leads (the sites are at different steps).
  Status AgreeOnLive() override {
    if (!finished_) return Status::Ok();
    ATOLL_ASSIGN_OR_RETURN(
        lead_, LowestLiveAfterTheEnd(c_, c_.cfg->train.steps + 1 + agreements_++, lead_));
    return Status::Ok();
  }

 private:
  const StrategyContext c_;
  AsyncClient client_;
  int lead_ = 0;
  bool finished_ = false;   // after the barrier at the end
  int64_t agreements_ = 0;  // AgreeOnLive's rounds after it
};

}  // namespace

StatusOr<std::unique_ptr<WorldStrategy>> MakeAsyncStrategy(const StrategyContext& c) {
  const WorldConfig& w = c.cfg->world;
  if (c.resumed)
    return Status::InvalidArgument(
        "--resume: world.strategy = \"async\" keeps state across sites (the parameter server's) "
        "that checkpoints do not hold yet; resume is for sync runs");
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
