// The JSON form of a config (train/config.h RunConfigFromJson), as a checkpoint's manifest or a
// peer's snapshot carries it. What it accepts is validated and writes back to the same values.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_util.h"
#include "train/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const nlohmann::json j = nlohmann::json::parse(in.rest(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return 0;
  auto cfg = atl::RunConfigFromJson(j);
  if (!cfg.ok()) return 0;
  FUZZ_CHECK(atl::ValidateRunConfig(*cfg).ok());
  auto again = atl::RunConfigFromJson(atl::RunConfigToJson(*cfg));
  FUZZ_CHECK(again.ok());
  FUZZ_CHECK(*again == *cfg);
  return 0;
}
