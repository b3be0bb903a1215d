// MakeWorldStrategy: the strategy of world.strategy, and the single site's (nothing to agree on).
#include "train/strategies/world_strategy.h"

#include <fmt/format.h>

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
