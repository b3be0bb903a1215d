#include "plan/world.h"

#include <cmath>
#include <limits>

#include "plan/frontier.h"
#include "plan/table.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// The compute-optimal shape for the parameter count, with a world batch that splits evenly over
// the sites (each site's share rounded to f x 2^i sequences; unchanged when it already splits).
StatusOr<ModelShape> WorldShape(const WorldSettings& s) {
  ATOLL_ASSIGN_OR_RETURN(ModelShape shape, ShapeForParams(s.params, s.rules));
  const int64_t d = s.datacenters;
  if (shape.batch_sequences % d != 0) {
    double share = static_cast<double>(shape.batch_sequences) / static_cast<double>(d);
    shape.batch_sequences = d * RoundToSmooth(std::max(1.0, share));
  }
  return shape;
}

// Sites train on their own between exchanges: the WAN carries nothing per inner step.
Topology InnerTopology(const WorldSettings& s) {
  Topology t = SiteTopology(s.hardware);
  t.levels.push_back(NetworkLevel{"WAN", 0, kInf, 0});
  return t;
}

struct SitePlan {
  PlanResult plan;  // train_s includes the exposed exchange
  double exposed_s = 0;
};

std::optional<SitePlan> PlanSite(const WorldSettings& s, const ModelShape& shape, int64_t site) {
  const bool sync = s.strategy == WorldStrategy::kSync;
  Topology topo = sync ? WorldTopology(s, site) : InnerTopology(s);
  auto r = BestLayout(s.hardware.gpu, topo, shape, site, {s.datacenters}, s.search);
  if (!r) return std::nullopt;
  SitePlan p{*r, 0};
  if (!sync && s.datacenters > 1) {
    double h = static_cast<double>(s.inner_steps);
    double exchange = WanExchangeSeconds(s, shape.params);
    p.exposed_s = s.streaming ? std::max(0.0, exchange - h * r->step.step_s) / h : exchange / h;
    p.plan.train_s = (r->step.step_s + p.exposed_s) * shape.steps();
  }
  return p;
}

// A cheap bound: sync runs cannot beat the WAN's bandwidth time plus its latency per step.
double SyncWanFloorSeconds(const WorldSettings& s, const ModelShape& shape) {
  if (s.strategy != WorldStrategy::kSync || s.datacenters <= 1) return 0;
  return WanExchangeSeconds(s, shape.params) * shape.steps();
}

}  // namespace

StatusOr<WorldStrategy> ParseWorldStrategy(std::string_view name) {
  if (name == "sync") return WorldStrategy::kSync;
  if (name == "diloco") return WorldStrategy::kDiLoCo;
  return Status::InvalidArgument(
      fmt::format("unknown strategy '{}' (expected sync or diloco)", name));
}

Topology WorldTopology(const WorldSettings& s, int64_t gpus_per_dc) {
  Topology t = SiteTopology(s.hardware);
  NetworkLevel wan;
  wan.name = "WAN";
  // Per GPU, bidirectional: the site's uplink (each way) shared by its GPUs.
  wan.bandwidth = 2.0 * (s.wan_bits_per_s / 8.0) / static_cast<double>(gpus_per_dc);
  wan.latency_s = s.wan_latency_s;
  wan.ring_latency = true;
  wan.wire_bits = s.wan_bits;
  t.levels.push_back(wan);
  return t;
}

double WanExchangeSeconds(const WorldSettings& s, double params) {
  const double d = static_cast<double>(s.datacenters);
  if (d <= 1) return 0;
  double bytes = 2.0 * (d - 1) / d * params * s.wan_bits / 8.0;
  return bytes / (s.wan_bits_per_s / 8.0) + 2.0 * (d - 1) * s.wan_latency_s;
}

StatusOr<WorldResult> RunWorld(const WorldSettings& s) {
  if (s.datacenters < 1) return Status::InvalidArgument("--datacenters must be >= 1");
  if (s.wan_bits != 4 && s.wan_bits != 8 && s.wan_bits != 16) {
    return Status::InvalidArgument(fmt::format("--bits must be 16, 8 or 4, got {}", s.wan_bits));
  }
  if (!(s.wan_bits_per_s > 0)) return Status::InvalidArgument("WAN bandwidth must be positive");
  if (!(s.wan_latency_s >= 0)) return Status::InvalidArgument("WAN latency must be >= 0");
  if (s.inner_steps < 1) return Status::InvalidArgument("--inner-steps must be >= 1");
  if (!(s.months > 0)) return Status::InvalidArgument("--months must be positive");
  ATOLL_RETURN_IF_ERROR(ValidateHardware(s.hardware));

  WorldResult w;
  ATOLL_ASSIGN_OR_RETURN(w.shape, WorldShape(s));
  const ModelShape& shape = w.shape;
  const double limit = s.months * kSecondsPerMonth;
  const int64_t d = s.datacenters;
  const Gpu& gpu = s.hardware.gpu;

  // How many GPUs per site: as asked; else the fewest that finish in time with this WAN; else
  // the fewest that would finish if the sites were one datacenter (and report the overrun).
  int64_t site = s.gpus_per_dc;
  if (site <= 0 && SyncWanFloorSeconds(s, shape) < limit) {
    auto r = SmallestSite(gpu, shape, limit, d, [&](int64_t g) -> std::optional<PlanResult> {
      auto p = PlanSite(s, shape, g);
      if (!p) return std::nullopt;
      return p->plan;
    });
    if (r) site = r->layout.Gpus() / d;
  }
  if (site <= 0) {
    auto base = SmallestSite(gpu, shape, limit, d, [&](int64_t g) {
      return BestLayout(gpu, SiteTopology(s.hardware), shape, g * d, {}, s.search);
    });
    if (base) {
      site = base->layout.Gpus() / d;
      w.note = fmt::format(
          "no site size finishes in {} months with this WAN; showing the size "
          "one datacenter would need",
          s.months);
    } else {
      const double work_s = 6.0 * shape.active_params * shape.tokens / gpu.flop_per_s();
      site = shape.experts;
      while (work_s / static_cast<double>(site * d) >= limit && site < (int64_t{1} << 50)) {
        site *= 2;
      }
      w.note = fmt::format(
          "the model cannot be trained in {} months even in one datacenter "
          "(latency wall); showing the fewest GPUs that could",
          s.months);
    }
  }
  w.gpus_per_dc = site;
  auto p = PlanSite(s, shape, site);
  if (!p) {
    return Status::InvalidArgument(fmt::format(
        "no valid layout for {} GPUs per datacenter: parallel degrees must divide the model "
        "(d_model {}, layers {}, batch {} tokens) and the weights must fit in memory",
        site, shape.d_model, shape.layers, shape.batch_tokens()));
  }
  w.plan = p->plan;
  w.topology = s.strategy == WorldStrategy::kSync ? WorldTopology(s, site) : InnerTopology(s);
  w.exchange_s = WanExchangeSeconds(s, shape.params);
  w.exchange_exposed_s = p->exposed_s;
  w.step_s = w.plan.step.step_s + w.exchange_exposed_s;
  w.utilization = w.plan.step.ideal_s / w.step_s;
  w.train_s = w.step_s * shape.steps();
  w.finishes = w.train_s < limit;
  double per_exchange = d > 1 ? 2.0 * static_cast<double>(d - 1) / static_cast<double>(d) *
                                    shape.params * s.wan_bits / 8.0
                              : 0.0;
  w.wan_bytes_per_step = s.strategy == WorldStrategy::kSync
                             ? per_exchange
                             : per_exchange / static_cast<double>(s.inner_steps);

  // The same GPUs in one datacenter.
  auto single = BestLayout(gpu, SiteTopology(s.hardware), shape, site * d, {}, s.search);
  w.single_dc_utilization = single ? single->step.utilization : w.utilization;

  if (d == 1) {
    w.required_wan_bits_per_s = 0;
  } else {
    const double target = (1 - s.within) * w.single_dc_utilization;
    auto util_at = [&](double bps) {
      WorldSettings t = s;
      t.wan_bits_per_s = bps;
      auto q = PlanSite(t, shape, site);
      return q ? q->plan.step.ideal_s / (q->plan.step.step_s + q->exposed_s) : 0.0;
    };
    double lo = 1e3, hi = 1e18;
    if (util_at(hi) < target) {
      w.note += (w.note.empty() ? "" : "; ") +
                fmt::format(
                    "even an unlimited WAN cannot reach {:.0f}% of the single-datacenter "
                    "utilization: the ring's 2 (D-1) x {} of latency per step alone costs too "
                    "much",
                    (1 - s.within) * 100, FormatSeconds(s.wan_latency_s));
    } else if (util_at(lo) >= target) {
      w.required_wan_bits_per_s = lo;
    } else {
      for (int i = 0; i < 60; ++i) {
        double mid = std::sqrt(lo * hi);
        (util_at(mid) < target ? lo : hi) = mid;
      }
      w.required_wan_bits_per_s = hi;
    }
  }
  return w;
}

nlohmann::json WorldJson(const WorldResult& w, const WorldSettings& s) {
  const ModelShape& m = w.shape;
  auto opt = [](const std::optional<double>& v) -> nlohmann::json {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  return {{"gpu", s.hardware.gpu.name},
          {"network", s.hardware.network_name},
          {"strategy", s.strategy == WorldStrategy::kSync ? "sync" : "diloco"},
          {"datacenters", s.datacenters},
          {"wan_bits_per_s", s.wan_bits_per_s},
          {"wan_latency_s", s.wan_latency_s},
          {"wan_bits", s.wan_bits},
          {"inner_steps", s.inner_steps},
          {"streaming", s.streaming},
          {"months", s.months},
          {"params", m.params},
          {"d_model", m.d_model},
          {"layers", m.layers},
          {"experts", m.experts},
          {"compute_flop", m.compute},
          {"tokens", m.tokens},
          {"batch_tokens", m.batch_tokens()},
          {"steps", m.steps()},
          {"gpus_per_dc", w.gpus_per_dc},
          {"total_gpus", w.gpus_per_dc * s.datacenters},
          {"layout", LayoutJson(w.plan.layout, w.topology)},
          {"inner_step", StepJson(w.plan.step)},
          {"step_s", w.step_s},
          {"exchange_s", w.exchange_s},
          {"exchange_exposed_s", w.exchange_exposed_s},
          {"utilization", w.utilization},
          {"train_s", w.train_s},
          {"finishes", w.finishes},
          {"wan_bytes_per_step_per_dc", w.wan_bytes_per_step},
          {"wan_bytes_per_step_total", w.wan_bytes_per_step * static_cast<double>(s.datacenters)},
          {"single_dc_utilization", w.single_dc_utilization},
          {"required_wan_bits_per_s", opt(w.required_wan_bits_per_s)},
          {"note", w.note}};
}

std::string WorldReport(const WorldResult& w, const WorldSettings& s) {
  const ModelShape& m = w.shape;
  const StepTime& st = w.plan.step;
  const bool sync = s.strategy == WorldStrategy::kSync;
  std::string out = DescribeHardware(s.hardware);
  out += fmt::format(
      "model: {} parameters (d_model {}, {} layers{}), C = {} FLOP, {} tokens, batch {} tokens "
      "({} per datacenter), {} steps\n",
      FormatCount(m.params), m.d_model, m.layers,
      m.experts > 1 ? fmt::format(", {} experts", m.experts) : "", FormatSci(m.compute),
      FormatCount(m.tokens), FormatCount(static_cast<double>(m.batch_tokens())),
      FormatCount(static_cast<double>(m.batch_tokens() / s.datacenters)), FormatSci(m.steps()));
  out += fmt::format(
      "world: {} datacenters x {} {} = {} GPUs; WAN {} per datacenter each way, {} latency\n",
      s.datacenters, FormatCount(static_cast<double>(w.gpus_per_dc)), s.hardware.gpu.name,
      FormatCount(static_cast<double>(w.gpus_per_dc * s.datacenters)),
      FormatBitsPerSecond(s.wan_bits_per_s), FormatSeconds(s.wan_latency_s));
  out += sync ? fmt::format(
                    "strategy: sync, hierarchical all-reduce every step, {}-bit "
                    "gradients on the WAN\n",
                    s.wan_bits)
              : fmt::format(
                    "strategy: DiLoCo, {} inner steps per exchange, {}-bit "
                    "pseudo-gradients on the WAN{}\n",
                    s.inner_steps, s.wan_bits,
                    s.streaming ? ", streamed (overlapped with inner steps)" : "");
  out += fmt::format("layout: {}\nplacement: {}\n\n", DescribeLayout(w.plan.layout),
                     DescribePlacement(w.plan.layout, w.topology));
  TextTable t;
  t.AddColumn("per step", TextTable::Align::kLeft);
  t.AddColumn("time");
  t.AddColumn("formula", TextTable::Align::kLeft);
  auto row = [&](const char* what, double v, const char* f) {
    t.AddRow({what, FormatSeconds(v), f});
  };
  row("ideal (100% of peak)", st.ideal_s, "6 (N/E) B / (GPUs x peak)");
  row("matmuls", st.matmul_s, "3 (L/PP)(E/EP) m [t(d_ff/TPff, d/TPm, b) + t(d/TPm, d_ff/TPff, b)]");
  row("TP all-reduces", st.tp_s, "sum_l 2(p_l-1) d s r w / (GPUs BW_l / 2), s = 2L, r = B");
  row("PP/EP sends", st.pp_s, "2 (PP v - 1) B d w / (GPUs BW / 2)");
  row("DP inside sites", st.dp_s - st.wan_s, "sum_l 2(p_l-1) N w r / (GPUs BW_l / 2)");
  row("DP over the WAN", st.wan_s, "2 (D-1)/D N (bits/8) / WAN bytes/s  (sync)");
  row("latency (TP, PP, DP)", st.latency_s() - st.wan_latency_s, "2 lambda per collective step");
  row("WAN latency", st.wan_latency_s, "2 (D-1) lambda_WAN  (sync ring)");
  row("DiLoCo exchange, exposed", w.exchange_exposed_s,
      s.streaming ? "max(0, T_x - H T_inner) / H" : "T_x / H");
  t.AddRow({"pipeline bubble", fmt::format("{:.1f}%", st.bubble * 100),
            "(z + PP - 1)/(PP + v m + z - 1)"});
  row("step", w.step_s, "lat + (max(matmul, overlapped) + exposed)/(1 - bubble) [+ DiLoCo]");
  out += t.Render();
  out += fmt::format("\nutilization {:.3f} (single datacenter with the same GPUs: {:.3f})\n",
                     w.utilization, w.single_dc_utilization);
  out += fmt::format("wall time {:.3g} months (limit {}){}\n", w.train_s / kSecondsPerMonth,
                     s.months, w.finishes ? "" : "  -- does NOT finish in time");
  out += fmt::format(
      "WAN exchange: {} each ({} per datacenter uplink)\n", FormatSeconds(w.exchange_s),
      FormatBytes(s.datacenters > 1 ? w.wan_bytes_per_step * (sync ? 1.0 : s.inner_steps) : 0.0));
  out += fmt::format("WAN bytes per step: {} through each datacenter's uplink, {} over all\n",
                     FormatBytes(w.wan_bytes_per_step),
                     FormatBytes(w.wan_bytes_per_step * static_cast<double>(s.datacenters)));
  if (s.datacenters == 1) {
    out += "WAN bandwidth needed: none (one datacenter)\n";
  } else if (w.required_wan_bits_per_s) {
    out += fmt::format(
        "WAN bandwidth needed to stay within {:.0f}% of the single-datacenter utilization: {} "
        "per datacenter\n",
        s.within * 100, FormatBitsPerSecond(*w.required_wan_bits_per_s));
  }
  if (!w.note.empty()) out += "note: " + w.note + "\n";
  return out;
}

}  // namespace atl::plan
