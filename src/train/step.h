// One step of the training loop (train/trainer.cc) on one rank: its computation (passes, the
// reductions in the site and by the world strategy, the optimizer update), the corruption
// detectors' check after it, and the audit replay that re-executes it from the state it started
// from (train/sdc/audit.h) and says whether a rank computes wrong results (FaultyRank), which the
// loop then leaves out (sdc.on_faulty = exclude: its site leaves the world) or stops for.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/metrics.h"
#include "train/run.h"
#include "train/sdc/audit.h"
#include "train/strategies/world_strategy.h"

namespace atl {

// Step s's computation: the forward and backward passes, the losses and the gradient reduction
// (in the site, then by the strategy), the gradient norm and the optimizer update. Fills m's
// loss, grad_norm and lr. A non-finite loss or norm is left for the caller to judge.
Status ComputeStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                   std::vector<double>& local_losses, StepMetrics* m);

// The corruption detectors after step s's update (train/sdc/monitor.h): every rank logs what it
// found; the site's ranks share their findings, which go into the step's metrics; with
// sdc.on_alarm = "stop" any finding ends the run on every rank of the site alike.
Status CheckStep(Run& run, int64_t s, StepMetrics* m);

// The loss and the gradient norm are finite; the error for when they are not.
bool Finite(const StepMetrics& m);
Status Diverged(const StepMetrics& m);

// A rank that computes wrong results, as the replays of a step found it: three runs of the step
// that all differ on it, or other ranks' executions that name it (CheckOnPeers). The same on
// every rank of every site that replays together, except `here`, the same on the site's ranks.
struct FaultyRank {
  bool named = false;   // some rank of some site: the step is not trusted
  bool here = false;    // ... of this site, for certain (a majority, or its own three runs)
  bool unsure = false;  // ... one named without a majority (two executions disagree)
  std::string why;      // what names it, for the error
};

// The audit replay of step s (train/sdc/audit.h), on every rank of the site alike (with sync
// across sites: of every site, which decide together through the strategy): rolls back to
// the pre-step snapshot and computes the step again; when some rank's two runs differ, a third
// run decides which one was corrupted. Keeps the result two runs agree on. m: the first run's
// metrics (its sdc events), replaced by the kept run's, with the first run's events and the
// verdict in front. agreed: whether the kept run's replicas agree (no fingerprint mismatch).
// When every replay matched and the site's replicas (or, sync with one rank a site, the sites)
// each hold the whole model, other ranks' executions decide between the data and a rank that
// repeats its fault (CheckOnPeers). faulty: a rank found faulty, by them or by three runs.
Status ReplayStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                  std::vector<double>& local_losses, const StepSnapshot& snapshot, StepMetrics* m,
                  bool* agreed, FaultyRank* faulty);

}  // namespace atl
