// The search over layouts: which TP x PP x DP x EP factorization, which placement of each degree
// on the network levels, how many microbatches, and how many GPUs.
//
// Follows optimal_parallelism() and cluster_size_required() of the reference notebook
// (Erdil & Schneider-Joseph, optimal_parallelism.ipynb):
//   - EP = gcd(N, E); TP | d_model d_ff, DP | batch tokens, PP | layers;
//   - 2D tensor parallelism N_TP = N_TP,model x N_TP,ff with sqrt(N_TP) <= N_TP,ff <= 4 sqrt(N_TP);
//   - microbatches: the fewest that divide the per-replica tokens and are >= PP (2 PP - 1 for
//     zero-bubble schedules); interleaving v = L / PP for 1F1B when PP > 1;
//   - the memory check (weights + 4 words of optimizer state per parameter);
//   - every split of each degree over the levels (level l taking a factor of its size);
//   - cluster sizes E x 2^i, the smallest that finishes within the time limit.
// Unlike the reference, candidates are ranked by a lower bound (one level with the best links)
// and evaluated in that order until the bound exceeds the best time found: the same optimum,
// found in a fraction of the time.
//
// Thread-safety: pure functions (each call has its own caches).
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "plan/step.h"

namespace atl::plan {

struct SearchOptions {
  bool zero_bubble = false;     // zero-bubble pipeline schedule (else interleaved 1F1B)
  bool both_schedules = false;  // try interleaved 1F1B and zero bubble (zero_bubble ignored)
  bool interleaving = true;     // 1F1B interleaving v = L / PP
  EvalOptions eval;
};

struct PlanResult {
  Layout layout;
  StepTime step;
  double train_s = 0;  // steps x step time
};

// The fastest layout of `site_gpus` GPUs per site. Topology levels at or beyond site_levels are
// data-parallel only, with the degrees in `outer_dp` (one per such level; empty for one site).
// std::nullopt when no layout is valid (divisibility or memory).
std::optional<PlanResult> BestLayout(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                                     int64_t site_gpus, const std::vector<int64_t>& outer_dp,
                                     const SearchOptions& options);

// The smallest site size E x 2^i (i < 60) whose best layout trains the model within
// `time_limit_s`, or std::nullopt if none does.
std::optional<PlanResult> SmallestCluster(const Gpu& gpu, const Topology& topo,
                                          const ModelShape& shape, double time_limit_s,
                                          const std::vector<int64_t>& outer_dp,
                                          const SearchOptions& options);

// The loop behind SmallestCluster, for callers whose topology or step time depends on the site
// size (world.h): tries site sizes E x 2^i with `outer` sites, skipping sizes too small to finish
// even at the utilization cap, and returns the first plan from `best_for_site` with
// train_s < time_limit_s.
std::optional<PlanResult> SmallestSite(
    const Gpu& gpu, const ModelShape& shape, double time_limit_s, int64_t outer,
    const std::function<std::optional<PlanResult>(int64_t site_gpus)>& best_for_site);

// Training time no layout can beat, for any number of GPUs: every step runs each layer's 6
// matmuls in sequence for at least one microbatch (6 L latency_per_matmul), times the steps.
double LatencyFloorSeconds(const Gpu& gpu, const ModelShape& shape);

// "TP 2x8 PP 16 (v24) DP 512 EP 1, 16 microbatches".
std::string DescribeLayout(const Layout& layout);
// "NVLink: TP 8 | InfiniBand: DP 512 TP 2 PP 16".
std::string DescribePlacement(const Layout& layout, const Topology& topo);

}  // namespace atl::plan
