// Content hashing (XXH3-64, from libxxhash): checksums of tensors, files and messages.
//
// Thread-safety: pure functions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace atl {

uint64_t Hash64(const void* data, size_t size, uint64_t seed = 0);
inline uint64_t Hash64(std::string_view s) { return Hash64(s.data(), s.size()); }

// 16 lowercase hex digits.
std::string HashToHex(uint64_t h);
// Parses 16 hex digits; returns false on anything else.
bool HexToHash(std::string_view hex, uint64_t* out);

}  // namespace atl
