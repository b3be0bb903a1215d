// Replica fingerprints: data-parallel replicas hold the same parameters bit for bit after every
// optimizer step (they apply the same update to the same values), so a replica whose parameters
// differ from the others' was corrupted. Each replica hashes its buffer tensor by tensor (XXH3 of
// the float bits; 8 bytes a tensor), the replicas all-gather the hashes, and per tensor the
// replicas outside the majority are named. With two replicas there is no majority: both are
// named, and a replay (train/sdc/audit.h) decides which one is wrong.
//
// Thread-safety: pure functions, and one collective (Compare) per call on its communicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/config.h"

namespace atl {

// "transformer.h.1.attn.c_attn.weight" -> "h.1.attn.c_attn.weight": how events name tensors.
std::string ShortTensorName(const std::string& name);
// The tensor of `layout` that holds element `offset` of the flat buffer; null: none.
const ParamTensor* TensorAt(const std::vector<ParamTensor>& layout, size_t offset);

// One hash per tensor of `layout` over data (the flat buffer the layout describes).
std::vector<uint64_t> TensorFingerprints(const std::vector<ParamTensor>& layout, const float* data);

struct FingerprintMismatch {
  int replica;        // a replica outside the majority (or one of two that disagree)
  size_t tensor;      // index into the layout
  bool has_majority;  // false: no hash held by more than half the replicas
};

// Which (replica, tensor) pairs disagree, given every replica's fingerprints (all[r][t]). Empty:
// all agree.
std::vector<FingerprintMismatch> FindMismatches(const std::vector<std::vector<uint64_t>>& all);

// All-gathers this replica's fingerprints over `group` (its rank is the replica index) and
// returns the mismatches; every replica gets the same answer. Collective over group.
StatusOr<std::vector<FingerprintMismatch>> CompareFingerprints(Communicator& group,
                                                               const std::vector<uint64_t>& mine);

}  // namespace atl
