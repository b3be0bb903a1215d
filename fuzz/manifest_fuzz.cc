// A checkpoint's manifest.json (train/checkpoint.h ParseManifest). The input's JSON gets its
// correct self-checksum first (the reader's first check, which random bytes never pass), so the
// fuzzer reaches the fields behind it; other inputs go in as they are.
#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "fuzz/fuzz_util.h"
#include "train/checkpoint.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const bool fix_checksum = in.Bit();
  std::string text(in.rest());
  if (fix_checksum) {
    auto m = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (m.is_object()) {
      m.erase("checksum");
      m["checksum"] = atl::HashToHex(atl::Hash64(m.dump()));
      text = m.dump();
    }
  }
  nlohmann::ordered_json files;
  auto ck = atl::ParseManifest(text, "fuzz/manifest.json", &files);
  if (!ck.ok()) return 0;
  FUZZ_CHECK(atl::ValidateRunConfig(ck->config).ok());
  FUZZ_CHECK(ck->cursor.next_step >= 0 && ck->cursor.next_step <= ck->config.train.steps);
  FUZZ_CHECK(ck->params.empty() && ck->exp_avg.empty());
  return 0;
}
