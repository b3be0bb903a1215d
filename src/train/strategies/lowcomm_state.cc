// The bytes of a LowCommState (train/strategies/lowcomm.h): what a live site serves a process
// that takes a lost site over.
#include <fmt/format.h>

#include <cstring>

#include "train/strategies/lowcomm.h"
#include "train/strategies/state_bytes.h"

namespace atl {

namespace {
constexpr char kStateMagic[4] = {'A', 'T', 'L', 'R'};
constexpr uint32_t kStateVersion = 2;  // reads 1 too
constexpr size_t kStateHeader = 4 + 4 + 8 + 3 * 8;
}  // namespace

using state_bytes::Get;
using state_bytes::GetFloats;
using state_bytes::Put;

std::string EncodeLowCommState(const LowCommState& st) {
  const size_t n = st.global.size();
  // A resume's state (version 2) has the error feedback, or at n = 0 (no parameters: only the
  // fuzzer's) its update count alone; without it a decoded one would encode as a rejoin's (version
  // 1) and lose adam_steps.
  const bool resume = !st.residual.empty() || st.adam_steps != 0;
  std::string out;
  out.reserve(kStateHeader + (resume ? 6 : 3) * n * sizeof(float) + 8);
  out.append(kStateMagic, 4);
  Put<uint32_t>(&out, resume ? kStateVersion : 1);
  Put<uint64_t>(&out, n);
  Put<int64_t>(&out, st.completed);
  Put<int64_t>(&out, st.rounds);
  Put<int64_t>(&out, st.exchanges);
  for (const auto* v : {&st.global, &st.momentum, &st.params})
    out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  if (resume) {
    Put<int64_t>(&out, st.adam_steps);
    for (const auto* v : {&st.residual, &st.adam_m, &st.adam_v})
      out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  }
  return out;
}

StatusOr<LowCommState> DecodeLowCommState(std::string_view b, size_t n) {
  if (b.size() < kStateHeader || std::memcmp(b.data(), kStateMagic, 4) != 0)
    return Status::Corruption(
        fmt::format("rejoin state: {} bytes without the ATLR header", b.size()));
  const uint32_t version = Get<uint32_t>(b, 4);
  if (version != 1 && version != kStateVersion)
    return Status::Corruption(fmt::format("rejoin state: version {} (this build reads 1 and {})",
                                          version, kStateVersion));
  const uint64_t count = Get<uint64_t>(b, 8);
  if (count != n)
    return Status::InvalidArgument(fmt::format(
        "rejoin state: {} parameters, this model has {} (another model config?)", count, n));
  const size_t want =
      kStateHeader + (version == 1 ? 3 * n * sizeof(float) : 6 * n * sizeof(float) + 8);
  if (b.size() != want)
    return Status::Corruption(fmt::format("rejoin state: {} bytes, expected {}", b.size(), want));
  LowCommState st;
  st.completed = Get<int64_t>(b, 16);
  st.rounds = Get<int64_t>(b, 24);
  st.exchanges = Get<int64_t>(b, 32);
  if (st.completed < 0 || st.rounds < 0 || st.exchanges < 0 || st.exchanges > st.rounds)
    return Status::Corruption(
        fmt::format("rejoin state: bad counters (step {}, round {}, {} "
                    "exchanges)",
                    st.completed, st.rounds, st.exchanges));
  size_t at = kStateHeader;
  for (auto* v : {&st.global, &st.momentum, &st.params}) at = GetFloats(b, at, n, v);
  if (version == kStateVersion) {
    st.adam_steps = Get<int64_t>(b, at);
    at += sizeof st.adam_steps;
    for (auto* v : {&st.residual, &st.adam_m, &st.adam_v}) at = GetFloats(b, at, n, v);
  }
  return st;
}

}  // namespace atl
