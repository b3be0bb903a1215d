// `atoll launch --emit slurm`: the world of a launch plan as Slurm batch scripts instead of local
// processes, for clusters where each site is an allocation of its own (another partition, another
// cluster with a shared filesystem, or the same one).
//
//   DIR/slurm/coordinator.sbatch   the coordinator on one node: listens on its name:PORT,
//                                  writes that address to DIR/coordinator.address, and stops when
//                                  every site has written DIR/site-N/exit_status
//   DIR/slurm/site-N.sbatch        site N: world.ranks_per_site tasks under mpirun; waits for
//                                  DIR/coordinator.address, listens for WAN peers on 0.0.0.0:PORT
//                                  and advertises $(hostname -f):PORT; writes its exit status
//   DIR/slurm/submit.sh            clears an earlier run's files, then sbatch of all of them
//
// The scripts are plain bash (the #SBATCH lines are comments to bash), so they also run outside
// Slurm: tests/world/slurm_emit.sh runs them on this machine. Environment they read, all optional:
// ATOLL (the binary), ATOLL_MPIRUN (mpirun), ATOLL_COORDINATOR_HOST / ATOLL_COORDINATOR_PORT,
// ATOLL_WAN_HOST / ATOLL_WAN_PORT (ports: any free one unless set), ATOLL_WAIT_S (for the
// address). Paths with a newline or a '%' are refused (kInvalidArgument).
//
// Thread-safety: functions.
#pragma once

#include <string>

#include "cli/launch/plan.h"
#include "core/status.h"

namespace atl::cli {

// Writes the scripts of `plan` into DIR/slurm; returns the path of submit.sh.
StatusOr<std::string> EmitSlurm(const LaunchPlan& plan);

}  // namespace atl::cli
