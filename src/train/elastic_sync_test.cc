// Elastic sync (train/strategies/sync_strategy.cc): three sites of one rank each in one process
// (train/local_world.h), joined by the real WAN transport and an in-process coordinator. A site
// lost mid-run (it stops after a step and drops its links without a goodbye, as a crash would)
// is absorbed: the survivors take over its micro-batches, so with parallel.reproducible the run
// ends with the bits of a single site that lost nothing; losing site 0 moves validation and
// checkpoints to site 1.
#include <gtest/gtest.h>

#include "train/local_world.h"
#include "train/test_util.h"

namespace atl {
namespace {

class ElasticSyncTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    cfg_.train.steps = 10;
    cfg_.train.threads = 1;
    cfg_.train.batch_size = 6;  // 2 micro-batches of 1 per site
    cfg_.train.micro_batch_size = 1;
    cfg_.parallel.reproducible = true;
    cfg_.world.heartbeat_s = 0.2;  // a lost site is dead after 0.6 s
  }
  RunConfig Sites(int sites) const {
    RunConfig c = cfg_;
    c.world.sites = sites;
    c.world.ranks_per_site = 1;
    return c;
  }
  // The single site's run that lost nothing: the bits every elastic run must end with.
  std::string Clean() { return FinalState(Run(cfg_, "one")); }
  std::string Site(const std::string& name, int s) const {
    return fmt::format("{}/{}/site-{}", root_, name, s);
  }
  static std::vector<int> Steps(const std::string& dir, bool with_val = false) {
    std::vector<int> out;
    for (const auto& m : Metrics(dir))
      if (!with_val || m.contains("val_loss")) out.push_back(m["step"].get<int>());
    return out;
  }
};

// The reproducible mode sums the sites' int64 gradients over the WAN: three sites give the
// single site's bits, with a coordinator agreeing on every step's sums or without one.
TEST_F(ElasticSyncTest, ThreeSitesGiveTheSingleSitesBits) {
  const std::string clean = Clean();
  ASSERT_TRUE(TrainLocalWorld(Sites(3), root_ + "/plain").ok());
  EXPECT_EQ(FinalState(root_ + "/plain"), clean);
  ASSERT_TRUE(TrainLocalWorld(Sites(3), root_ + "/agreed", {.coordinator = true, .lose = {}}).ok());
  EXPECT_EQ(FinalState(root_ + "/agreed"), clean);
  EXPECT_EQ(LossColumns(Site("agreed", 2)), LossColumns(Site("plain", 2)));
}

// Site 2 is lost after step 4: sites 0 and 1 compute step 5 again with its micro-batches and go
// on; the run ends with the clean bits, and site 0 writes the checkpoint.
TEST_F(ElasticSyncTest, ALostSitesShareIsTakenOverWithTheSameBits) {
  const std::string clean = Clean();
  const Status st =
      TrainLocalWorld(Sites(3), root_ + "/lost", {.coordinator = true, .lose = {{2, 4}}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FinalState(root_ + "/lost"), clean);
  EXPECT_EQ(Steps(Site("lost", 2)), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(Steps(Site("lost", 1)).size(), 10u);
  // The losses every site logs are the whole batch's: the clean run's.
  const std::vector<std::string> one = LossColumns(root_ + "/one");
  std::vector<std::string> site1 = LossColumns(Site("lost", 1));
  ASSERT_EQ(site1.size(), one.size());
  for (size_t i = 0; i < one.size(); ++i)  // site 1 does not validate
    EXPECT_EQ(site1[i].substr(0, site1[i].rfind(' ')), one[i].substr(0, one[i].rfind(' ')));
}

// Sites of two ranks: the leader learns of the loss in a detector's collective between steps;
// its other rank takes the new live set too and computes its share of the lost site's batch.
TEST_F(ElasticSyncTest, SitesOfTwoRanksTakeOverTogether) {
  RunConfig c = Sites(3);
  c.parallel.dp = 2;
  c.world.ranks_per_site = 2;
  c.train.batch_size = 12;
  RunConfig one = cfg_;
  one.train.batch_size = 12;
  const std::string single = FinalState(Run(one, "one12"));
  const Status st = TrainLocalWorld(c, root_ + "/dp2", {.coordinator = true, .lose = {{2, 4}}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FinalState(root_ + "/dp2"), single);
}

// Every step audited (replayed, and checked on the site's other replica) while site 2 is lost:
// the replays compare runs of one live set, the peer check leaves out steps with a lost site's
// micro-batches (its peers recompute a replica's own only), and the bits stay the clean ones.
TEST_F(ElasticSyncTest, AuditedStepsGoOnWithALostSite) {
  RunConfig c = Sites(3);
  c.parallel.dp = 2;
  c.world.ranks_per_site = 2;
  c.train.batch_size = 12;
  c.sdc.audit_every = 1;
  RunConfig one = cfg_;
  one.train.batch_size = 12;
  const std::string single = FinalState(Run(one, "one12"));
  const Status st = TrainLocalWorld(c, root_ + "/audit", {.coordinator = true, .lose = {{2, 4}}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FinalState(root_ + "/audit"), single);
  EXPECT_EQ(SdcEvents(Site("audit", 0), "replay").size(), 10u);
}

// Site 0 lost after its last step, before the final checkpoint: site 1 writes it.
TEST_F(ElasticSyncTest, SiteZeroLostAtTheEndLeavesTheCheckpointToSiteOne) {
  const std::string clean = Clean();
  const Status st =
      TrainLocalWorld(Sites(3), root_ + "/end0", {.coordinator = true, .lose = {{0, 10}}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FinalState(root_ + "/end0"), clean);
}

// Losing site 0 ends nothing: site 1 takes over validation and the checkpoints.
TEST_F(ElasticSyncTest, LosingSiteZeroMovesItsDutiesToSiteOne) {
  const std::string clean = Clean();
  RunConfig c = Sites(3);
  c.train.checkpoint_every = 5;
  const Status st = TrainLocalWorld(c, root_ + "/lost0", {.coordinator = true, .lose = {{0, 3}}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(FinalState(root_ + "/lost0"), clean);
  EXPECT_TRUE(std::filesystem::exists(root_ + "/lost0/checkpoint-5/model.safetensors"));
  EXPECT_EQ(Steps(Site("lost0", 1), /*with_val=*/true), (std::vector<int>{5, 10}));
  EXPECT_TRUE(Steps(Site("lost0", 2), /*with_val=*/true).empty());
}

// Two of three sites lost leave one, fewer than the majority (world.quorum = 0): the survivor
// stops with an error naming the quorum rather than training on alone.
TEST_F(ElasticSyncTest, FewerSitesThanTheQuorumStop) {
  const Status st =
      TrainLocalWorld(Sites(3), root_ + "/few", {.coordinator = true, .lose = {{1, 2}, {2, 2}}});
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("world.quorum"), std::string::npos) << st.ToString();
}

}  // namespace
}  // namespace atl
