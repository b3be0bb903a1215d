// A whole world in one process, for campaigns and tests: every site of cfg.world trains on its
// own thread, its ranks as threads (comm/inprocess.h) when it has more than one, and the sites'
// leaders are joined by the real WAN transport (world/wan.h) on loopback, without TLS or token
// (a trusted process) and without link emulation, so WAN faults (train/sdc/faults.h kind wan)
// strike where they would in `atoll launch`. sync only (the strategies that need a parameter
// server or rejoins, diloco, streaming and async, are refused). Without a coordinator every site
// stays to the end; with one (LocalWorldOptions::coordinator, in this process, its state in
// DIR/coordinator) the sites agree on every step's sums there and a lost site is absorbed: a
// site named in LocalWorldOptions::lose stops after its step and drops its links (no goodbye),
// as a crashed site would, and the others go on without it.
//
// Output: DIR/site-N/ (each site's metrics.jsonl, events.jsonl, faults logs) and DIR/checkpoint
// (written by the lowest live site; none with train.checkpoint_every = -1). One site: DIR is the run's directory, as `atoll train --out
// DIR`.
//
// Thread-safety: uses the process (threads, loopback ports, the directory tree).
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "train/config.h"

namespace atl {

struct LocalWorldOptions {
  bool coordinator = false;
  // Sites lost on purpose: (site, the step after which it stops). Needs the coordinator.
  std::vector<std::pair<int, int64_t>> lose;
};

// Trains cfg's world into dir (removed first); the first failing site's (or rank's) status (a
// site lost on purpose, or one that left the world, sdc.on_faulty = exclude, does not count).
Status TrainLocalWorld(const RunConfig& cfg, const std::string& dir,
                       const LocalWorldOptions& options = {});

// Where site s of a world trained by TrainLocalWorld writes (dir itself for one site).
std::string LocalSiteDir(const RunConfig& cfg, const std::string& dir, int site);

}  // namespace atl
