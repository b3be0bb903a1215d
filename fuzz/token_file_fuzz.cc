// The data token files (data/dataset.h ParseTokenFile). With the first input bit set, a header's
// checksum field is made right (random bytes never match an XXH3), so the size checks behind it
// are reached. What is accepted is exactly the bytes after the header.
#include <cstring>
#include <vector>

#include "core/hash.h"
#include "data/dataset.h"
#include "fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const bool fix_checksum = in.Bit();
  // 2-byte aligned, as a mapping is.
  std::vector<uint16_t> buffer((in.size() + 1) / 2);
  auto* bytes = reinterpret_cast<uint8_t*>(buffer.data());
  if (in.size() > 0) std::memcpy(bytes, in.data(), in.size());
  if (fix_checksum && in.size() >= 24) {
    const uint64_t h = atl::Hash64(bytes + 24, in.size() - 24);
    std::memcpy(bytes + 16, &h, sizeof h);
  }
  uint64_t checksum = 0;
  auto tokens = atl::ParseTokenFile({bytes, in.size()}, "fuzz.bin", &checksum);
  if (!tokens.ok()) return 0;
  FUZZ_CHECK(in.size() == 24 + 2 * tokens->size());
  FUZZ_CHECK(reinterpret_cast<const uint8_t*>(tokens->data()) == bytes + 24);
  FUZZ_CHECK(checksum == atl::Hash64(bytes + 24, in.size() - 24));
  return 0;
}
