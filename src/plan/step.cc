#include "plan/step.h"

#include <algorithm>
#include <limits>

#include "plan/matmul.h"

namespace atl::plan {
namespace {

int64_t Prod(const std::vector<int64_t>& v, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to && i < v.size(); ++i) p *= v[i];
  return p;
}
int64_t Prod(const std::vector<int64_t>& v) { return Prod(v, 0, v.size()); }

}  // namespace

Topology SiteTopology(const Hardware& hw) {
  Topology t;
  t.levels = hw.network;
  t.site_levels = hw.network.size();
  return t;
}

Topology OptimisticTopology(const Topology& t) {
  NetworkLevel best{"optimistic", 0, 0, std::numeric_limits<double>::infinity()};
  for (const auto& l : t.levels) {
    best.bandwidth = std::max(best.bandwidth, l.bandwidth);
    best.latency_s = std::min(best.latency_s, l.latency_s);
  }
  if (t.levels.empty()) best.latency_s = 0;
  Topology o;
  o.levels = {best};
  o.site_levels = 1;
  return o;
}

int64_t Layout::DP() const { return Prod(dp); }
int64_t Layout::TPModel() const { return Prod(tp_model); }
int64_t Layout::TPFF() const { return Prod(tp_ff); }
int64_t Layout::PP() const { return Prod(pp); }
int64_t Layout::EP() const { return Prod(ep); }

CommTime AllReduceTime(const NetworkLevel& level, double bytes_per_word, int64_t participants,
                       double words, double cluster_gpus, double seq, double par) {
  CommTime c;
  if (participants <= 1) return c;
  // Total bytes all rings move, over the aggregate one-way bandwidth of the cluster at this level.
  c.bandwidth_s = 2.0 * static_cast<double>(participants - 1) * words * seq * par * bytes_per_word /
                  (cluster_gpus * level.bandwidth / 2.0);
  double steps = level.ring_latency ? 2.0 * static_cast<double>(participants - 1) : 2.0;
  c.latency_s = steps * seq * level.latency_s;
  return c;
}

CommTime PointToPointTime(const NetworkLevel& level, double bytes_per_word, double words,
                          double cluster_gpus, double seq, double par) {
  CommTime c;
  if (seq <= 0) return c;
  c.bandwidth_s = words * seq * par * bytes_per_word / (cluster_gpus * level.bandwidth / 2.0);
  c.latency_s = seq * level.latency_s;
  return c;
}

int64_t MicrobatchTokens(const ModelShape& shape, const Layout& layout) {
  return shape.batch_tokens() / (layout.DP() * layout.microbatches * shape.experts);
}

bool FitsInMemory(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                  const Layout& layout) {
  const size_t s = topo.site_levels;
  int64_t site_gpus = Prod(layout.dp, 0, s) * Prod(layout.tp_model, 0, s) *
                      Prod(layout.tp_ff, 0, s) * Prod(layout.pp, 0, s) * Prod(layout.ep, 0, s);
  double dp_site = static_cast<double>(Prod(layout.dp, 0, s));
  double w = gpu.bytes_per_word();
  // optimal_parallelism.ipynb training_memory_reqs_bytes with recompute_activations=None:
  // parameters are not sharded over DP (PP would need them), optimizer state (factor 4) is.
  double need = shape.params * w * dp_site + shape.params * w * 4.0;
  return need <= static_cast<double>(site_gpus) * gpu.memory_bytes;
}

double MatmulPairSeconds(const Gpu& gpu, const ModelShape& shape, const Layout& layout,
                         bool weight_grads_io) {
  double b = static_cast<double>(MicrobatchTokens(shape, layout));
  double dff = static_cast<double>(shape.d_ff / layout.TPFF());
  double dm = static_cast<double>(shape.d_model / layout.TPModel());
  const double pair = MatmulSeconds(gpu, dff, dm, b) + MatmulSeconds(gpu, dm, dff, b);
  if (!weight_grads_io) return pair;
  // Forward and activation gradients as the pair; the weight gradients load and store the
  // accumulated gradient tiles (the reference's for_weight_grads): the mean of the three.
  const double weight_grads =
      MatmulSeconds(gpu, dff, dm, b, true) + MatmulSeconds(gpu, dm, dff, b, true);
  return (2 * pair + weight_grads) / 3;
}

StepTime EvaluateStep(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                      const Layout& layout, const EvalOptions& options) {
  return EvaluateStepWithMatmul(
      gpu, topo, shape, layout, options,
      MatmulPairSeconds(gpu, shape, layout, options.combine == Combine::kReference));
}

StepTime EvaluateStepWithMatmul(const Gpu& gpu, const Topology& topo, const ModelShape& shape,
                                const Layout& layout, const EvalOptions& options,
                                double matmul_pair_s) {
  StepTime t;
  const size_t levels = topo.levels.size();
  const size_t site = topo.site_levels;
  const double n_gpu = static_cast<double>(layout.Gpus());
  const double layers = static_cast<double>(shape.layers);
  const double batch = static_cast<double>(shape.batch_tokens());
  const double w = gpu.bytes_per_word();
  const int64_t pp = layout.PP();
  const int64_t ep = layout.EP();
  const int64_t v = layout.interleave;

  t.ideal_s = 6.0 * shape.active_params * batch / (gpu.peak_flops * n_gpu);
  // Three matmul pairs per layer per microbatch: forward, activation gradients, weight gradients.
  t.matmul_s = 3.0 * static_cast<double>(shape.layers / pp) *
               static_cast<double>(shape.experts / ep) * static_cast<double>(layout.microbatches) *
               matmul_pair_s;

  for (size_t l = 0; l < levels; ++l) {
    const NetworkLevel& net = topo.levels[l];
    double wire = net.wire_bits > 0 ? net.wire_bits / 8.0 : w;
    const bool reference = options.combine == Combine::kReference;
    CommTime dp = AllReduceTime(net, wire, layout.dp[l], shape.params, n_gpu, 1,
                                static_cast<double>(Prod(layout.dp, l + 1, levels)));
    t.dp_s = reference ? std::max(t.dp_s, dp.bandwidth_s) : t.dp_s + dp.bandwidth_s;
    t.dp_latency_s += dp.latency_s;
    if (l >= site) {
      t.wan_s += dp.bandwidth_s;
      t.wan_latency_s += dp.latency_s;
    }
    // Two all-reduces per layer in the forward pass and two in the backward pass: over the
    // TP_model ranks of d_ff-sized activations and over the TP_ff ranks of d_model-sized ones.
    CommTime tpm = AllReduceTime(net, w, layout.tp_model[l], static_cast<double>(shape.d_ff), n_gpu,
                                 2 * layers,
                                 batch * static_cast<double>(Prod(layout.tp_model, l + 1, levels)));
    CommTime tpf =
        AllReduceTime(net, w, layout.tp_ff[l], static_cast<double>(shape.d_model), n_gpu,
                      2 * layers, batch * static_cast<double>(Prod(layout.tp_ff, l + 1, levels)));
    t.tp_s = reference ? std::max(t.tp_s, tpm.bandwidth_s + tpf.bandwidth_s)
                       : t.tp_s + tpm.bandwidth_s + tpf.bandwidth_s;
    t.tp_latency_s += tpm.latency_s + tpf.latency_s;
  }

  // Pipeline sends at stage boundaries (reference: p2p_comm_cost). With v virtual stages per
  // rank, 2 (PP v - 1) sends per token per step: at each level below the outermost one the
  // pipeline spans, 2 v prod(PP above) (PP_l - 1); at that outermost one the rest, 2 (PP_l v - 1)
  // (the v - 1 wrap-arounds included). A send may also have to reach another expert's GPU, so its
  // bandwidth is paid at max(pipeline level, expert level), weighted by the chance that two
  // random experts first share that level; its latency at max(pipeline level, outermost expert
  // level), in full (some token of the microbatch always goes that far, and all wait for it).
  auto ep_chance = [&](int ep_level) {
    if (ep_level < 0) return 1.0 / static_cast<double>(ep);
    return static_cast<double>(Prod(layout.ep, 0, ep_level + 1) - Prod(layout.ep, 0, ep_level)) /
           static_cast<double>(ep);
  };
  int max_pp_level = -1, max_ep_level = -1;
  for (size_t l = 0; l < site; ++l) {
    if (layout.pp[l] > 1) max_pp_level = static_cast<int>(l);
    if (layout.ep[l] > 1) max_ep_level = static_cast<int>(l);
  }
  const double dm = static_cast<double>(shape.d_model);
  for (int pl = 0; pl <= max_pp_level; ++pl) {
    const size_t pls = static_cast<size_t>(pl);
    const double sends =
        pl == max_pp_level
            ? 2.0 * static_cast<double>(layout.pp[pls] * v - 1)
            : 2.0 * static_cast<double>(v * Prod(layout.pp, pls + 1, site) * (layout.pp[pls] - 1));
    if (sends <= 0) continue;
    for (int el = -1; el < static_cast<int>(site); ++el) {
      const double chance = ep_chance(el);
      if (chance <= 0) continue;
      const size_t level = static_cast<size_t>(std::max(pl, el));
      t.pp_s +=
          chance * PointToPointTime(topo.levels[level], w, dm, n_gpu, sends, batch).bandwidth_s;
    }
    const size_t level = static_cast<size_t>(std::max(pl, max_ep_level));
    t.pp_latency_s += PointToPointTime(topo.levels[level], w, dm, n_gpu, sends, batch).latency_s;
  }
  // Expert routing at the layers that are not pipeline boundaries, likewise.
  const double expert_sends = 2.0 * (layers - static_cast<double>(pp * v));
  if (max_ep_level >= 0 && expert_sends > 0) {
    for (int el = 0; el <= max_ep_level; ++el) {
      const double chance = ep_chance(el);
      if (chance <= 0) continue;
      t.pp_s += chance * PointToPointTime(topo.levels[static_cast<size_t>(el)], w, dm, n_gpu,
                                          expert_sends, batch)
                             .bandwidth_s;
    }
    t.pp_latency_s += PointToPointTime(topo.levels[static_cast<size_t>(max_ep_level)], w, dm, n_gpu,
                                       expert_sends, batch)
                          .latency_s;
  }

  if (layout.zero_bubble) {
    t.bubble = 0;
  } else {
    double p = static_cast<double>(pp);
    double m = static_cast<double>(layout.microbatches);
    double z = static_cast<double>(v - 1) * std::max(0.0, p - m);
    t.bubble = (z + p - 1) / (p + static_cast<double>(v) * m + z - 1);
  }

  if (options.combine == Combine::kReference) {
    const double hidden = (options.overlap_tp ? t.tp_s : 0) + (options.overlap_pp ? t.pp_s : 0);
    const double shown = (options.overlap_tp ? 0 : t.tp_s) + (options.overlap_pp ? 0 : t.pp_s);
    double pipeline = (std::max(t.matmul_s, hidden) + shown) / (1 - t.bubble);
    if (!layout.zero_bubble) pipeline += t.tp_latency_s + t.pp_latency_s;
    t.step_s =
        (options.overlap_dp ? std::max(pipeline, t.dp_s) : pipeline + t.dp_s) + t.dp_latency_s;
    t.utilization = t.ideal_s / t.step_s;
    return t;
  }
  double overlapped = (options.overlap_tp ? t.tp_s : 0) + (options.overlap_dp ? t.dp_s : 0) +
                      (options.overlap_pp ? t.pp_s : 0);
  double exposed = (options.overlap_tp ? 0 : t.tp_s) + (options.overlap_dp ? 0 : t.dp_s) +
                   (options.overlap_pp ? 0 : t.pp_s);
  t.step_s = t.latency_s() + (std::max(t.matmul_s, overlapped) + exposed) / (1 - t.bubble);
  t.utilization = t.ideal_s / t.step_s;
  return t;
}

}  // namespace atl::plan
