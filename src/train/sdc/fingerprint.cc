#include "train/sdc/fingerprint.h"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <utility>

#include "core/hash.h"

namespace atl {

std::string ShortTensorName(const std::string& name) {
  const std::string prefix = "transformer.";
  return name.rfind(prefix, 0) == 0 ? name.substr(prefix.size()) : name;
}

const ParamTensor* TensorAt(const std::vector<ParamTensor>& layout, size_t offset) {
  for (const ParamTensor& t : layout)
    if (offset >= t.offset && offset < t.offset + t.numel) return &t;
  return nullptr;
}

namespace {

std::vector<uint64_t> DeviceHashes(const float* data,
                                   const std::vector<std::pair<size_t, size_t>>& ranges) {
#if ATOLL_HAVE_CUDA
  std::vector<kernels::cuda::HashRange> r;
  for (const auto& [offset, numel] : ranges) r.push_back({offset, offset + numel});
  std::vector<uint64_t> out(r.size());
  kernels::cuda::RangeHashes(out.data(), data, r.data(), int(r.size()));
  return out;
#else
  (void)data, (void)ranges;
  throw std::logic_error("GPU fingerprints in an atoll built without CUDA");
#endif
}

}  // namespace

uint64_t BufferFingerprint(const float* data, size_t n, Device device) {
  if (device == Device::kCuda) return DeviceHashes(data, {{0, n}})[0];
  return Hash64(data, n * sizeof(float));
}

std::vector<uint64_t> TensorFingerprints(const std::vector<ParamTensor>& layout, const float* data,
                                         Device device) {
  if (device == Device::kCuda) {
    std::vector<std::pair<size_t, size_t>> ranges;
    for (const ParamTensor& t : layout) ranges.emplace_back(t.offset, t.numel);
    return DeviceHashes(data, ranges);
  }
  // Pieces of at most kChunk floats, hashed by the threads; a tensor of several pieces gets the
  // hash of its pieces' hashes (the same value for any thread count).
  constexpr size_t kChunk = size_t(1) << 20;
  struct Piece {
    size_t tensor, offset, numel;
  };
  std::vector<Piece> pieces;
  std::vector<size_t> first(layout.size() + 1, 0);
  for (size_t t = 0; t < layout.size(); ++t) {
    first[t] = pieces.size();
    for (size_t o = 0; o < layout[t].numel || o == 0; o += kChunk)
      pieces.push_back({t, layout[t].offset + o, std::min(kChunk, layout[t].numel - o)});
  }
  first[layout.size()] = pieces.size();
  std::vector<uint64_t> hashes(pieces.size());
#pragma omp parallel for schedule(dynamic)
  for (size_t p = 0; p < pieces.size(); ++p)
    hashes[p] = Hash64(data + pieces[p].offset, pieces[p].numel * sizeof(float));
  std::vector<uint64_t> out(layout.size());
  for (size_t t = 0; t < layout.size(); ++t) {
    const size_t n = first[t + 1] - first[t];
    out[t] = n == 1 ? hashes[first[t]] : Hash64(hashes.data() + first[t], n * sizeof(uint64_t));
  }
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
