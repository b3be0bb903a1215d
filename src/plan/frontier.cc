#include "plan/frontier.h"

#include <cmath>
#include <limits>

#include "core/log.h"
#include "plan/table.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Smallest x in [lo, hi] (log scale) with f(x) >= 0, f increasing; +inf if none.
template <class F>
double SolveIncreasing(F f, double lo, double hi) {
  if (f(hi) < 0) return kInf;
  if (f(lo) >= 0) return lo;
  for (int i = 0; i < 200; ++i) {
    double mid = std::sqrt(lo * hi);
    (f(mid) < 0 ? lo : hi) = mid;
  }
  return hi;
}

std::string Months(double seconds) { return fmt::format("{:.2f}", seconds / kSecondsPerMonth); }

}  // namespace

double LatencyWallFlop(const Hardware& hw, const ShapeRules& rules, double months) {
  const double t = hw.gpu.latency_per_matmul_s;
  if (!(t > 0)) return kInf;
  const double limit = months * kSecondsPerMonth;
  // T_min(X) = 4 L t D / B grows with the width product X, so bisect on X.
  auto f = [&](double x) {
    SmoothShape s = SmoothShapeForWidthProduct(x, rules);
    return 4.0 * s.layers * t * s.tokens / s.batch_tokens - limit;
  };
  double x = SolveIncreasing(f, 1e2, 1e30);
  return std::isfinite(x) ? SmoothShapeForWidthProduct(x, rules).compute : kInf;
}

double CriticalComputeFlop(const Hardware& hw, const ShapeRules& rules, double months) {
  const Gpu& g = hw.gpu;
  const double limit = months * kSecondsPerMonth;
  const double w = g.bytes_per_word();
  const double b_min = g.flop_per_s() / g.hbm_bandwidth * w / 2.0;
  const NetworkLevel& fast = hw.network.front();
  const double s_min =
      std::isfinite(fast.bandwidth) ? 4.0 / 3.0 * g.peak_flops * w / fast.bandwidth : 0.0;
  const double domain = fast.size > 0 ? static_cast<double>(fast.size) : kInf;
  auto tp_fast = [&](double x) {
    double by_shard = s_min > 0 ? x / (s_min * s_min) : kInf;
    return std::max(1.0, std::min(domain, by_shard));
  };
  if (!std::isfinite(tp_fast(1e30))) return kInf;
  auto f = [&](double x) {
    SmoothShape s = SmoothShapeForWidthProduct(x, rules);
    double needed = s.compute / (limit * g.flop_per_s());
    double capacity = s.batch_tokens / b_min * tp_fast(x);
    return std::log(needed) - std::log(capacity);
  };
  double x = SolveIncreasing(f, 1e2, 1e30);
  return std::isfinite(x) ? SmoothShapeForWidthProduct(x, rules).compute : kInf;
}

FrontierResult RunFrontier(const FrontierSettings& settings) {
  const double start = NowSeconds();
  FrontierResult result;
  const Hardware& hw = settings.hardware;
  const Topology topo = SiteTopology(hw);
  const double limit = settings.months * kSecondsPerMonth;
  result.utilization_cap = hw.gpu.effective_utilization;

  bool stopped = false;
  for (int64_t width : WidthGrid(256, int64_t{1} << 30)) {
    ModelShape shape = ShapeForWidth(width, settings.rules);
    if (shape.compute < settings.min_flop) continue;
    if (shape.compute > settings.max_flop) break;
    FrontierRow row;
    row.shape = shape;
    if (!stopped) {
      auto plan = SmallestCluster(hw.gpu, topo, shape, limit, {}, settings.search);
      if (plan) {
        row.state = FrontierRow::State::kFeasible;
        row.plan = *plan;
        if (!result.crossover_flop && plan->step.utilization <= 0.8 * result.utilization_cap) {
          result.crossover_flop = shape.compute;
        }
        result.largest_feasible_flop = shape.compute;
      } else {
        // Like the reference, stop at the first width that cannot finish: bigger ones are
        // slower still (more layers, more steps per unit of batch).
        row.state = FrontierRow::State::kInfeasible;
        stopped = true;
      }
    }
    result.rows.push_back(row);
  }
  result.latency_wall_flop = LatencyWallFlop(hw, settings.rules, settings.months);
  result.critical_compute_flop = CriticalComputeFlop(hw, settings.rules, settings.months);
  result.elapsed_s = NowSeconds() - start;
  return result;
}

nlohmann::json StepJson(const StepTime& s) {
  return {{"step_s", s.step_s},
          {"ideal_s", s.ideal_s},
          {"matmul_s", s.matmul_s},
          {"tp_s", s.tp_s},
          {"pp_s", s.pp_s},
          {"dp_s", s.dp_s},
          {"wan_s", s.wan_s},
          {"latency_s", s.latency_s()},
          {"tp_latency_s", s.tp_latency_s},
          {"pp_latency_s", s.pp_latency_s},
          {"dp_latency_s", s.dp_latency_s},
          {"wan_latency_s", s.wan_latency_s},
          {"bubble", s.bubble},
          {"utilization", s.utilization}};
}

nlohmann::json LayoutJson(const Layout& l, const Topology& topo) {
  nlohmann::json levels = nlohmann::json::array();
  for (size_t i = 0; i < topo.levels.size(); ++i) {
    levels.push_back({{"level", topo.levels[i].name},
                      {"dp", l.dp[i]},
                      {"tp_model", l.tp_model[i]},
                      {"tp_ff", l.tp_ff[i]},
                      {"pp", l.pp[i]},
                      {"ep", l.ep[i]}});
  }
  return {{"dp", l.DP()},
          {"tp_model", l.TPModel()},
          {"tp_ff", l.TPFF()},
          {"pp", l.PP()},
          {"ep", l.EP()},
          {"microbatches", l.microbatches},
          {"interleave", l.interleave},
          {"zero_bubble", l.zero_bubble},
          {"placement", levels}};
}

nlohmann::json FrontierJson(const FrontierResult& r, const FrontierSettings& s) {
  auto opt = [](const std::optional<double>& v) -> nlohmann::json {
    return v ? nlohmann::json(*v) : nlohmann::json(nullptr);
  };
  auto finite = [](double v) -> nlohmann::json {
    return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr);
  };
  const Topology topo = SiteTopology(s.hardware);
  nlohmann::json rows = nlohmann::json::array();
  for (const auto& row : r.rows) {
    const ModelShape& m = row.shape;
    nlohmann::json j = {{"compute_flop", m.compute},
                        {"params", m.params},
                        {"d_model", m.d_model},
                        {"d_ff", m.d_ff},
                        {"layers", m.layers},
                        {"experts", m.experts},
                        {"batch_tokens", m.batch_tokens()},
                        {"tokens", m.tokens},
                        {"steps", m.steps()}};
    switch (row.state) {
      case FrontierRow::State::kFeasible:
        j["state"] = "feasible";
        j["gpus"] = row.plan.layout.Gpus();
        j["train_s"] = row.plan.train_s;
        j["utilization"] = row.plan.step.utilization;
        j["layout"] = LayoutJson(row.plan.layout, topo);
        j["step"] = StepJson(row.plan.step);
        break;
      case FrontierRow::State::kInfeasible:
        j["state"] = "infeasible";
        break;
      case FrontierRow::State::kNotSearched:
        j["state"] = "not_searched";
        break;
    }
    rows.push_back(j);
  }
  return {{"gpu", s.hardware.gpu.name},
          {"network", s.hardware.network_name},
          {"batch_rule", BatchRuleName(s.rules.batch)},
          {"sparse", s.rules.sparse},
          {"months", s.months},
          {"zero_bubble", s.search.zero_bubble && !s.search.both_schedules},
          {"pipeline", s.search.both_schedules ? "both"
                       : s.search.zero_bubble  ? "zero-bubble"
                                               : "1f1b"},
          {"combine", s.search.eval.combine == Combine::kReference ? "reference" : "atoll"},
          {"overlap",
           {{"tp", s.search.eval.overlap_tp},
            {"dp", s.search.eval.overlap_dp},
            {"pp", s.search.eval.overlap_pp}}},
          {"utilization_cap", r.utilization_cap},
          {"crossover_flop", opt(r.crossover_flop)},
          {"largest_feasible_flop", opt(r.largest_feasible_flop)},
          {"latency_wall_flop", finite(r.latency_wall_flop)},
          {"critical_compute_flop", finite(r.critical_compute_flop)},
          {"elapsed_s", r.elapsed_s},
          {"rows", rows}};
}

std::string FrontierReport(const FrontierResult& r, const FrontierSettings& s) {
  const Topology topo = SiteTopology(s.hardware);
  std::string out = DescribeHardware(s.hardware);
  out +=
      fmt::format("rules: batch {}, {}, {}-token sequences, {} tokens per parameter, {} months\n",
                  BatchRuleName(s.rules.batch), s.rules.sparse ? "sparse (MoE)" : "dense",
                  s.rules.seq_len, s.rules.tokens_per_param, s.months);
  const EvalOptions& e = s.search.eval;
  const bool reference = e.combine == Combine::kReference;
  // What hides behind the matmuls; with the reference's combination, overlapped DP hides behind
  // the whole pipeline instead.
  std::string hidden;
  for (const auto& [on, name] : {std::pair{e.overlap_tp, "TP"}, std::pair{e.overlap_pp, "PP"},
                                 std::pair{e.overlap_dp && !reference, "DP"}}) {
    if (on) hidden += (hidden.empty() ? "" : ", ") + std::string(name);
  }
  if (hidden.empty()) hidden = "nothing";
  const std::string pipeline = s.search.both_schedules
                                   ? "interleaved 1F1B and zero-bubble pipelines tried"
                               : s.search.zero_bubble ? "zero-bubble pipeline"
                                                      : "interleaved 1F1B pipeline";
  const std::string how =
      reference ? fmt::format(
                      "the reference notebook's (levels' bandwidth overlapped, DP outside "
                      "the bubble{})",
                      e.overlap_dp ? " and hidden behind the pipeline" : "")
                : "atoll's (levels in sequence, overlapped traffic inside the pipeline)";
  out += fmt::format("step: {}, {}, {} hidden behind matmuls\n\n", how, pipeline, hidden);
  TextTable t;
  for (const char* h : {"compute", "params", "d_model", "layers"}) t.AddColumn(h);
  if (s.rules.sparse) t.AddColumn("E");
  for (const char* h : {"batch", "GPUs"}) t.AddColumn(h);
  t.AddColumn("layout", TextTable::Align::kLeft);
  for (const char* h : {"util", "months", "matmul", "TP", "PP", "DP", "latency", "bubble"}) {
    t.AddColumn(h);
  }
  t.AddColumn("placement", TextTable::Align::kLeft);
  for (const auto& row : r.rows) {
    const ModelShape& m = row.shape;
    std::vector<std::string> c = {FormatSci(m.compute), FormatCount(m.params),
                                  std::to_string(m.d_model), std::to_string(m.layers)};
    if (s.rules.sparse) c.push_back(std::to_string(m.experts));
    c.push_back(FormatCount(static_cast<double>(m.batch_tokens())));
    if (row.state == FrontierRow::State::kFeasible) {
      const StepTime& st = row.plan.step;
      const double steps = m.steps();
      c.push_back(FormatCount(static_cast<double>(row.plan.layout.Gpus())));
      c.push_back(DescribeLayout(row.plan.layout));
      c.push_back(fmt::format("{:.3f}", st.utilization));
      c.push_back(Months(row.plan.train_s));
      for (double v : {st.matmul_s, st.tp_s, st.pp_s, st.dp_s, st.latency_s()}) {
        c.push_back(Months(v * steps));
      }
      c.push_back(fmt::format("{:.3f}", st.bubble));
      c.push_back(DescribePlacement(row.plan.layout, topo));
    } else {
      c.push_back("-");
      c.push_back(row.state == FrontierRow::State::kInfeasible
                      ? fmt::format("cannot finish in {} months", s.months)
                      : "not searched (a smaller run already cannot finish)");
      for (int i = 0; i < 9; ++i) c.push_back("");
    }
    t.AddRow(c);
  }
  out += t.Render();
  out +=
      "\n(matmul, TP, PP, DP, latency: months over the whole run; communication is bandwidth "
      "time, overlapped with matmuls where allowed)\n\n";
  auto flop = [](const std::optional<double>& v, const char* none) {
    return v ? FormatSci(*v) + " FLOP" : std::string(none);
  };
  out += fmt::format(
      "crossover_flop:        {}  (first run with utilization <= 80% of the {:.2f} "
      "cap)\n",
      flop(r.crossover_flop, "none in the sweep"), r.utilization_cap);
  out += fmt::format("largest_feasible_flop: {}  (largest run that finishes in {} months)\n",
                     flop(r.largest_feasible_flop, "none"), s.months);
  out += fmt::format(
      "latency wall:          {}  (closed form: 4 L t_matmul D/B = {} months)\n",
      std::isfinite(r.latency_wall_flop) ? FormatSci(r.latency_wall_flop) + " FLOP" : "none",
      s.months);
  out += fmt::format(
      "critical compute:      {}  (closed form: GPUs at the cap = B/b_min x TP_fast)\n",
      std::isfinite(r.critical_compute_flop) ? FormatSci(r.critical_compute_flop) + " FLOP"
                                             : "none");
  out += fmt::format("swept {} budgets in {:.3f} s\n", r.rows.size(), r.elapsed_s);
  return out;
}

}  // namespace atl::plan
