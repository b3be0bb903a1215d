// Time of one training step for a given layout: the heart of the data-movement model.
//
// A port of training_results() in optimal_parallelism.ipynb (Erdil & Schneider-Joseph, github
// ege-erdil/limits_to_distributed_training), generalized to a topology whose outer levels may be
// WAN links between sites (world.h). With a single site it computes what the reference does.
//
// Parallelism degrees are split over network levels, innermost first: dp[l] data-parallel ranks
// share a domain of level l, and so on. For one step of B tokens on N = DP TP PP EP GPUs:
//
//   matmul   = 3 (L/PP) (E/EP) m [t(d_ff/TPff, d_model/TPm, b) + t(d_model/TPm, d_ff/TPff, b)]
//              with b = B / (DP m E) tokens per microbatch (matmul.h gives t)
//   all-reduce of W words over p ranks at level l, repeated s times in sequence and r in
//   parallel:  bandwidth = 2 (p-1) W s r bytes / (N x BW_l / 2),  latency = 2 s lambda_l (p > 1)
//   DP  = sum_l all-reduce(dp[l], N_params words, s=1, r=prod(dp[l+1:]))
//   TP  = sum_l all-reduce(tpm[l], d_ff, s=2L, r=B prod(tpm[l+1:]))
//         + all-reduce(tpff[l], d_model, s=2L, r=B prod(tpff[l+1:]))
//   PP/EP = point-to-point sends of d_model words per token between stages (and experts)
//   bubble (interleaved 1F1B) = (z + PP - 1) / (PP + v m + z - 1), z = (v-1) max(0, PP-m);
//          zero-bubble schedules: 0
//   step = latency + (max(matmul, overlapped comm) + non-overlapped comm) / (1 - bubble)
//   utilization = 6 (N/E) B / (N_gpu x peak x step)
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <vector>

#include "plan/hardware.h"
#include "plan/shape.h"

namespace atl::plan {

// Network levels of a run: those of one site, then (for a world of sites) WAN levels that only
// data-parallel traffic crosses.
struct Topology {
  std::vector<NetworkLevel> levels;  // innermost first
  size_t site_levels = 0;            // levels [0, site_levels) are inside one site
};
Topology SiteTopology(const Hardware& hw);
// One level with the best bandwidth and the least latency of `t`: no layout can communicate
// faster on it, so it gives a lower bound used to prune the search.
Topology OptimisticTopology(const Topology& t);

// How the model is split. Every vector has one entry per topology level.
struct Layout {
  std::vector<int64_t> dp, tp_model, tp_ff, pp, ep;
  int64_t microbatches = 1;  // per pipeline, per step
  int64_t interleave = 1;    // virtual stages per pipeline rank (v)
  bool zero_bubble = false;

  int64_t DP() const;
  int64_t TPModel() const;
  int64_t TPFF() const;
  int64_t PP() const;
  int64_t EP() const;
  int64_t TP() const { return TPModel() * TPFF(); }
  int64_t Gpus() const { return DP() * TP() * PP() * EP(); }
};

// Which communication hides behind matmuls (bandwidth only; latency is never hidden), and how a
// step's parts combine.
//   kAtoll: a hierarchical all-reduce's levels run one after another (their bandwidth times
//     add), and every overlapped transfer (TP, DP, PP together) hides behind the matmuls of the
//     pipeline, bubble included: step = latencies + (max(matmuls, overlapped) + exposed) / (1 -
//     bubble).
//   kReference: the reference notebook's training_results (optimal_parallelism.ipynb): the
//     levels' bandwidth times overlap (the largest counts, for DP and for TP), the pipeline is
//     (max(matmuls, overlapped TP + PP) + exposed TP + PP) / (1 - bubble) plus the TP and PP
//     latencies (dropped altogether with the zero-bubble schedule, as the reference drops them),
//     and DP stays outside the bubble: max(pipeline, DP) when overlapped, pipeline + DP when not,
//     plus the DP latency.
enum class Combine { kAtoll, kReference };
struct EvalOptions {
  bool overlap_tp = true;
  bool overlap_dp = true;
  bool overlap_pp = true;
  Combine combine = Combine::kAtoll;
};

// A step's time and where it goes. Communication times are bandwidth times; latencies are
// reported separately and included in step_s once.
struct StepTime {
  double step_s = 0;
  double ideal_s = 0;   // 6 (N/E) B / (N_gpu x peak): the step at 100% of peak
  double matmul_s = 0;  // per-GPU matmul time (memory hierarchy + FLOP + latency)
  double tp_s = 0, dp_s = 0, pp_s = 0;
  double wan_s = 0;  // the part of dp_s on WAN levels (world runs)
  double tp_latency_s = 0, dp_latency_s = 0, pp_latency_s = 0;
  double wan_latency_s = 0;  // the part of dp_latency_s on WAN levels
  double bubble = 0;         // pipeline bubble fraction
  double utilization = 0;    // ideal_s / step_s
  double latency_s() const { return tp_latency_s + dp_latency_s + pp_latency_s; }
  double comm_s() const { return tp_s + dp_s + pp_s; }
};

struct CommTime {
  double latency_s = 0;
  double bandwidth_s = 0;
};

// All-reduce of `words` over `participants` ranks at `level`, `seq` times in sequence and `par`
// times in parallel, on a cluster of `cluster_gpus` GPUs (reference: allreduce_time_sec).
CommTime AllReduceTime(const NetworkLevel& level, double bytes_per_word, int64_t participants,
                       double words, double cluster_gpus, double seq, double par);
// Point-to-point sends (reference: p2p_time_sec).
CommTime PointToPointTime(const NetworkLevel& level, double bytes_per_word, double words,
                          double cluster_gpus, double seq, double par);

// Tokens per microbatch per expert: B / (DP m E), as the reference's integer division.
int64_t MicrobatchTokens(const ModelShape& shape, const Layout& layout);

// True if weights (replicated over DP inside a site), optimizer state (4 words per parameter,
// sharded over a site's DP ranks) fit the site's GPUs' memory. Activations are not modelled,
// as in the paper's default.
bool FitsInMemory(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                  const Layout& layout);

StepTime EvaluateStep(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                      const Layout& layout, const EvalOptions& options);
// The same with t(d_ff/TPff, d_model/TPm, b) + t(d_model/TPm, d_ff/TPff, b) already known (the
// layout search caches it).
StepTime EvaluateStepWithMatmul(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                                const Layout& layout, const EvalOptions& options,
                                double matmul_pair_s);
// t(d_ff/TPff, d_model/TPm, b) + t(d_model/TPm, d_ff/TPff, b) for the layout.
// One forward matmul pair of a layer (d_ff x d_model, then d_model x d_ff) on the layout's
// shards; with weight_grads_io, the mean over a layer's forward, activation-gradient and
// weight-gradient pairs, the last with the weight-gradient traffic (the reference's).
double MatmulPairSeconds(const Gpu& gpu, const ModelShape& shape, const Layout& layout,
                         bool weight_grads_io = false);

}  // namespace atl::plan
