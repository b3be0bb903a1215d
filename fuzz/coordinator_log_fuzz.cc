// The coordinator's log (STATE/coordinator.log) as a restarted coordinator replays it:
// world/coordinator/durable_log.h ParseLog, then MembershipState::Apply record by record. A
// damaged log must be refused with a status, never crash or leave a state that breaks its rules.
#include "fuzz/fuzz_util.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/membership.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const int sites = 1 + in.Take<uint8_t>() % 8;
  auto contents = atl::ParseLog(in.rest(), "fuzz/coordinator.log", "coordinator record");
  if (!contents.ok()) return 0;
  atl::MembershipState state(sites, /*heartbeat_s=*/1.0, /*dead_after_beats=*/3);
  int64_t epoch = 0;
  for (const atl::LogRecord& r : contents->records) {
    if (!state.Apply(r.json).ok()) return 0;
    const atl::Membership m = state.Current();
    FUZZ_CHECK(m.epoch >= epoch);  // the epoch never goes back
    epoch = m.epoch;
    FUZZ_CHECK(int(m.sites.size()) == sites);
    FUZZ_CHECK(m.live() >= 0 && m.live() <= sites);
  }
  // What the server asks of a replayed state works on any state the log can produce.
  (void)state.NextConsequence();
  (void)state.NextDeath(1e9);
  (void)state.Missing();
  (void)state.Late(state.completed_round() + 1);
  return 0;
}
