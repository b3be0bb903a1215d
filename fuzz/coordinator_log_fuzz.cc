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
  size_t applied = 0;
  for (const atl::LogRecord& r : contents->records) {
    if (!state.Apply(r.json).ok()) break;  // a restarted coordinator stops here (corruption)
    ++applied;
    const atl::Membership m = state.Current();
    FUZZ_CHECK(m.epoch >= epoch);  // the epoch never goes back
    epoch = m.epoch;
    FUZZ_CHECK(int(m.sites.size()) == sites);
    FUZZ_CHECK(m.live() >= 0 && m.live() <= sites);
  }
  if (applied < contents->records.size()) return 0;  // refused: the coordinator does not start
  // Replaying the same log into a fresh state gives the same state: nothing but the log decides.
  atl::MembershipState again(sites, 1.0, 3);
  for (const atl::LogRecord& r : contents->records) FUZZ_CHECK(again.Apply(r.json).ok());
  const atl::Membership a = state.Current(), b = again.Current();
  FUZZ_CHECK(a.epoch == b.epoch && state.completed_round() == again.completed_round());
  for (int s = 0; s < sites; ++s)
    FUZZ_CHECK(a.sites[s].alive == b.sites[s].alive &&
               a.sites[s].join_round == b.sites[s].join_round);
  // What the server does next with a replayed state: the records it plans apply to it (it logs
  // them, then applies them), and its questions have answers.
  for (int i = 0; i < 4; ++i) {
    auto next = state.NextConsequence();
    if (!next) next = state.NextDeath(1e9);
    if (!next) break;
    FUZZ_CHECK(state.Apply(*next).ok());
  }
  (void)state.Missing();
  (void)state.Late(state.completed_round() + 1);
  return 0;
}
