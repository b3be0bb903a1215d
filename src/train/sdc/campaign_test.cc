// The fault-injection campaign (train/sdc/campaign.h): its scoring against known flips.
#include "train/sdc/campaign.h"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "train/test_util.h"

namespace atl {
namespace {

class CampaignTest : public TrainerTest {
 protected:
  CampaignOptions Options(const std::string& name) {
    CampaignOptions o;
    o.cfg = cfg_;
    o.cfg.train.steps = 14;
    o.cfg.train.eval_every = 0;
    o.cfg.sdc.on_alarm = "redo";
    o.first_step = 10;
    o.dir = root_ + "/" + name;
    return o;
  }
  static std::vector<nlohmann::json> Lines(const std::string& path) {
    std::vector<nlohmann::json> out;
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
};

// Exponent flips that blow a GEMM product or a reduced gradient up are caught in their step by
// the guard, found by the replay at the right place, and leave the run bitwise clean; the
// report's rows and files say so.
TEST_F(CampaignTest, ScoresDetectedLocalizedAndRecoveredFlips) {
  CampaignOptions o = Options("exp");
  o.kinds = {FaultKind::kGemmForward, FaultKind::kGemmBackward, FaultKind::kGrad};
  o.bits = {30};
  o.injections = 3;
  auto r = RunCampaign(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcomes.size(), 3u);
  for (const Outcome& out : r->outcomes) {
    SCOPED_TRACE(out.ToJson());
    EXPECT_TRUE(out.fired);
    EXPECT_EQ(out.bit, 30);
    EXPECT_TRUE(out.guard);
    EXPECT_TRUE(out.replay);
    EXPECT_EQ(out.delay, 0);
    EXPECT_TRUE(out.localized);
    EXPECT_TRUE(out.recovered);
    EXPECT_EQ(out.harm, 0.0);
    EXPECT_EQ(out.false_findings.alarm_steps, 0);  // before the flip: the clean run's
    EXPECT_EQ(out.false_findings.verdict_steps, 0);
    EXPECT_GE(out.truth.step, 10);
  }
  EXPECT_FALSE(r->outcomes[2].tensor.empty());  // the gradient's tensor
  EXPECT_EQ(Lines(o.dir + "/injections.jsonl").size(), 3u);
  const std::string tables = CampaignTables(*r);
  EXPECT_NE(
      tables.find(
          "| gemm_fwd | 1 | 100% | 100% | 0% | 0% | 0% | 100% | 100% | 100% | 100% | 0 | 0 | 0 |"),
      std::string::npos)
      << tables;
  EXPECT_NE(tables.find("| 30 (exp) | 3 | 100% |"), std::string::npos) << tables;
  const std::string csv = *ReadFile(o.dir + "/bits.csv");
  EXPECT_NE(csv.find("\n30,3,1.0000,1.0000,0.0000,0.0000,0.0000,1.0000,0\n"), std::string::npos)
      << csv;
}

// Two sites (sync, the WAN on loopback): a payload flip in either half of the ring is caught in
// its step (the all-gather half by the sites' fingerprints, an exponent in the reduce-scatter
// half by the guard), localized to the site that took it and the WAN, and recovered bitwise.
TEST_F(CampaignTest, TwoSitesWanPayloadFlipsAreFoundAndRecovered) {
  CampaignOptions o = Options("sites");
  o.cfg.world.sites = 2;
  o.cfg.world.ranks_per_site = 1;
  o.cfg.train.threads = 1;
  o.kinds = {FaultKind::kWan, FaultKind::kParam};
  o.bits = {30};
  o.injections = 6;
  auto r = RunCampaign(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  ASSERT_EQ(r->outcomes.size(), 6u);
  std::set<int> sites;
  for (const Outcome& out : r->outcomes) {
    SCOPED_TRACE(out.ToJson());
    ASSERT_TRUE(out.fired);
    EXPECT_TRUE(out.detected());
    EXPECT_EQ(out.delay, 0);
    EXPECT_TRUE(out.localized);
    EXPECT_TRUE(out.recovered);
    sites.insert(out.truth.site);
    if (out.kind == FaultKind::kWan) {
      EXPECT_TRUE(out.replay);
      EXPECT_GE(out.truth.chunk, 0);
      EXPECT_EQ(out.truth.to_site, 1 - out.truth.site);
    }
  }
  EXPECT_EQ(sites.size(), 2u);  // both sites struck
  EXPECT_NE(CampaignTables(*r).find("2 sites (sync, WAN on loopback)"), std::string::npos);
  // Only sync runs in one process.
  o.cfg.world.strategy = "diloco";
  EXPECT_EQ(RunCampaign(o).status().code(), StatusCode::kInvalidArgument);
}

// "Recovered" covers every site's final state, not only site 0's checkpoint: a gradient flipped
// on a site after the WAN in the last step, with warnings only, leaves that site apart. Where it
// was site 1, site 0's checkpoint is still the clean run's; the sites' fingerprints after the
// last step tell.
TEST_F(CampaignTest, RecoveredMeansEverySite) {
  CampaignOptions o = Options("sites-last");
  o.cfg.world.sites = 2;
  o.cfg.world.ranks_per_site = 1;
  o.cfg.train.threads = 1;
  o.cfg.sdc.on_alarm = "warn";
  o.first_step = o.cfg.train.steps;
  o.kinds = {FaultKind::kGrad};
  o.bits = {22};
  o.injections = 4;
  auto r = RunCampaign(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  std::set<int> sites;
  for (const Outcome& out : r->outcomes) {
    SCOPED_TRACE(out.ToJson());
    ASSERT_TRUE(out.fired);
    EXPECT_TRUE(out.fingerprint);
    EXPECT_FALSE(out.recovered);
    sites.insert(out.truth.site);
  }
  EXPECT_EQ(sites.count(1), 1u);  // a flip on site 1 (site 0's checkpoint clean) was scored
  // The same flips replayed away: the mismatch stays in the last step's line, before the replay's
  // verdict, and every site ends clean.
  o.cfg.sdc.on_alarm = "redo";
  o.dir += "-redo";
  r = RunCampaign(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  for (const Outcome& out : r->outcomes) {
    SCOPED_TRACE(out.ToJson());
    EXPECT_TRUE(out.fingerprint);
    EXPECT_TRUE(out.recovered);
  }
}

// Without replays the same flips are detected but not recovered: the scoring sees the damage
// (the final parameters differ; the harm is measured) instead of assuming it away.
TEST_F(CampaignTest, WarnOnlyDetectsAndMeasuresTheHarm) {
  CampaignOptions o = Options("warn");
  o.cfg.sdc.on_alarm = "warn";
  o.kinds = {FaultKind::kGrad};
  o.bits = {30};
  o.injections = 1;
  auto r = RunCampaign(o);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  const Outcome& out = r->outcomes.at(0);
  SCOPED_TRACE(out.ToJson());
  EXPECT_TRUE(out.guard);
  EXPECT_FALSE(out.replay);
  EXPECT_FALSE(out.localized);  // the guard names a signal, not a place
  EXPECT_FALSE(out.recovered);
  EXPECT_GT(out.harm, 0.0);
}

// Data-parallel replicas: a parameter flipped in one replica's memory is found by that
// replica's memory check, named (rank and tensor) and repaired from the other replica, so the run
// ends bitwise clean; with the memory checks off the fingerprints name it, and nothing repairs it.
TEST_F(CampaignTest, AParameterFlipOnAReplicaIsNamedAndRepaired) {
  for (bool memory : {true, false}) {
    SCOPED_TRACE(memory ? "memory checks" : "fingerprints only");
    CampaignOptions o = Options(memory ? "dp2" : "dp2-fingerprints");
    o.cfg.parallel.dp = 2;
    o.cfg.sdc.memory = memory;
    o.kinds = {FaultKind::kParam};
    o.bits = {29};
    o.injections = 2;
    auto r = RunCampaign(o);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    EXPECT_EQ(r->ranks, 2);
    for (const Outcome& out : r->outcomes) {
      SCOPED_TRACE(out.ToJson());
      EXPECT_TRUE(out.fired);
      EXPECT_EQ(out.memory, memory);
      EXPECT_EQ(out.fingerprint, !memory);  // repaired before any replica used it
      // The memory check names its own rank; a mismatch of two replicas names both (no place).
      EXPECT_EQ(out.localized, memory);
      EXPECT_EQ(out.recovered, memory);
      EXPECT_EQ(out.delay, 0);
    }
  }
}

// A flip found in its step is a detection in time even when the run then stopped (a moment's
// sign flipped in one process: named by the memory check, nothing to repair it from, NaN); one
// found later is a detection not in time, one not found neither.
TEST(CampaignTablesTest, AStoppedRunFoundInTimeCountsTowardTheGoal) {
  CampaignResult r;
  r.layout = "one process";
  Outcome stopped;
  stopped.kind = FaultKind::kMoment;
  stopped.fired = true;
  stopped.bit = 31;
  stopped.memory = true;
  stopped.delay = 0;
  stopped.error = "internal error: training diverged";
  Outcome late = stopped;
  late.error.clear();
  late.delay = 2;
  Outcome missed = late;
  missed.memory = false;
  missed.delay = -1;
  r.outcomes = {stopped, late, missed};
  const std::string tables = CampaignTables(r);
  EXPECT_NE(tables.find("detected within 1 step | 1/3 (33.3%)"), std::string::npos) << tables;
  // The moment row: 3 flips, 2 detected (67%, by the memory checks), 1 within a step (33%),
  // none localized or recovered, 1 stopped.
  EXPECT_NE(
      tables.find("| moment | 3 | 67% | 0% | 0% | 0% | 67% | 0% | 33% | 0% | 0% | 0 | 0 | 1 |"),
      std::string::npos)
      << tables;
}

TEST(CampaignOptionsTest, RefusesBadSitesBitsAndSteps) {
  EXPECT_FALSE(ParseFaultKinds("gemm_fwd,bogus").ok());
  EXPECT_FALSE(ParseFaultKinds("bad_core").ok());
  EXPECT_FALSE(ParseFaultKinds("").ok());
  EXPECT_EQ(ParseFaultKinds("grad,param")->size(), 2u);
  EXPECT_EQ(ParseBits("23-31")->size(), 9u);
  EXPECT_EQ(*ParseBits("0,31"), (std::vector<int>{0, 31}));
  EXPECT_FALSE(ParseBits("30-32").ok());
  EXPECT_FALSE(ParseBits("x").ok());
  EXPECT_FALSE(ParseBits("5-3").ok());
  CampaignOptions o;
  o.kinds = {FaultKind::kGrad};
  o.cfg.train.steps = 5;
  o.first_step = 6;
  o.dir = ::testing::TempDir() + "/campaign_refused";
  EXPECT_EQ(RunCampaign(o).status().code(), StatusCode::kInvalidArgument);
  o.first_step = 2;
  o.cfg.sdc.on_alarm = "stop";
  EXPECT_EQ(RunCampaign(o).status().code(), StatusCode::kInvalidArgument);
  o.cfg.sdc.on_alarm = "warn";
  o.cfg.train.checkpoint_every = -1;  // no final model to compare
  const Status none = RunCampaign(o).status();
  EXPECT_EQ(none.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(none.message().find("train.checkpoint_every"), std::string::npos) << none.ToString();
}

}  // namespace
}  // namespace atl
