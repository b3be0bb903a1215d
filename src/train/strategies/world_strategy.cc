// MakeWorldStrategy: the strategy of world.strategy, and the single site's (nothing to agree on).
#include "train/strategies/world_strategy.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <thread>

#include "core/file.h"
#include "core/log.h"

namespace atl {

namespace {

class SingleSite final : public WorldStrategy {
 public:
  StatusOr<int64_t> Start(int64_t start, float*) override { return start; }
  StatusOr<bool> AfterBackward(int64_t, const SiteSums&) override { return true; }
  Status AfterStep(int64_t, float*, bool) override { return Status::Ok(); }
  void Fill(StepMetrics*) const override {}
  std::string Summary() const override { return ""; }
  bool whole_batch() const override { return true; }
};

}  // namespace

uint64_t SyncBytesByStep(const RunConfig& cfg, int64_t steps) {
  const double sites = double(cfg.world.sites);
  return uint64_t(double(steps) * 2.0 * (sites - 1) / sites * 4.0 *
                  double(NumParameters(cfg.model)));
}

int64_t SyncWanChunksPerStep(const RunConfig& cfg, size_t chunk_bytes) {
  const int64_t sites = cfg.world.sites, n = int64_t(NumParameters(cfg.model));
  const int64_t block = (n + sites - 1) / sites, per = int64_t(chunk_bytes / sizeof(float));
  return 2 * (sites - 1) * ((block + per - 1) / per);
}

StatusOr<FetchedState> RegisterAndFetch(const WorldHooks& w, int64_t rounds_per_unit,
                                        int64_t early_by,
                                        const std::function<std::string(int64_t)>& name,
                                        const std::function<bool(int64_t)>& past_end) {
  if (!w.fetch || !w.join || !w.current_round)
    return Status::InvalidArgument("rejoin: no way to fetch the state or to join the world");
  const std::string who = fmt::format("site {}: rejoin", w.site);
  const double deadline = NowSeconds() + w.rejoin_timeout_s;
  int64_t J = -1;
  for (;;) {
    ATOLL_ASSIGN_OR_RETURN(const int64_t begun, w.current_round());
    J = std::max<int64_t>(begun, -1) + 2;
    if (past_end(J))
      return Status::Unavailable(fmt::format(
          "{}: too close to the end of the run: {} would be past the last", who, name(J)));
    Status joined = w.join(rounds_per_unit * J, early_by);
    if (joined.ok()) break;
    if (joined.code() != StatusCode::kNotFound || NowSeconds() >= deadline)
      return joined.WithContext(who);
    LogInfo("{}: too late for {} ({}); trying a later one", who, name(J), joined.message());
  }
  LogInfo("{}: registered for {}; waiting for its state", who, name(J));
  // States are published under their unit: ask for J's alone (nothing is sent until a live site
  // has it).
  for (;;) {
    StatusOr<std::pair<uint64_t, std::string>> got = w.fetch(uint64_t(J));
    if (got.ok()) {
      if (got->first != uint64_t(J))
        return Status::Internal(fmt::format("{}: a live site served the state of unit {}, not {}",
                                            who, got->first, name(J)));
      LogInfo("{}: {:.1f} MB of state fetched for {}", who, double(got->second.size()) / 1e6,
              name(J));
      return FetchedState{J, std::move(got->second)};
    }
    if (got.status().code() != StatusCode::kNotFound || NowSeconds() >= deadline)
      return got.status().WithContext(who + ": fetching the state");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::string SiteStatePath(const std::string& checkpoint_dir, int site) {
  std::string dir = checkpoint_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  return fmt::format("{}.sites/site-{}.bin", dir, site);
}

StatusOr<std::string> ReadSiteState(const StrategyContext& c) {
  const std::string path = SiteStatePath(c.resume_path, c.world->site);
  auto bytes = ReadFile(path);
  if (!bytes.ok())
    return Status::InvalidArgument(fmt::format(
        "--resume: world.strategy = \"{}\" needs each site's state beside the checkpoint: {} "
        "({}; see the warning its site logged when it wrote the checkpoint)",
        c.cfg->world.strategy, path, bytes.status().message()));
  return std::move(*bytes);
}

Status WriteSiteState(const StrategyContext& c, const std::string& dir, const std::string& bytes) {
  const std::string path = SiteStatePath(dir, c.world->site);
  ATOLL_RETURN_IF_ERROR(MakeDirs(path.substr(0, path.rfind('/'))));
  return WriteFileAtomic(path, bytes);
}

Status ShareOptimizerInSite(const StrategyContext& c, int64_t adam_steps) {
  AdamW& o = *c.optimizer;
  ATOLL_RETURN_IF_ERROR(ShareInSite(c, std::span<float>(o.m(), o.size())));
  ATOLL_RETURN_IF_ERROR(ShareInSite(c, std::span<float>(o.v(), o.size())));
  ATOLL_RETURN_IF_ERROR(ShareInSite(c, std::span<int64_t>(&adam_steps, 1)));
  o.set_step_count(adam_steps);
  return Status::Ok();
}

StatusOr<int> LowestLiveAfterTheEnd(const StrategyContext& c, int64_t round, int fallback) {
  int64_t lead = fallback;
  if (c.leader && c.world->commit) {
    ATOLL_ASSIGN_OR_RETURN(const Membership agreed, c.world->commit(round, RoundVote{}));
    const std::vector<int> live = agreed.LiveInRound(round);
    if (!std::binary_search(live.begin(), live.end(), c.world->site))
      return Status::Unavailable(
          fmt::format("site {}: not live in round {} at the end", c.world->site, round));
    lead = live.front();
  }
  ATOLL_RETURN_IF_ERROR(ShareInSite(c, std::span<int64_t>(&lead, 1)));
  return int(lead);
}

StatusOr<std::unique_ptr<WorldStrategy>> MakeWorldStrategy(const StrategyContext& c) {
  if (c.cfg == nullptr || c.world == nullptr)
    return Status::InvalidArgument("world strategy: no config or world hooks");
  const std::string& s = c.cfg->world.strategy;
  if (c.cfg->world.sites == 1) {
    if (c.world->rejoin) return Status::InvalidArgument("--rejoin needs world.sites > 1");
    return std::unique_ptr<WorldStrategy>(std::make_unique<SingleSite>());
  }
  if (s == "sync") return MakeSyncStrategy(c);
  if (s == "diloco" || s == "streaming") return MakeLowCommStrategy(c);
  if (s == "async") return MakeAsyncStrategy(c);
  return Status::InvalidArgument(
      fmt::format("world.strategy = \"{}\" is not one of sync, diloco, "
                  "streaming, async",
                  s));
}

}  // namespace atl
