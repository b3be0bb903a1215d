// Memory checks (sdc.memory): corruption of state at rest, found by the rank that holds it and
// repaired from a data-parallel replica.
//
// Between two steps a rank's parameters and AdamW moments only sit in memory; nothing should
// change them. After each update the rank seals them (an XXH3-64 per tensor: a few bytes); before
// the next step it hashes them again. Any difference is corruption of that tensor in that rank's
// memory: found with certainty (every flipped bit changes the hash), in the step it would first
// be used, with no replica and no majority vote. A replay cannot undo it (the step would start
// from the corrupt state), but a data-parallel replica holds the same bits: the replicas agree on
// which of them are corrupt, and one whose check passed broadcasts its parameters (and moments,
// when they are replicated) to the group. The run then goes on bitwise as if nothing had happened.
// With ZeRO a replica's moments are its own shard, with no copy elsewhere: a corrupt shard is
// found and named, not repaired; so is anything on a single replica (dp 1).
//
// On the GPU the state is hashed where it lives (kernels/cuda's RangeHashes: 8 bytes a tensor
// come back); only a repair downloads it (HostState).
//
// Thread-safety: belongs to its rank's training thread; Repair is collective over the dp group.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/backend.h"
#include "model/config.h"

namespace atl {

class RestSeal {
 public:
  // layout: the rank's parameter tensors; moments_size: the AdamW moments' length (the layout's
  // total, or with ZeRO the rank's shard, sealed as one piece named "shard"); params_on,
  // moments_on: where the buffers Seal and Verify get live (device memory on the GPU).
  RestSeal(std::vector<ParamTensor> layout, size_t moments_size, bool moments_sharded,
           Device params_on = Device::kCpu, Device moments_on = Device::kCpu);

  bool sealed() const { return !params_.empty(); }
  // After an update. m, v may be null (not sealed).
  void Seal(const float* params, const float* m, const float* v);
  // Before the next step: what changed since Seal, as "params:h.0.attn.c_attn.weight",
  // "moment_m:wte.weight" or "moment_v:shard". Empty when nothing did (or nothing was sealed).
  std::vector<std::string> Verify(const float* params, const float* m, const float* v) const;

 private:
  std::vector<uint64_t> Hashes(const float* data, bool moments) const;
  std::vector<ParamTensor> layout_;
  size_t moments_size_;
  bool sharded_;
  Device params_on_, moments_on_;
  std::vector<uint64_t> params_, m_, v_;
};

// The rank's state as a repair writes it: host buffers of n parameters and of k moments each.
// On the GPU getting them downloads the state and marks the host's copies newer (the next step
// uploads them): a repair asks for them only when it copies.
struct HostState {
  float* params;
  size_t n;
  float* m;
  float* v;
  size_t k;
};
using HostStateFn = std::function<HostState()>;

// The dp group's replicas repair corrupt state from one whose check passed (`corrupt`: this
// replica's verdict): returns the replica the state came from, or -1 when no replica was corrupt
// or none was clean (nothing to copy from). Moments are copied only when `moments` (not ZeRO).
// Collective over dp.
StatusOr<int> RepairFromReplica(Communicator& dp, bool corrupt, const HostStateFn& state,
                                bool moments);

}  // namespace atl
