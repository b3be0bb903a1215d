// Training across datacenters: D sites, each with its GPUs and internal network, joined by WAN
// links. Beyond the paper: tensor and pipeline parallelism stay inside a site, data-parallel (or
// DiLoCo) replicas span the sites.
//
// The world is the single-site model with one more network level, the WAN, that only
// data-parallel traffic crosses (Topology::site_levels marks the boundary):
//   - each site's uplink carries `wan_bits_per_s` each way; in the reference's per-GPU,
//     bidirectional convention that is 2 x wan_bytes_per_s / G GPUs of the site;
//   - the WAN all-reduce is a ring over the D sites: 2 (D-1) latencies, and
//     2 (D-1)/D x P x bits/8 bytes through each site's uplink per exchange (P parameters);
//   - sync: that exchange every step (it is the outermost level of the hierarchical DP
//     all-reduce of step.h, overlapped with matmuls like the rest of DP);
//   - DiLoCo: sites train independently for H inner steps, then exchange pseudo-gradients:
//     exposed time per inner step = T_exchange / H, or with streaming (fragments overlapped with
//     the next H inner steps) max(0, T_exchange - H x T_inner) / H.
//   - gradients on the WAN may be sent at 16, 8 or 4 bits.
// With D = 1 every WAN term is zero and the result is the single-site model exactly.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "plan/hardware.h"
#include "plan/search.h"
#include "plan/shape.h"

namespace atl::plan {

enum class WorldStrategy { kSync, kDiLoCo };
StatusOr<WorldStrategy> ParseWorldStrategy(std::string_view name);

struct WorldSettings {
  Hardware hardware;  // each site's GPUs and internal network
  ShapeRules rules;
  double params = 1e12;
  int64_t datacenters = 1;
  double wan_bits_per_s = 400e9;  // per site, each direction
  double wan_latency_s = 0.02;
  WorldStrategy strategy = WorldStrategy::kSync;
  int64_t inner_steps = 100;  // DiLoCo H
  int wan_bits = 16;          // bits per gradient word on the WAN: 16, 8 or 4
  bool streaming = false;     // DiLoCo: overlap the exchange with the next inner steps
  double months = 3;
  int64_t gpus_per_dc = 0;  // 0: the smallest E x 2^i that finishes in time
  SearchOptions search;
  double within = 0.05;  // "within 5% of the single-datacenter utilization"
};

struct WorldResult {
  ModelShape shape;   // batch is the world batch (D x per-site batch)
  Topology topology;  // site levels + WAN
  int64_t gpus_per_dc = 0;
  bool finishes = false;  // within the time limit
  PlanResult plan;        // layout and step of the inner (or only) step
  double step_s = 0;      // effective time per step, exchange included
  double utilization = 0;
  double train_s = 0;
  double exchange_s = 0;             // one WAN exchange (bandwidth + latency)
  double exchange_exposed_s = 0;     // exposed exchange time per step (DiLoCo)
  double wan_bytes_per_step = 0;     // through each site's uplink, each direction, per step
  double single_dc_utilization = 0;  // same GPUs in one site (WAN replaced by its fabric)
  std::optional<double> required_wan_bits_per_s;  // to stay within `within` of it
  std::string note;                               // why not, when something is unreachable
};

StatusOr<WorldResult> RunWorld(const WorldSettings& settings);

// The world topology for sites of `gpus_per_dc` GPUs.
Topology WorldTopology(const WorldSettings& settings, int64_t gpus_per_dc);
// Seconds for one WAN exchange of the model's parameters at `wan_bits` bits per word.
double WanExchangeSeconds(const WorldSettings& settings, double params);

std::string WorldReport(const WorldResult& result, const WorldSettings& settings);
nlohmann::json WorldJson(const WorldResult& result, const WorldSettings& settings);

}  // namespace atl::plan
