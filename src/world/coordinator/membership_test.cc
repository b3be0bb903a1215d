// The membership state machine alone: planning changes nothing until the record is applied,
// replaying the records rebuilds the same state, rounds never go down, a stale retried Round
// neither lowers a round nor replaces a vote, a round's votes are its own.
#include "world/coordinator/membership.h"

#include <gtest/gtest.h>

#include <vector>

namespace atl {
namespace {

using Json = nlohmann::json;

// Registers sites 0..n-1 (applying each record) and returns the records, with the quorum's.
std::vector<Json> RegisterAll(MembershipState& m, int n) {
  std::vector<Json> log = {m.StartRecord()};
  for (int s = 0; s < n; ++s) {
    Json r;
    EXPECT_TRUE(
        m.PlanRegister({s, uint64_t(100 + s), "10.0.0.1:" + std::to_string(s), 7, false, 0, "test"},
                       &r)
            .ok());
    EXPECT_TRUE(m.Apply(r).ok());
    log.push_back(r);
    m.Beat(s, uint64_t(100 + s), 0);
  }
  auto q = m.NextConsequence();
  EXPECT_TRUE(q.has_value());
  EXPECT_EQ((*q)["t"], "quorum");
  EXPECT_TRUE(m.Apply(*q).ok());
  log.push_back(*q);
  return log;
}

// Completes every round that follows from the state; the records.
std::vector<Json> Settle(MembershipState& m) {
  std::vector<Json> out;
  while (auto r = m.NextConsequence()) {
    EXPECT_TRUE(m.Apply(*r).ok());
    out.push_back(*r);
  }
  return out;
}

TEST(Membership, PlanningChangesNothingUntilApplied) {
  MembershipState m(2, 1.0, 3);
  Json r;
  ASSERT_TRUE(m.PlanRegister({0, 100, "a:1", 7, false, 0, "t"}, &r).ok());
  EXPECT_FALSE(m.Current().sites[0].alive);
  EXPECT_EQ(m.Current().epoch, 0);
  ASSERT_TRUE(m.Apply(r).ok());
  EXPECT_TRUE(m.Current().sites[0].alive);
  EXPECT_EQ(m.Current().epoch, 1);
  // The same process again: nothing to log.
  Json again;
  ASSERT_TRUE(m.PlanRegister({0, 100, "a:1", 7, false, 0, "t"}, &again).ok());
  EXPECT_TRUE(again.is_null());
}

TEST(Membership, ReplayingTheRecordsRebuildsTheState) {
  MembershipState live(3, 1.0, 3);
  std::vector<Json> log = RegisterAll(live, 3);
  for (int s = 0; s < 3; ++s) live.ReachRound(s, 4, RoundVote{s == 1, uint64_t(s), 0.5 * s});
  for (const Json& r : Settle(live)) log.push_back(r);
  auto death = live.NextDeath(10.0);  // silent since 0, limit 3 s
  ASSERT_TRUE(death.has_value());
  ASSERT_TRUE(live.Apply(*death).ok());
  log.push_back(*death);
  MembershipState replayed(3, 1.0, 3);
  for (const Json& r : log) ASSERT_TRUE(replayed.Apply(r).ok()) << r.dump();
  const Membership a = live.Current(), b = replayed.Current();
  EXPECT_EQ(a.epoch, b.epoch);
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(a.sites[size_t(s)].alive, b.sites[size_t(s)].alive) << s;
    EXPECT_EQ(a.sites[size_t(s)].last_round, b.sites[size_t(s)].last_round) << s;
  }
  EXPECT_EQ(replayed.RoundResult(4).votes, live.RoundResult(4).votes);
  EXPECT_EQ(replayed.RoundResult(4).votes.at(1), (RoundVote{true, 1, 0.5}));  // pace kept
  // A log of another world size is refused.
  MembershipState other(4, 1.0, 3);
  EXPECT_EQ(other.Apply(log[0]).code(), StatusCode::kInvalidArgument);
}

TEST(Membership, AStaleRoundNeitherLowersTheRoundNorReplacesTheVote) {
  MembershipState m(2, 1.0, 3);
  RegisterAll(m, 2);
  m.ReachRound(0, 5, RoundVote{false, 0xaa});
  m.ReachRound(0, 3, RoundVote{true, 0xbb});  // a retry of an old call, delivered late
  EXPECT_EQ(m.Current().sites[0].last_round, 5);
  m.ReachRound(1, 5, RoundVote{false, 0xaa});
  Settle(m);
  const Membership r5 = m.RoundResult(5);
  ASSERT_EQ(r5.votes.size(), 2u);
  EXPECT_EQ(r5.votes.at(0), (RoundVote{false, 0xaa}));
}

TEST(Membership, ARoundCompletedWithALaterOneHasNoVotes) {
  MembershipState m(2, 1.0, 3);
  RegisterAll(m, 2);
  // Both sites pass round 2 and vote in round 3: round 2 never completes on its own.
  m.ReachRound(0, 3, RoundVote{false, 1});
  m.ReachRound(1, 3, RoundVote{false, 1});
  Settle(m);
  EXPECT_EQ(m.completed_round(), 3);
  EXPECT_EQ(m.RoundResult(3).votes.size(), 2u);
  EXPECT_TRUE(m.RoundResult(2).votes.empty());  // not round 3's votes
}

TEST(Membership, ADeadSiteMustRejoinAfterTheQuorum) {
  MembershipState m(2, 1.0, 3);
  RegisterAll(m, 2);
  m.Beat(1, 555, 100);  // another process's beat does not count for site 1
  m.Beat(0, 100, 100);
  auto death = m.NextDeath(100);  // site 1 silent since 0
  ASSERT_TRUE(death.has_value());
  EXPECT_EQ((*death)["site"], 1);
  ASSERT_TRUE(m.Apply(*death).ok());
  Json r;
  Verdict v = m.PlanRegister({1, 555, "b:2", 7, false, 0, "t"}, &r);
  EXPECT_EQ(v.refusal, Refusal::kMustRejoin) << v.message;
  // early_by: refused once a live site reached join_round - early_by (site 0 is at round 5).
  m.ReachRound(0, 5, std::nullopt);
  v = m.PlanRegister({1, 555, "b:2", 7, true, 9, "t", /*early_by=*/4}, &r);
  EXPECT_EQ(v.refusal, Refusal::kTooLate) << v.message;
  v = m.PlanRegister({1, 555, "b:2", 7, true, 9, "t", /*early_by=*/10}, &r);
  EXPECT_EQ(v.refusal, Refusal::kBadRequest) << v.message;  // before round 0
  v = m.PlanRegister({1, 555, "b:2", 7, true, 9, "t", /*early_by=*/3}, &r);
  ASSERT_TRUE(v.ok()) << v.message;
  ASSERT_TRUE(m.Apply(r).ok());
  EXPECT_EQ(m.Current().sites[1].last_round, 8);
  EXPECT_EQ(m.Current().sites[1].join_round, 9);
  // The run is over once every other site has left: a rejoin then is refused.
  Json leave, death2;
  ASSERT_TRUE(m.PlanLeave(0, 100, &leave).ok());
  ASSERT_TRUE(m.Apply(leave).ok());
  m.Beat(0, 100, 200);
  auto late = m.NextDeath(200);  // site 1's new process, silent
  ASSERT_TRUE(late.has_value());
  ASSERT_TRUE(m.Apply(*late).ok());
  v = m.PlanRegister({1, 556, "b:3", 7, true, 20, "t"}, &r);
  EXPECT_EQ(v.refusal, Refusal::kFinished) << v.message;
}

// A site that left did its part; only a site declared dead is one whose operations must fail.
// Time the coordinator did not run is taken out of every site's silence (the monitor's stalls):
// a last beat moves that much later, never past now and never earlier (a restart's grace, ahead
// of now, stays as it was).
TEST(Membership, APauseIsNotCountedAsSilence) {
  MembershipState m(3, 1.0, 3);  // dead after 3 s
  RegisterAll(m, 3);
  m.Beat(0, 100, 10.0);
  m.Beat(1, 101, 15.0);
  m.Beat(2, 102, 11.0);
  EXPECT_EQ((*m.NextDeath(13.5))["site"], 0);  // silent 3.5 s
  // The coordinator did not run from 11 to 16: site 0 was silent 1 s before it, sites 1 and 2
  // (heard at 15 and 11) not at all.
  m.Pause(5.0, 16.0);
  EXPECT_FALSE(m.NextDeath(17.9).has_value());
  auto death = m.NextDeath(18.05);
  ASSERT_TRUE(death.has_value());
  EXPECT_EQ((*death)["site"], 0);
  EXPECT_NEAR((*death)["silent_s"].get<double>(), 3.05, 1e-9);
  m.Pause(-1.0, 16.0);  // no pause: nothing moves
  EXPECT_TRUE(m.NextDeath(18.05).has_value());
  // A restart's grace ahead of now is kept.
  m.GraceAll(30.0);
  m.Pause(100.0, 20.0);
  EXPECT_FALSE(m.NextDeath(32.9).has_value());
  EXPECT_EQ((*m.NextDeath(33.1))["site"], 0);
}

TEST(Membership, ALeftSiteIsNotDead) {
  MembershipState m(3, 1.0, 3);
  RegisterAll(m, 3);
  Json leave;
  ASSERT_TRUE(m.PlanLeave(1, 101, &leave).ok());
  ASSERT_TRUE(m.Apply(leave).ok());
  m.Beat(0, 100, 100);
  auto death = m.NextDeath(100);  // site 2, silent since 0
  ASSERT_TRUE(death.has_value());
  ASSERT_TRUE(m.Apply(*death).ok());
  const Membership now = m.Current();
  EXPECT_TRUE(now.sites[1].left);
  EXPECT_FALSE(now.sites[2].left);
  const std::vector<SiteInfo> dead = now.Dead(0);
  ASSERT_EQ(dead.size(), 1u);
  EXPECT_EQ(dead[0].site, 2);
  EXPECT_TRUE(now.Dead(2).empty());  // not itself
}

}  // namespace
}  // namespace atl

namespace atl {
namespace {

// Each site's entry names the epoch its current process registered at (what its WAN chunks
// carry), and a rejoin's is the later one; a replayed log gives the same.
TEST(MembershipStateTest, EachSiteNamesTheEpochItsProcessRegisteredAt) {
  MembershipState m(2, 1.0, 3);
  std::vector<Json> log = RegisterAll(m, 2);
  const Membership first = m.Current();
  EXPECT_EQ(first.sites[0].epoch, 1);
  EXPECT_EQ(first.sites[1].epoch, 2);
  m.Beat(0, 100, 10);
  auto death = m.NextDeath(10);  // site 1 silent since 0
  ASSERT_TRUE(death.has_value());
  ASSERT_TRUE(m.Apply(*death).ok());
  log.push_back(*death);
  Json r;
  ASSERT_TRUE(m.PlanRegister({1, 777, "10.0.0.1:9", 7, true, 5, "test"}, &r).ok());
  ASSERT_TRUE(m.Apply(r).ok());
  log.push_back(r);
  EXPECT_EQ(m.Current().sites[1].epoch, 4);  // registrations 1, 2, the death 3, the rejoin 4
  MembershipState replayed(2, 1.0, 3);
  for (const Json& j : log) ASSERT_TRUE(replayed.Apply(j).ok());
  EXPECT_EQ(replayed.Current().sites[1].epoch, 4);
  EXPECT_EQ(replayed.Current().sites[0].epoch, 1);
}

// Found by fuzz/membership_fuzz.cc and fuzz/coordinator_log_fuzz.cc: a site out of range indexed
// past the sites, and a record's float where an integer belongs was converted with undefined
// behaviour. Both are refused now.
TEST(MembershipStateTest, RefusesSitesOutOfRangeAndNonIntegerFields) {
  MembershipState m(3, 1.0, 3);
  ASSERT_TRUE(m.Apply(m.StartRecord()).ok());
  Json r;
  for (int site : {-1, 3, 1000}) {
    const Verdict v = m.PlanRegister({site, 1, "10.0.0.1:1", 7, false, 0, "test"}, &r);
    EXPECT_EQ(v.refusal, Refusal::kBadRequest) << site;
    EXPECT_TRUE(r.is_null());
    EXPECT_EQ(m.CheckMember(site, 1).refusal, Refusal::kBadRequest);
    EXPECT_EQ(m.PlanLeave(site, 1, &r).refusal, Refusal::kBadRequest);
  }
  for (const char* bad :
       {R"({"t":"start","sites":3.3e65})", R"({"t":"death","site":1e300,"epoch":2})",
        R"({"t":"quorum","epoch":"2"})", R"({"t":"round","round":0,"epoch":1,"live":[0.5]})",
        R"({"t":"round","round":0,"epoch":1,"live":7})"}) {
    Status s = m.Apply(Json::parse(bad));
    EXPECT_EQ(s.code(), StatusCode::kCorruption) << bad << ": " << s.ToString();
  }
}

}  // namespace
}  // namespace atl
