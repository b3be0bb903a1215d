#include "train/sdc/fingerprint.h"

#include <map>

#include "core/hash.h"

namespace atl {

std::string ShortTensorName(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

std::vector<uint64_t> TensorFingerprints(const std::vector<ParamTensor>& layout,
                                         const float* data) {
  std::vector<uint64_t> out(layout.size());
  for (size_t t = 0; t < layout.size(); ++t)
    out[t] = Hash64(data + layout[t].offset, layout[t].numel * sizeof(float));
  return out;
}

std::vector<FingerprintMismatch> FindMismatches(const std::vector<std::vector<uint64_t>>& all) {
  std::vector<FingerprintMismatch> out;
  if (all.size() < 2) return out;
  const size_t replicas = all.size(), tensors = all[0].size();
  for (size_t t = 0; t < tensors; ++t) {
    std::map<uint64_t, int> votes;
    for (size_t r = 0; r < replicas; ++r) ++votes[all[r][t]];
    if (votes.size() == 1) continue;
    uint64_t winner = 0;
    int most = 0;
    for (const auto& [h, n] : votes)
      if (n > most) {
        most = n;
        winner = h;
      }
    const bool majority = 2 * size_t(most) > replicas;
    for (size_t r = 0; r < replicas; ++r)
      if (!majority || all[r][t] != winner) out.push_back({int(r), t, majority});
  }
  return out;
}

StatusOr<std::vector<FingerprintMismatch>> CompareFingerprints(Communicator& group,
                                                               const std::vector<uint64_t>& mine) {
  const size_t n = mine.size(), replicas = size_t(group.size());
  std::vector<int64_t> gathered(n * replicas);
  ATOLL_RETURN_IF_ERROR(group.AllGather(mine.data(), gathered.data(), n, DType::kInt64));
  std::vector<std::vector<uint64_t>> all(replicas, std::vector<uint64_t>(n));
  for (size_t r = 0; r < replicas; ++r)
    for (size_t t = 0; t < n; ++t) all[r][t] = uint64_t(gathered[r * n + t]);
  return FindMismatches(all);
}

}  // namespace atl
