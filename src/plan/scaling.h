// How WAN traffic and communication time grow with model size N and datacenter count D, for
// three ways of exchanging gradients between sites (bytes per word w = bits/8, payload
// M = N w, uplink bandwidth BW bytes/s each way, latency lambda, R data-parallel replicas per
// site, H DiLoCo inner steps):
//
//   ring          one flat ring over all D R replicas; every site boundary carries the ring:
//                 bytes per site = 2 (DR-1)/(DR) M,  time = bytes/BW + 2 (DR-1) lambda
//   hierarchical  reduce inside each site, ring over the D sites, broadcast inside:
//                 bytes per site = 2 (D-1)/D M,      time = bytes/BW + 2 (D-1) lambda
//   DiLoCo        the hierarchical exchange once every H steps:
//                 bytes per site per step = 2 (D-1)/D M / H,  time per step = T_hier / H
//   total WAN bytes per step = D x bytes per site.
//
// The report fits log-log slopes of each column against N and against D and says plainly which
// grow linearly.
//
// Thread-safety: pure functions.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace atl::plan {

struct ScalingSettings {
  std::vector<double> params = {1e11, 1e12, 1e13, 1e14, 1e15};
  std::vector<int64_t> datacenters = {2, 4, 8, 16, 32, 64};
  double wan_bits_per_s = 400e9;
  double wan_latency_s = 0.02;
  int wan_bits = 16;
  int64_t inner_steps = 100;
  int64_t replicas_per_dc = 64;
};

struct ScalingRow {
  double params = 0;
  int64_t datacenters = 0;
  double ring_bytes = 0, hier_bytes = 0, diloco_bytes = 0;  // per site, per step
  double ring_s = 0, hier_s = 0, diloco_s = 0;              // per step
};

struct Slope {
  double vs_params = 0;       // d log y / d log N, averaged over D
  double vs_datacenters = 0;  // d log y / d log D, averaged over N
};

struct ScalingResult {
  std::vector<ScalingRow> rows;
  // Per-site bytes, total bytes (D x per site) and time, for ring, hierarchical, DiLoCo.
  Slope ring_bytes, hier_bytes, diloco_bytes;
  Slope ring_total, hier_total, diloco_total;
  Slope ring_time, hier_time, diloco_time;
  std::string answer;  // the plain-language conclusion
};

ScalingRow ScalingPoint(const ScalingSettings& s, double params, int64_t datacenters);
ScalingResult RunScaling(const ScalingSettings& s);
std::string ScalingReport(const ScalingResult& r, const ScalingSettings& s);
nlohmann::json ScalingJson(const ScalingResult& r, const ScalingSettings& s);

}  // namespace atl::plan
