// The planner inside training (DESIGN invariant 5: plan/ and the engine speak one vocabulary).
// Before the first step `atoll train` prints what a step of this run should take on this machine,
// in three parts, and after the last step each part measured against it; each site's leader
// writes OUT/plan.json (a world's site-N/plan.json; the report shows the lowest site's).
//
//   compute    the rank's forward, backward and optimizer: plan/calibrate.h's fit of this
//              machine's constants (`atoll plan calibrate --save`, <cache>/calibration.json) on
//              the rank's share of the batch, scaled for the cores it gets: the fit is of runs
//              with `threads` threads alone on the machine, so a rank whose processes and
//              threads oversubscribe the cores (procs x threads > cores) is slower by that factor.
//   in-site    gradient reductions not hidden by backward (data parallel): measured, but not
//              predicted (no calibrated constant for the shared-memory MPI transport): 0 predicted
//              without data parallelism.
//   WAN wait   the engine's exchanges over the configured links, bounded by the slowest link and
//              the longest latency of any pair: sync, every step, a ring all-reduce of the
//              gradient (2 (D - 1) / D of its float32, or int64 in the reproducible mode, words
//              through each link; 2 (D - 1) hops) and of the losses (2 (D - 1) more hops);
//              diloco, once per H steps, and streaming, a fragment every H / P steps less what
//              tau steps of compute hide: each link carries 2 x the encoding (world.codec, block
//              scales included) of the exchange / D, in two one-way trips. Not modelled: async
//              pushes, the coordinator's rounds, the fingerprints' all-gather.
// Measured: the median over the steps after `skip` of step_ms - wan_ms (compute and in-site), and
// the mean of wan_ms over them but the last (an exchange's wait falls on its step only; the last
// also carries the final whole-model exchange), in this process's metrics.
//
// Thread-safety: pure functions.
#pragma once

#include <array>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/config.h"

namespace atl {

struct StepParts {
  double compute_s = 0;
  double in_site_s = 0;
  double wan_s = 0;
  double total() const { return compute_s + in_site_s + wan_s; }
};

struct StepPrediction {
  bool have_compute = false;  // false: no calibration here, or tp/pp ranks (compute_s is 0)
  bool have_wan = true;       // false: async, or streaming without the compute part
  StepParts parts;
  std::string basis;  // what the compute part rests on, or why there is none
};

// <cache>/calibration.json (ATOLL_CACHE_DIR or .cache).
std::string DefaultCalibrationPath();

// plan/calibrate.h's three features (FLOP, matmuls, parameters) of one rank's step of `cfg`.
std::array<double, 3> RankStepFeatures(const RunConfig& cfg);

// The prediction for one rank of `cfg` running `threads` OpenMP threads beside procs_on_host
// processes (itself included) on a machine of `cores` cores.
StepPrediction PredictStep(const RunConfig& cfg, int threads, int procs_on_host, int cores,
                           const std::string& calibration_path);

// The processes of this run on this host: ATOLL_LOCAL_PROCS (atoll launch sets it), else
// OMPI_COMM_WORLD_LOCAL_SIZE (mpirun), else 1.
int ProcsOnHost();

// Measured parts from a process's per-step step_ms and wan_ms (same length), skipping `skip`.
StepParts MeasuredParts(const std::vector<double>& step_ms, const std::vector<double>& wan_ms,
                        double in_site_s, int skip);

// "predicted step 410 ms = compute 402 + in-site 0 + WAN wait 8 (basis)"
std::string DescribePrediction(const StepPrediction& p);
// The table predicted against measured, one line per part, with each ratio.
std::string DescribeComparison(const StepPrediction& p, const StepParts& measured);
// OUT/plan.json's rows: [{part, predicted_ms, measured_ms}, ...] (predicted null where none).
std::string ComparisonJson(const StepPrediction& p, const StepParts& measured);

}  // namespace atl
