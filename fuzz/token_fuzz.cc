// The shared token file's reader (world/security.h ParseToken). An accepted token is what gRPC
// can send as metadata: 16 to kMaxTokenBytes visible ASCII characters, the file's text without
// its trailing newline.
#include "fuzz/fuzz_util.h"
#include "world/security.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  auto token = atl::ParseToken(in.rest(), "fuzz/token");
  if (!token.ok()) return 0;
  FUZZ_CHECK(token->size() >= 16 && token->size() <= atl::kMaxTokenBytes);
  for (char c : *token) FUZZ_CHECK(c > 0x20 && c < 0x7f);
  FUZZ_CHECK(in.rest().substr(0, token->size()) == *token);
  return 0;
}
