// The parameter server's op log (world/ps.h ParseOpLog over world/coordinator/durable_log.h
// ParseLog), which `atoll replay` and a restarted server read. Update ids and versions of an
// accepted log run in order; every weight is finite.
#include <cmath>

#include "fuzz/fuzz_util.h"
#include "world/coordinator/durable_log.h"
#include "world/ps.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  auto contents = atl::ParseLog(in.rest(), "fuzz/ops.jsonl", "op log record");
  if (!contents.ok()) return 0;
  FUZZ_CHECK(contents->good_bytes + contents->torn_bytes == in.size());
  auto log = atl::ParseOpLog(*contents, "fuzz/ops.jsonl");
  if (!log.ok()) return 0;
  int64_t applied = 0;
  for (size_t i = 0; i < log->entries.size(); ++i) {
    const atl::PsLogEntry& e = log->entries[i];
    FUZZ_CHECK(e.update_id == int64_t(i));
    if (e.applied_version != -1) FUZZ_CHECK(e.applied_version == ++applied);
    FUZZ_CHECK(std::isfinite(e.weight));
  }
  return 0;
}
