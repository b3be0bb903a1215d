// Memory checks of state at rest (train/sdc/memory.h).
#include "train/sdc/memory.h"

#include <fmt/format.h>

#include <span>

#include "train/sdc/fingerprint.h"

namespace atl {

RestSeal::RestSeal(std::vector<ParamTensor> layout, size_t moments_size, bool moments_sharded,
                   Device params_on, Device moments_on)
    : layout_(std::move(layout)),
      moments_size_(moments_size),
      sharded_(moments_sharded),
      params_on_(params_on),
      moments_on_(moments_on) {}

std::vector<uint64_t> RestSeal::Hashes(const float* data, bool moments) const {
  if (moments && sharded_) return {BufferFingerprint(data, moments_size_, moments_on_)};
  return TensorFingerprints(layout_, data, moments ? moments_on_ : params_on_);
}

void RestSeal::Seal(const float* params, const float* m, const float* v) {
  params_ = Hashes(params, false);
  m_ = m != nullptr ? Hashes(m, true) : std::vector<uint64_t>();
  v_ = v != nullptr ? Hashes(v, true) : std::vector<uint64_t>();
}

std::vector<std::string> RestSeal::Verify(const float* params, const float* m,
                                          const float* v) const {
  std::vector<std::string> out;
  if (!sealed()) return out;
  auto check = [&](const char* what, const std::vector<uint64_t>& sealed, const float* data,
                   bool moments) {
    if (sealed.empty() || data == nullptr) return;
    const std::vector<uint64_t> now = Hashes(data, moments);
    for (size_t t = 0; t < now.size(); ++t)
      if (now[t] != sealed[t])
        out.push_back(fmt::format(
            "{}:{}", what,
            moments && sharded_ ? std::string("shard") : ShortTensorName(layout_[t].name)));
  };
  check("params", params_, params, false);
  check("moment_m", m_, m, true);
  check("moment_v", v_, v, true);
  return out;
}

StatusOr<int> RepairFromReplica(Communicator& dp, bool corrupt, const HostStateFn& state,
                                bool moments) {
  std::vector<int64_t> flags(size_t(dp.size()), 0);
  flags[size_t(dp.rank())] = corrupt ? 1 : 0;
  ATOLL_RETURN_IF_ERROR(dp.AllReduce(std::span<int64_t>(flags)));
  int root = -1;
  bool any = false;
  for (size_t r = 0; r < flags.size(); ++r) {
    any |= flags[r] != 0;
    if (flags[r] == 0 && root < 0) root = int(r);
  }
  if (!any || root < 0) return -1;
  const HostState h = state();
  ATOLL_RETURN_IF_ERROR(dp.Broadcast(std::span<float>(h.params, h.n), root));
  if (moments) {
    ATOLL_RETURN_IF_ERROR(dp.Broadcast(std::span<float>(h.m, h.k), root));
    ATOLL_RETURN_IF_ERROR(dp.Broadcast(std::span<float>(h.v, h.k), root));
  }
  return root;
}

}  // namespace atl
