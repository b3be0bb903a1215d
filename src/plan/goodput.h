// Goodput: the fraction of wall-clock time that becomes kept training progress when GPUs fail.
//
// A Monte Carlo simulation of one run: hard failures arrive as a Poisson process with rate
// N x (per-GPU rate); silent data corruption (SDC) arrives likewise and is only noticed
// `sdc_detection_delay_s` later, when every state saved after it is suspect. The run writes a
// persistent checkpoint every `interval` of progress (costing `checkpoint_cost_s` of stalled
// time); after a failure it restarts (restart_base_s + restart_per_1k_gpus_s x N / 1000: start-up
// grows with the GPU count) and resumes from the newest clean state:
//   - checkpoint recovery: the newest persistent checkpoint;
//   - replica recovery: an in-memory copy on peer GPUs, refreshed every `replica_interval_s`
//     (costing replica_cost_s), restarted in replica_restart_base_s + growth; persistent
//     checkpoints are still written every `persistent_interval_s` for SDC roll-backs, since a
//     replica made after a corruption is corrupt too.
//
// Defaults are calibrated on Llama 3 (Dubey et al. 2024, section 3.3.4): 466 interruptions (6 of
// them SDC) in 54 days on 16,384 H100s, with more than 90% effective training time.
//
// The analytic optimum to compare with: Young (1974) tau = sqrt(2 delta M) and Daly (2006)
// tau = sqrt(2 delta M) [1 + sqrt(delta / 2M) / 3 + (delta / 2M) / 9] - delta, M the system MTBF.
//
// Thread-safety: pure functions; randomness is counter-based (seed, trial, draw).
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl::plan {

enum class Recovery { kCheckpoint, kReplica };

struct GoodputSettings {
  int64_t gpus = 16384;
  double days = 54;  // simulated wall-clock horizon
  double failure_rate_per_gpu_hour = 460.0 / (16384.0 * 54 * 24);
  double sdc_rate_per_gpu_hour = 6.0 / (16384.0 * 54 * 24);
  double sdc_detection_delay_s = 1800;
  double checkpoint_cost_s = 20;     // stall to snapshot and start an asynchronous write
  double checkpoint_interval_s = 0;  // 0: Daly's optimum
  double restart_base_s = 120;
  double restart_per_1k_gpus_s = 7.5;  // 243 s at 16k GPUs
  double replica_cost_s = 2;
  double replica_interval_s = 0;  // 0: Daly's optimum for replica_cost_s
  double replica_restart_base_s = 30;
  double persistent_interval_s = 3600;        // replica mode: persistent checkpoints for SDC
  Recovery recovery = Recovery::kCheckpoint;  // the headline mode
  int trials = 16;
  uint64_t seed = 1;
};

Status ValidateGoodputSettings(const GoodputSettings& s);

struct GoodputStats {
  double interval_s = 0;
  double goodput = 0;  // mean over trials
  double goodput_sd = 0;
  double interruptions = 0;        // mean count (failures + detected SDC)
  double lost_fraction = 0;        // progress thrown away, over wall time
  double checkpoint_fraction = 0;  // time writing checkpoints / replicas
  double restart_fraction = 0;     // time restarting
};

// System mean time between interruptions, seconds.
double SystemMtbfSeconds(const GoodputSettings& s);
double RestartSeconds(const GoodputSettings& s, Recovery r);
double YoungInterval(double cost_s, double mtbf_s);
double DalyInterval(double cost_s, double mtbf_s);

GoodputStats SimulateGoodput(const GoodputSettings& s, Recovery recovery, double interval_s);

struct GoodputResult {
  double mtbf_s = 0;
  double young_s = 0, daly_s = 0;
  std::vector<GoodputStats> checkpoint_sweep;  // over intervals around Daly's
  std::vector<GoodputStats> replica_sweep;
  GoodputStats checkpoint_at_daly, best_checkpoint, best_replica, chosen;
};

StatusOr<GoodputResult> RunGoodput(const GoodputSettings& s);

// Start-up and restart constants atoll measured on its own worlds (bench/startup.sh's JSON):
// launch to first step = fixed + per_rank x (ranks per site) + per_site x sites; a lost site back
// from a live site's memory (death to its first step); a whole world started again from a disk
// checkpoint (launch to its first step).
struct MeasuredStartup {
  double fixed_s = 0, per_rank_s = 0, per_site_s = 0;
  double restart_from_memory_s = 0, restart_from_disk_s = 0;
  int restart_sites = 3;  // of the world restarted from disk (one rank each)
};
// kInvalidArgument naming a missing or negative key.
StatusOr<MeasuredStartup> ParseMeasuredStartup(const nlohmann::json& j);
// The goodput model's restart constants from them, for sites of gpus_per_site GPUs (one rank a
// GPU): a checkpoint restart is the whole world's (restart_from_disk_s less its restart_sites'
// share, its sites grown from 1 rank to gpus_per_site), growing with the sites (per_site_s x
// 1000 / gpus_per_site per 1000 GPUs); a replica restart is a lost site's from memory (likewise
// grown).
void ApplyMeasuredStartup(const MeasuredStartup& m, int gpus_per_site, GoodputSettings* s);
std::string GoodputReport(const GoodputResult& r, const GoodputSettings& s);
nlohmann::json GoodputJson(const GoodputResult& r, const GoodputSettings& s);

}  // namespace atl::plan
