// What a lost site's new process takes over in a sync run (train/strategies/sync_strategy.cc):
// the live sites' state at the start of a step, which every live site's leader serves while some
// site is out (WorldHooks::publish, under the step's index) and the newcomer fetches from one of
// them (WorldHooks::fetch; the transfer is checksummed end to end, world/wan.h FetchSnapshot).
// The state is the parameters, the AdamW moments and update count, the step (every sample is a
// pure function of the seed and the step: that is the data cursor), and the live sites with
// their generation, so the newcomer builds the same LiveSites as they do.
//
// Format (host byte order, the world's machines alike): "ATLSYNC1", then int64 step, optimizer
// steps, generation, the number of live sites and each of them, the number of parameters n and
// of moments k, then n + 2k float32 (parameters, first moments, second moments).
//
// Thread-safety: functions.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/strategies/world_strategy.h"

namespace atl {

struct SyncState {
  int64_t step = 0;             // the step it leads into (0-based: steps completed)
  int64_t optimizer_steps = 0;  // AdamW's update count
  int64_t generation = 0;       // of the live sites (WorldStrategy::generation)
  std::vector<int> live;        // the live sites, sorted
  std::vector<float> params, m, v;
};

std::string EncodeSyncState(int64_t step, int64_t optimizer_steps, int64_t generation,
                            const std::vector<int>& live, std::span<const float> params,
                            std::span<const float> m, std::span<const float> v);
// kCorruption when the bytes are not a state of n parameters and k moments in a world of `sites`
// sites (the live sites: 1 to `sites` of them, each in [0, sites), sorted, none twice).
StatusOr<SyncState> DecodeSyncState(const std::string& bytes, size_t n, size_t k, int sites);

// A rejoining site's leader: registers for step J = (the latest step a live site has begun) + 2
// (coordinator round kSyncRoundsPerStep * J), before any live site began step J - 1 (so they all
// see it in their rounds and publish J's state when they finish step J - 1), then waits for that
// state (RegisterAndFetch: polling, up to w.rejoin_timeout_s in all; a later J after a race).
// kUnavailable when J would be past the run's `steps`.
StatusOr<SyncState> FetchSyncState(const WorldHooks& w, int64_t steps, size_t n, size_t k,
                                   int sites);

}  // namespace atl
