// The fixed-width fields of the per-site state files (LowCommState in lowcomm_state.cc,
// AsyncSiteState in async_client.cc): appended and read as the host's bytes (little-endian hosts
// only).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>

namespace atl::state_bytes {

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));
}

// REQUIRES: at + sizeof(T) <= b.size().
template <typename T>
T Get(std::string_view b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(v));
  return v;
}

}  // namespace atl::state_bytes
