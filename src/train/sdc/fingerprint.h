// Replica fingerprints: data-parallel replicas hold the same parameters bit for bit after every
// optimizer step (they apply the same update to the same values), so a replica whose parameters
// differ from the others' was corrupted. Each replica hashes its buffer tensor by tensor (XXH3 of
// the float bits, or on the GPU a hash computed there; 8 bytes a tensor), the replicas all-gather
// the hashes, and per tensor the replicas outside the majority are named. With two replicas there
// is no majority: both are named, and a replay (train/sdc/audit.h) decides which one is wrong.
//
// Thread-safety: pure functions, and one collective (Compare) per call on its communicator.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/backend.h"
#include "model/config.h"

namespace atl {

// "transformer.h.1.attn.c_attn.weight" -> "h.1.attn.c_attn.weight": how events name tensors.
std::string ShortTensorName(const std::string& name);
// The tensor of `layout` that holds element `offset` of the flat buffer; null: none.
const ParamTensor* TensorAt(const std::vector<ParamTensor>& layout, size_t offset);

// One hash per tensor of `layout` over data (the flat buffer the layout describes), a buffer of
// `device`: on the GPU (device memory) kernels/cuda's RangeHashes, read there (8 bytes a tensor
// come back), which is another function than the CPU's XXH3. A run's ranks share train.device,
// so hashes of one function only are ever compared.
std::vector<uint64_t> TensorFingerprints(const std::vector<ParamTensor>& layout, const float* data,
                                         Device device = Device::kCpu);
// One hash of a whole buffer of n floats on `device` (ZeRO's moment shard), as above.
uint64_t BufferFingerprint(const float* data, size_t n, Device device = Device::kCpu);

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
