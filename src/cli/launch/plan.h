// What `atoll launch` will start, worked out and checked before anything runs: the world's
// config, the run directory (the effective config, certificates, one folder per site, stale
// logs and metrics removed), the mpirun and atoll binaries, the children's environment and the
// injected faults, and the command line of the coordinator and of each site.
//
// Processes:
//   <self> coordinator --listen 127.0.0.1:0 --sites S --state DIR --heartbeat-s H
//   --dead-after-beats B (--certs|--insecure)
//     prints its bound host:port as its first stdout line; its stderr goes to
//     DIR/coordinator.stderr.
//   mpirun -n K <self> train --config DIR/config.toml --site s --coordinator ADDR ... --out
//   DIR/site-s
//     one per site, stdout and stderr to DIR/site-s/train.log (rejoin.log for a process that
//     takes a lost site over).
//
// Thread-safety: values.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cli/launch/chaos.h"
#include "core/status.h"
#include "train/config.h"

namespace atl::cli {

struct LaunchArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  std::string certs;
  bool insecure = false;
  bool quiet = false;
  std::vector<std::string> fail_sites;  // "SITE@STEP" or "SITE.RANK@STEP": fault injection
  bool rejoin = false;                  // a lost site's process is started again (--rejoin)
  int64_t chaos = -1;                   // --chaos SEED (-1: none); implies rejoin
  int chaos_kills = 3;                  // --chaos-kills
  std::string resume;                   // --resume CHECKPOINT: every site's first process
  std::vector<std::string> slow_sites;  // "SITE:FACTOR": emulate a slower site (benchmarks)
  std::string emit;                     // "slurm": write batch scripts (cli/launch/slurm.h)
};

struct LaunchPlan {
  RunConfig cfg;
  int sites = 0, ranks = 0;
  std::string dir;          // the run directory, without a trailing slash
  std::string config_path;  // DIR/config.toml
  std::string certs;        // "" with --insecure
  std::string mpirun, self;
  std::string resume;  // a checkpoint every site's first process resumes from ("": none)
  struct SiteFault {
    int site = 0, rank = 0;  // the rank of the site that dies
    int64_t step = 0;        // after this step
  };
  std::vector<SiteFault> faults;   // from --fail-site
  std::vector<ChaosKill> chaos;    // from --chaos
  std::map<int, double> slowdown;  // by site, from --slow-site
  std::vector<std::string> env;    // the children's environment

  // listen: host:port ("127.0.0.1:0" at first; a restarted one takes the first one's again).
  std::vector<std::string> CoordinatorArgv(const std::string& listen) const;
  // Site s's mpirun; with rejoin, a new process that takes over the lost site (no faults).
  std::vector<std::string> SiteArgv(int site, const std::string& coordinator, bool rejoin) const;
};

// Checks the arguments and the config (kInvalidArgument: a bad config, --fail-site, a world of
// one site; kUnavailable: no mpirun) and prepares the run directory.
StatusOr<LaunchPlan> PlanLaunch(const LaunchArgs& a);

}  // namespace atl::cli
