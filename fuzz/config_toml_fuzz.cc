// The TOML config loader (train/config.h ParseRunConfig, ValidateRunConfig). A config that loads
// and validates must read back to the same values from both of its written forms: the TOML a
// checkpoint's user edits and the JSON a manifest keeps.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  auto cfg = atl::ParseRunConfig(in.rest(), "fuzz.toml");
  if (!cfg.ok() || !atl::ValidateRunConfig(*cfg).ok()) return 0;
  auto again = atl::ParseRunConfig(atl::RunConfigToToml(*cfg), "written.toml");
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *cfg);
  auto from_json = atl::RunConfigFromJson(atl::RunConfigToJson(*cfg));
  FUZZ_CHECK(from_json.ok());
  FUZZ_CHECK(*from_json == *cfg);
  return 0;
}
