// The coordinator's membership rules (world/coordinator/membership.h) driven by a sequence of
// requests decoded from the input: registrations and rejoins, leaves, heartbeats, rounds, deaths.
// Every record the state plans must apply, and replaying the log it wrote into a fresh state
// (a restarted coordinator) must give the same durable state.
#include <vector>

#include "fuzz/fuzz_util.h"
#include "world/coordinator/membership.h"

namespace {

void ApplyOk(atl::MembershipState& s, const nlohmann::json& record,
             std::vector<nlohmann::json>* log) {
  FUZZ_CHECK(s.Apply(record).ok());
  log->push_back(record);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const int sites = 1 + in.Take<uint8_t>() % 6;
  atl::MembershipState state(sites, 1.0, 3);
  std::vector<nlohmann::json> log;
  ApplyOk(state, state.StartRecord(), &log);
  double now = 0;
  for (int op = 0; in.size() > 0 && op < 256; ++op) {
    const uint8_t kind = in.Take<uint8_t>() % 8;
    const int site = int(in.Take<int8_t>()) % (sites + 2);  // some out of range
    const uint64_t incarnation = in.Take<uint8_t>() % 4;
    now += in.Take<uint8_t>() / 16.0;
    nlohmann::json record;
    switch (kind) {
      case 0:
      case 1: {
        atl::Registration r;
        r.site = site;
        r.incarnation = incarnation;
        r.wan_address = "127.0.0.1:" + std::to_string(7000 + in.Take<uint8_t>() % 4);
        r.config_hash = in.Take<uint8_t>() % 2;
        r.rejoin = kind == 1;
        r.join_round = in.Bit() ? in.Take<int64_t>() : in.Take<int8_t>();
        r.early_by = in.Take<uint8_t>() % 4;
        if (state.PlanRegister(r, &record).ok() && !record.is_null()) {
          ApplyOk(state, record, &log);
          state.Beat(site, incarnation, now);
          FUZZ_CHECK(state.CheckMember(site, incarnation).ok());
        }
        break;
      }
      case 2:
        if (state.PlanLeave(site, incarnation, &record).ok() && !record.is_null())
          ApplyOk(state, record, &log);
        break;
      case 3:
        if (site >= 0 && site < sites) state.Beat(site, incarnation, now);
        break;
      case 4:
        if (site >= 0 && site < sites && state.CheckMember(site, incarnation).ok()) {
          std::optional<atl::RoundVote> vote;
          if (in.Bit())
            vote = atl::RoundVote{in.Bit(), in.Take<uint8_t>(), in.Take<uint8_t>() / 8.0};
          state.ReachRound(site, state.completed_round() + 1 + in.Take<uint8_t>() % 3, vote);
        }
        break;
      case 5:
        if (auto c = state.NextConsequence()) ApplyOk(state, *c, &log);
        break;
      case 6:
        if (auto d = state.NextDeath(now)) ApplyOk(state, *d, &log);
        break;
      default:
        ApplyOk(state, state.RestartRecord(), &log);
        state.GraceAll(now + 3);
        break;
    }
  }
  // A restarted coordinator replays the log into the same durable state.
  atl::MembershipState replayed(sites, 1.0, 3);
  for (const auto& r : log) FUZZ_CHECK(replayed.Apply(r).ok());
  const atl::Membership a = state.Current(), b = replayed.Current();
  FUZZ_CHECK(a.epoch == b.epoch);
  FUZZ_CHECK(state.completed_round() == replayed.completed_round());
  FUZZ_CHECK(state.quorum() == replayed.quorum());
  for (int s = 0; s < sites; ++s) {
    FUZZ_CHECK(a.sites[s].alive == b.sites[s].alive && a.sites[s].left == b.sites[s].left);
    FUZZ_CHECK(a.sites[s].wan_address == b.sites[s].wan_address);
    FUZZ_CHECK(a.sites[s].join_round == b.sites[s].join_round);
  }
  return 0;
}
