#include "core/hash.h"

#include <xxh3.h>

#include <fmt/format.h>

namespace atl {

uint64_t Hash64(const void* data, size_t size, uint64_t seed) {
  return XXH3_64bits_withSeed(data, size, seed);
}

std::string HashToHex(uint64_t h) { return fmt::format("{:016x}", h); }

bool HexToHash(std::string_view hex, uint64_t* out) {
  if (hex.size() != 16) return false;
  uint64_t v = 0;
  for (char c : hex) {
    int d;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (c >= 'A' && c <= 'F') d = c - 'A' + 10;
    else return false;
    v = (v << 4) | uint64_t(d);
  }
  *out = v;
  return true;
}

}  // namespace atl
