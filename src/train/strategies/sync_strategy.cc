// world.strategy = "sync": every step, the sites' gradients are summed over the WAN (after the
// coordinator's round for the step), so the sites' replicas are data-parallel replicas of one
// model and the loss curve is the single-site one up to float rounding. Hierarchical: the site's
// ranks have summed their gradients already; the leader all-reduces the site's sum with the
// other leaders (a ring over the WAN, world/wan.h), then broadcasts it to the site's ranks.
// The sites hold one model, so the corruption detectors compare it across them
// (GatherOverSites) and replay a step on every site together (SumOverSites).
#include <fmt/format.h>

#include "core/log.h"
#include "train/sdc/memory.h"
#include "train/strategies/world_strategy.h"

namespace atl {

namespace {

class SyncStrategy final : public WorldStrategy {
 public:
  explicit SyncStrategy(const StrategyContext& c) : c_(c) {}

  StatusOr<int64_t> Start(int64_t start, float*) override { return start; }

  Status AfterBackward(int64_t step, std::span<float> grads, std::span<double> losses) override {
    // The coordinator's round: every live site has reached this step (once: an audit replay of
    // the step, which every site makes together, does not wait for it again).
    if (c_.leader && c_.world->round && step != rounded_)
      ATOLL_RETURN_IF_ERROR(c_.world->round(step).WithContext(fmt::format("step {}", step + 1)));
    rounded_ = step;
    wan_s_ = 0;
    if (c_.on_wan) c_.on_wan(grads, false);
    ATOLL_RETURN_IF_ERROR(WorldSum(grads));
    if (c_.on_wan) c_.on_wan(grads, true);
    ATOLL_RETURN_IF_ERROR(WorldSum(losses));
    ++steps_;
    return Status::Ok();
  }

  Status AfterStep(int64_t, float*, bool) override { return Status::Ok(); }

  void Fill(StepMetrics* m) const override {
    m->site = c_.world->site;
    m->wan_ms = wan_s_ * 1e3;
    if (c_.world->wan_bytes) m->wan_bytes_sent = c_.world->wan_bytes();
  }

  std::string Summary() const override {
    if (!c_.leader || steps_ == 0) return "";
    // steps_ counts executions: an audit replay runs the all-reduce again.
    return fmt::format(
        "site {}: {:.1f} ms per gradient all-reduce over the WAN across {} sites ({})",
        c_.world->site, total_s_ * 1e3 / double(steps_), c_.cfg->world.sites, steps_);
  }
  bool whole_batch() const override { return true; }

  Communicator* PeerSites() override {
    const bool alone = c_.site_comm == nullptr || c_.site_comm->size() == 1;
    return alone && c_.cfg->world.sites > 1 ? c_.world->wan : nullptr;
  }

  StatusOr<int64_t> SumOverSites(int64_t n) override {
    ATOLL_RETURN_IF_ERROR(WorldSum(std::span<int64_t>(&n, 1)));
    return n;
  }

  StatusOr<int> RepairAcrossSites(bool corrupt, float* params, size_t n, float* m, float* v,
                                  size_t k) override {
    int64_t site_corrupt = corrupt ? 1 : 0, root = -1;
    if (c_.site_comm != nullptr && c_.site_comm->size() > 1)
      ATOLL_RETURN_IF_ERROR(c_.site_comm->AllReduce(std::span<int64_t>(&site_corrupt, 1)));
    if (c_.leader) {
      ATOLL_ASSIGN_OR_RETURN(const int r, RepairFromReplica(*c_.world->wan, site_corrupt > 0,
                                                            params, n, m, v, k, true));
      root = r;
    }
    ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<int64_t>(&root, 1)));
    if (root >= 0) {
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(params, n)));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(m, k)));
      ATOLL_RETURN_IF_ERROR(ShareInSite(c_, std::span<float>(v, k)));
    }
    return int(root);
  }

  StatusOr<std::vector<std::vector<uint64_t>>> GatherOverSites(
      const std::vector<uint64_t>& mine) override {
    std::vector<std::vector<uint64_t>> out;
    if (!c_.leader) return out;
    const size_t n = mine.size(), sites = size_t(c_.world->wan->size());
    std::vector<int64_t> all(n * sites);
    ATOLL_RETURN_IF_ERROR(c_.world->wan->AllGather(mine.data(), all.data(), n, DType::kInt64)
                              .WithContext("the fingerprints' all-gather across sites"));
    for (size_t s = 0; s < sites; ++s)
      out.emplace_back(all.begin() + std::ptrdiff_t(s * n),
                       all.begin() + std::ptrdiff_t(s * n + n));
    return out;
  }

 private:
  // The leader sums the site's (already site-reduced) vector with the other sites' over the
  // WAN, then every rank of the site takes the leader's result.
  template <class T>
  Status WorldSum(std::span<T> data) {
    if (c_.leader) {
      const double t0 = NowSeconds();
      ATOLL_RETURN_IF_ERROR(
          c_.world->wan->AllReduce(data).WithContext("the WAN all-reduce across sites"));
      wan_s_ += NowSeconds() - t0;
      total_s_ += NowSeconds() - t0;
    }
    return ShareInSite(c_, data);
  }

  const StrategyContext c_;
  double wan_s_ = 0;    // this step's time in WAN all-reduces
  double total_s_ = 0;  // ... and the run's
  int64_t steps_ = 0;
  int64_t rounded_ = -1;  // the last step whose coordinator round was taken
};

}  // namespace

StatusOr<std::unique_ptr<WorldStrategy>> MakeSyncStrategy(const StrategyContext& c) {
  if (c.world->rejoin)
    return Status::InvalidArgument(
        "--rejoin: world.strategy = \"sync\": only diloco, streaming and async runs can be "
        "rejoined");
  if (c.leader && c.world->wan == nullptr)
    return Status::InvalidArgument("world.sites > 1 needs the WAN among the site leaders");
  return std::unique_ptr<WorldStrategy>(std::make_unique<SyncStrategy>(c));
}

}  // namespace atl
