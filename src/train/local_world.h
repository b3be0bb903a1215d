// A whole world in one process, for campaigns and tests: every site of cfg.world trains on its
// own thread, its ranks as threads (comm/inprocess.h) when it has more than one, and the sites'
// leaders are joined by the real WAN transport (world/wan.h) on loopback, without TLS or token
// (a trusted process) and without link emulation, so WAN faults (train/sdc/faults.h kind wan)
// strike where they would in `atoll launch`. sync only: no coordinator (the strategies that need
// one, diloco, streaming and async, are refused).
//
// Output: DIR/site-N/ (each site's metrics.jsonl, events.jsonl, faults logs) and DIR/checkpoint
// (written by site 0). One site: DIR is the run's directory, as `atoll train --out DIR`.
//
// Thread-safety: uses the process (threads, loopback ports, the directory tree).
#pragma once

#include <string>

#include "core/status.h"
#include "train/config.h"

namespace atl {

// Trains cfg's world into dir (removed first); the first failing site's (or rank's) status.
Status TrainLocalWorld(const RunConfig& cfg, const std::string& dir);

// Where site s of a world trained by TrainLocalWorld writes (dir itself for one site).
std::string LocalSiteDir(const RunConfig& cfg, const std::string& dir, int site);

}  // namespace atl
