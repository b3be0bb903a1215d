// The bytes of an AsyncSiteState (train/strategies/async_client.h): what a resumed async site
// reads back from its checkpoint.
#include <fmt/format.h>

#include <cstring>

#include "core/hash.h"
#include "train/strategies/async_client.h"
#include "train/strategies/state_bytes.h"

namespace atl {

namespace {
constexpr char kAsyncStateMagic[4] = {'A', 'T', 'L', 'A'};
constexpr uint32_t kAsyncStateVersion = 1;
constexpr size_t kAsyncStateHeader = 4 + 4 + 8 + 4 * 8;
}  // namespace

using state_bytes::Get;
using state_bytes::GetFloats;
using state_bytes::Put;

std::string EncodeAsyncSiteState(const AsyncSiteState& st) {
  const size_t n = st.residual.size();
  std::string out;
  out.reserve(kAsyncStateHeader + 3 * n * sizeof(float) + 8);
  out.append(kAsyncStateMagic, 4);
  Put<uint32_t>(&out, kAsyncStateVersion);
  Put<uint64_t>(&out, n);
  for (int64_t v : {st.completed, st.pushes, st.refused, st.adam_steps}) Put<int64_t>(&out, v);
  for (const auto* v : {&st.residual, &st.adam_m, &st.adam_v})
    out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  Put<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

StatusOr<AsyncSiteState> DecodeAsyncSiteState(std::string_view b, size_t n) {
  if (b.size() < kAsyncStateHeader + 8 || std::memcmp(b.data(), kAsyncStateMagic, 4) != 0)
    return Status::Corruption(
        fmt::format("async site state: {} bytes without the ATLA header", b.size()));
  if (const uint32_t version = Get<uint32_t>(b, 4); version != kAsyncStateVersion)
    return Status::Corruption(fmt::format("async site state: version {} (this build reads {})",
                                          version, kAsyncStateVersion));
  const uint64_t count = Get<uint64_t>(b, 8);
  if (count != n)
    return Status::InvalidArgument(fmt::format(
        "async site state: {} parameters, this model has {} (another model config?)", count, n));
  const size_t want = kAsyncStateHeader + 3 * n * sizeof(float) + 8;
  if (b.size() != want)
    return Status::Corruption(
        fmt::format("async site state: {} bytes, {} expected (cut short?)", b.size(), want));
  if (Hash64(b.data(), want - 8) != Get<uint64_t>(b, want - 8))
    return Status::Corruption("async site state: its checksum does not match (damaged)");
  AsyncSiteState st;
  st.completed = Get<int64_t>(b, 16);
  st.pushes = Get<int64_t>(b, 24);
  st.refused = Get<int64_t>(b, 32);
  st.adam_steps = Get<int64_t>(b, 40);
  size_t at = kAsyncStateHeader;
  for (auto* v : {&st.residual, &st.adam_m, &st.adam_v}) at = GetFloats(b, at, n, v);
  return st;
}

}  // namespace atl
