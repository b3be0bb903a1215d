// The bytes of a LowCommState (train/strategies/lowcomm.h): what a live site serves a process
// that takes a lost site over.
#include <fmt/format.h>

#include <cstring>

#include "train/strategies/lowcomm.h"

namespace atl {

namespace {
constexpr char kStateMagic[4] = {'A', 'T', 'L', 'R'};
constexpr uint32_t kStateVersion = 1;
constexpr size_t kStateHeader = 4 + 4 + 8 + 3 * 8;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));  // little-endian hosts only
}
template <typename T>
T Get(std::string_view b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(v));
  return v;
}
}  // namespace

std::string EncodeLowCommState(const LowCommState& st) {
  const size_t n = st.global.size();
  std::string out;
  out.reserve(kStateHeader + 3 * n * sizeof(float));
  out.append(kStateMagic, 4);
  Put<uint32_t>(&out, kStateVersion);
  Put<uint64_t>(&out, n);
  Put<int64_t>(&out, st.completed);
  Put<int64_t>(&out, st.rounds);
  Put<int64_t>(&out, st.exchanges);
  for (const auto* v : {&st.global, &st.momentum, &st.params})
    out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  return out;
}

StatusOr<LowCommState> DecodeLowCommState(std::string_view b, size_t n) {
  if (b.size() < kStateHeader || std::memcmp(b.data(), kStateMagic, 4) != 0)
    return Status::Corruption(
        fmt::format("rejoin state: {} bytes without the ATLR header", b.size()));
  if (const uint32_t v = Get<uint32_t>(b, 4); v != kStateVersion)
    return Status::Corruption(
        fmt::format("rejoin state: version {} (this build reads {})", v, kStateVersion));
  const uint64_t count = Get<uint64_t>(b, 8);
  if (count != n)
    return Status::InvalidArgument(fmt::format(
        "rejoin state: {} parameters, this model has {} (another model config?)", count, n));
  if (b.size() != kStateHeader + 3 * n * sizeof(float))
    return Status::Corruption(fmt::format("rejoin state: {} bytes, expected {}", b.size(),
                                          kStateHeader + 3 * n * sizeof(float)));
  LowCommState st;
  st.completed = Get<int64_t>(b, 16);
  st.rounds = Get<int64_t>(b, 24);
  st.exchanges = Get<int64_t>(b, 32);
  if (st.completed < 0 || st.rounds < 0 || st.exchanges < 0 || st.exchanges > st.rounds)
    return Status::Corruption(
        fmt::format("rejoin state: bad counters (step {}, round {}, {} "
                    "exchanges)",
                    st.completed, st.rounds, st.exchanges));
  const char* at = b.data() + kStateHeader;
  for (auto* v : {&st.global, &st.momentum, &st.params}) {
    v->resize(n);
    std::memcpy(v->data(), at, n * sizeof(float));
    at += n * sizeof(float);
  }
  return st;
}

}  // namespace atl
