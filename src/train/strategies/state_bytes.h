// The fixed-width fields of the per-site state files (LowCommState in lowcomm_state.cc,
// AsyncSiteState in async_state.cc): appended and read as the host's bytes (little-endian hosts
// only).
#pragma once

#include <cstddef>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

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

// Reads n float32 at `at` into *v (resized to n); returns the offset after them.
// REQUIRES: at + 4 * n <= b.size().
inline size_t GetFloats(std::string_view b, size_t at, size_t n, std::vector<float>* v) {
  v->resize(n);
  if (n > 0) std::memcpy(v->data(), b.data() + at, n * sizeof(float));  // data() may be null
  return at + n * sizeof(float);
}

}  // namespace atl::state_bytes
