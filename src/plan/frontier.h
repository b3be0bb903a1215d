// The frontier sweep: for every model width, the compute-optimal run, the smallest cluster that
// trains it within the time limit and its best layout; then where utilization starts to fall
// and how far training can go at all.
//
// As the reference notebook's simulate_training_runs (Erdil & Schneider-Joseph): widths
// f x 2^i (f odd), d_ff = 4 d_model, the sweep stops at the first width that cannot finish in
// time; "linear scaling ends" where utilization first drops to 80% of its cap.
//
// Two closed forms come with it (docs/PLANNER.md derives them):
//   latency wall     C_wall: the compute at which k L t_matmul x (D / B) = T_limit, with k = 4
//                    sequential matmuls per layer per step (two forward, two for activation
//                    gradients; layer_and_batch_scaling.ipynb of the reference).
//   critical compute C_crit: the compute at which the GPUs needed at the utilization cap,
//                    C / (T_limit peak eff), equal the GPUs the critical batch can keep at the
//                    HBM roofline with tensor parallelism inside the fastest network domain:
//                    B / b_min x TP_fast, b_min = (peak eff / HBM BW) (bytes per word / 2),
//                    TP_fast = min(level-0 size, d_model d_ff / s_min^2),
//                    s_min = (4/3) peak (bytes per word) / level-0 bandwidth.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "plan/hardware.h"
#include "plan/search.h"
#include "plan/shape.h"

namespace atl::plan {

struct FrontierSettings {
  Hardware hardware;
  ShapeRules rules;
  double months = 3;  // training time limit
  SearchOptions search;
  double min_flop = 1e24;
  double max_flop = 1e34;
};

struct FrontierRow {
  ModelShape shape;
  enum class State { kFeasible, kInfeasible, kNotSearched } state = State::kNotSearched;
  PlanResult plan;  // valid when feasible
};

struct FrontierResult {
  std::vector<FrontierRow> rows;
  double utilization_cap = 0;                   // effective_utilization of the GPU
  std::optional<double> crossover_flop;         // first compute with utilization <= 0.8 cap
  std::optional<double> largest_feasible_flop;  // largest compute that finishes in time
  double latency_wall_flop = 0;                 // closed form; +inf when latencies are zero
  double critical_compute_flop = 0;             // closed form; +inf when bandwidth is unbounded
  double elapsed_s = 0;                         // wall time of the sweep
};

FrontierResult RunFrontier(const FrontierSettings& settings);

// Closed forms (see the file comment).
double LatencyWallFlop(const Hardware& hw, const ShapeRules& rules, double months);
double CriticalComputeFlop(const Hardware& hw, const ShapeRules& rules, double months);

std::string FrontierReport(const FrontierResult& result, const FrontierSettings& settings);
nlohmann::json FrontierJson(const FrontierResult& result, const FrontierSettings& settings);

// One row's step in JSON (shared with world reports).
nlohmann::json StepJson(const StepTime& step);
nlohmann::json LayoutJson(const Layout& layout, const Topology& topo);

}  // namespace atl::plan
