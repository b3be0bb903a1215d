// Silent data corruption across sites (world.strategy = sync): two sites of one rank each, their
// leaders joined by the real WAN transport on loopback (a thread per site). A payload corrupted
// before the transport checksums it (fault kind wan) is accepted by the receiver; the sites'
// fingerprints compared over the WAN see what reached one site only, the step guard what reached
// both, and every site replays the step together, so the run ends bitwise equal to a clean one
// with the corruption located to the step, the site and the WAN.
#include <gtest/gtest.h>

#include <algorithm>

#include "comm/inprocess.h"
#include "train/local_world.h"
#include "train/test_util.h"

namespace atl {
namespace {

class SitesSdcTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    cfg_.train.steps = 14;
    cfg_.train.threads = 1;
    cfg_.train.grad_clip = 0;  // no clipping to hide a flip
    cfg_.world.sites = 2;
    cfg_.world.ranks_per_site = 1;
  }

  // Trains both sites into root_/name/site-N (site 0 writes the checkpoint into root_/name).
  Status RunSites(const RunConfig& cfg, const std::string& name) {
    return TrainLocalWorld(cfg, root_ + "/" + name);
  }
  // Trains cfg_ clean (into "clean") and with `inject` (into "faulty"), with sdc.on_alarm =
  // redo or warn and the faulty run's guard on or off; true when both succeed and end with the
  // same bits.
  bool CleanAndFaulty(const std::string& inject, bool redo, bool guard) {
    RunConfig clean = cfg_;
    if (redo) clean.sdc.on_alarm = "redo";
    RunConfig faulty = clean;
    faulty.faults.inject = inject;
    faulty.sdc.guard = guard;
    for (const Status& st : {RunSites(clean, "clean"), RunSites(faulty, "faulty")})
      if (!st.ok()) {
        ADD_FAILURE() << st.ToString();
        return false;
      }
    EXPECT_EQ(Final("faulty"), Final("clean"));
    return Final("faulty") == Final("clean");
  }
  std::string Site(const std::string& name, int s) const {
    return fmt::format("{}/{}/site-{}", root_, name, s);
  }
  std::string Final(const std::string& name) const { return FinalState(root_ + "/" + name); }
  // The sdc events of a site's metrics at `step`.
  static std::vector<nlohmann::json> Events(const std::string& dir, int step) {
    std::vector<nlohmann::json> out;
    for (const auto& m : Metrics(dir))
      if (m["step"] == step && m.contains("sdc"))
        for (const auto& e : m["sdc"]) out.push_back(e);
    return out;
  }
  static int CountEvents(const std::string& dir) {
    int n = 0;
    for (const auto& m : Metrics(dir))
      if (m.contains("sdc")) n += int(m["sdc"].size());
    return n;
  }
};

// A mantissa bit of site 0's all-gather half reaches site 1 only: no guard sees it, the sites'
// fingerprints do (two sites: no majority), every site replays, site 1's replay names the WAN
// and the tensor, and the run ends with the clean run's bits.
TEST_F(SitesSdcTest, APayloadOnlyOneSiteTookIsFoundByFingerprintsAndReplayedAway) {
  ASSERT_TRUE(
      CleanAndFaulty("wan:step=6,site=0,chunk=1,elem=3,bit=22", /*redo=*/true, /*guard=*/false));
  EXPECT_EQ(CountEvents(Site("clean", 0)), 0);
  EXPECT_EQ(CountEvents(Site("clean", 1)), 0);
  EXPECT_EQ(LossColumns(Site("faulty", 1)), LossColumns(Site("clean", 1)));

  for (int s = 0; s < 2; ++s) {
    int across = 0, wan = 0, reproduced = 0;
    for (const auto& e : Events(Site("faulty", s), 6)) {
      if (e["detector"] == "fingerprint") {
        EXPECT_EQ(e["across"], "sites") << e.dump();
        EXPECT_FALSE(e["majority"].get<bool>());
        ++across;
      }
      if (e["detector"] == "replay" && e["verdict"] == "transient") {
        EXPECT_EQ(e["site"], 1) << e.dump();  // the site that took the payload
        EXPECT_EQ(e["op"], "wan");
        EXPECT_EQ(e["run"], "first");
        EXPECT_FALSE(e["what"].get<std::string>().empty());
        ++wan;
      }
      if (e["detector"] == "replay" && e["verdict"] == "reproduced") ++reproduced;
    }
    EXPECT_GE(across, 2) << "site " << s;  // both sites named, for a tensor at least
    EXPECT_EQ(wan, s == 1 ? 1 : 0) << "site " << s;
    EXPECT_EQ(reproduced, s == 0 ? 1 : 0) << "site " << s;  // site 0's own runs agreed
    EXPECT_EQ(CountEvents(Site("faulty", s)), int(Events(Site("faulty", s), 6).size()));
  }
}

// The sites' fingerprints on their own (every other detector off, one replica per site): the
// same payload is still found, on both sites, in its step.
TEST_F(SitesSdcTest, FingerprintsAloneCompareTheSites) {
  RunConfig c = cfg_;
  c.sdc.guard = c.sdc.memory = false;
  c.faults.inject = "wan:step=6,site=0,chunk=1,elem=3,bit=22";
  ASSERT_TRUE(RunSites(c, "fingerprints").ok());
  for (int s = 0; s < 2; ++s) {
    const auto events = Events(Site("fingerprints", s), 6);
    ASSERT_FALSE(events.empty()) << "site " << s;
    EXPECT_EQ(events[0]["detector"], "fingerprint") << events[0].dump();
    EXPECT_EQ(events[0]["across"], "sites") << events[0].dump();
  }
}

// An exponent bit of site 0's reduce-scatter half reaches both sites through the sum: their
// fingerprints agree, the guard sees it, both sites replay and both name the WAN.
TEST_F(SitesSdcTest, APayloadSummedIntoBothSitesIsFoundByTheGuardAndReplayedAway) {
  ASSERT_TRUE(
      CleanAndFaulty("wan:step=9,site=0,chunk=0,elem=1,bit=30", /*redo=*/true, /*guard=*/true));
  for (int s = 0; s < 2; ++s) {
    bool guard = false, fingerprint = false, wan = false;
    for (const auto& e : Events(Site("faulty", s), 9)) {
      guard |= e["detector"] == "guard";
      fingerprint |= e["detector"] == "fingerprint";
      wan |= e["detector"] == "replay" && e["op"] == "wan" && e["site"] == s;
    }
    EXPECT_TRUE(guard) << "site " << s;
    EXPECT_FALSE(fingerprint) << "site " << s;
    EXPECT_TRUE(wan) << "site " << s;
  }
}

// With sdc.checksums each site's gradient checksum records cross the WAN with the losses and are
// summed with the gradient: a low exponent bit of the reduce-scatter half, summed into both
// sites alike (no fingerprint or guard sees it), fails the reduced gradient's checksum on both
// sites in its step; both replay, the replays name the WAN, and the run ends bitwise clean. A
// clean run with the checksums raises nothing.
TEST_F(SitesSdcTest, TheGradientChecksumCrossesTheWan) {
  cfg_.sdc.checksums = true;
  ASSERT_TRUE(
      CleanAndFaulty("wan:step=8,site=0,chunk=0,elem=5,bit=23", /*redo=*/true, /*guard=*/false));
  for (int s = 0; s < 2; ++s) {
    EXPECT_EQ(CountEvents(Site("clean", s)), 0) << "site " << s;
    bool checksum = false, fingerprint = false, wan = false;
    for (const auto& e : Events(Site("faulty", s), 8)) {
      checksum |= e["detector"] == "checksum" && e["op"] == "grad" && e["site"] == s;
      fingerprint |= e["detector"] == "fingerprint";
      wan |= e["detector"] == "replay" && e["op"] == "wan" && e["site"] == s;
    }
    EXPECT_TRUE(checksum) << "site " << s;
    EXPECT_FALSE(fingerprint) << "site " << s;
    EXPECT_TRUE(wan) << "site " << s;
  }
}

// A gradient flipped on one site after the WAN sum is that site's own: the replay names "grad"
// there, not the WAN, and the run ends with the clean run's bits.
TEST_F(SitesSdcTest, AGradientFlippedAfterTheWanIsNotBlamedOnIt) {
  ASSERT_TRUE(CleanAndFaulty("grad:step=5,site=1,elem=40,bit=22", /*redo=*/true, /*guard=*/false));
  int grad = 0;
  for (int s = 0; s < 2; ++s)
    for (const auto& e : Events(Site("faulty", s), 5))
      if (e["detector"] == "replay" && e["verdict"] == "transient") {
        EXPECT_EQ(e["op"], "grad") << e.dump();
        EXPECT_EQ(e["site"], 1) << e.dump();
        ++grad;
      }
  EXPECT_EQ(grad, 1);
}

// With one rank per site the sites are each other's peers: an audit of a clean step is confirmed
// by the other sites' executions of its micro-batches and changes nothing (the run ends as the
// unaudited one); a stuck core on site 1 of three repeats its fault in its own replay, and the
// other two sites' executions name site 1; every site stops at that step. A fault of the check
// itself is transient.
TEST_F(SitesSdcTest, TheSitesRecomputeEachOthersMicroBatches) {
  RunConfig c = cfg_;
  ASSERT_TRUE(RunSites(c, "plain").ok());
  c.sdc.audit_every = 3;
  ASSERT_TRUE(RunSites(c, "audited").ok());
  EXPECT_EQ(Final("audited"), Final("plain"));
  int confirmed = 0;
  for (int s = 0; s < 2; ++s)
    for (const auto& m : Metrics(Site("audited", s)))
      if (m.contains("sdc"))
        for (const auto& e : m["sdc"]) {
          EXPECT_EQ(e["verdict"], "reproduced") << e.dump();
          EXPECT_EQ(e["peers"], "agree") << e.dump();
          ++confirmed;
        }
  EXPECT_EQ(confirmed, 2 * 4);  // steps 3, 6, 9, 12 on both sites

  c.world.sites = 3;
  c.train.batch_size = 6;  // one micro-batch per site
  c.sdc.audit_every = 1;
  c.faults.inject = "bad_core:step=5,site=1,layer=1,gemm=2,p=1,bit=27,stuck=1";
  const Status st = RunSites(c, "stuck");
  EXPECT_FALSE(st.ok());
  for (int s = 0; s < 3; ++s) {
    const auto events = Events(Site("stuck", s), 5);
    auto faulty = [](const nlohmann::json& e) {
      return e["detector"] == "replay" && e["verdict"] == "faulty_rank";
    };
    EXPECT_EQ(std::count_if(events.begin(), events.end(), faulty), 1) << "site " << s;
    const auto named = std::find_if(events.begin(), events.end(), faulty);
    ASSERT_NE(named, events.end()) << "site " << s;
    EXPECT_EQ((*named)["site"], 1) << named->dump();
    EXPECT_EQ((*named)["across"], "sites") << named->dump();
    EXPECT_EQ((*named)["majority"], true) << named->dump();
    EXPECT_EQ((*named)["layer"], 1) << named->dump();
    EXPECT_EQ((*named)["op"], "gemm_fwd 2") << named->dump();
    EXPECT_EQ((*named)["what"], "micro-batches of site 1") << named->dump();
    EXPECT_EQ(Metrics(Site("stuck", s)).back()["step"], 5) << "site " << s;
  }

  // A fault that strikes only site 1's execution of site 2's micro-batch (micro-batch 2) in the
  // peer check: site 1 runs it again, gets the majority's result, and is not named; the event
  // says so (transient, site 1, run "peer check") and the run ends as a clean one.
  c.faults.inject = "";
  ASSERT_TRUE(RunSites(c, "clean3").ok());
  c.faults.inject = "gemm_fwd:step=5,site=1,layer=1,gemm=2,micro=2,bit=27";
  ASSERT_TRUE(RunSites(c, "check").ok());
  EXPECT_EQ(Final("check"), Final("clean3"));
  for (int s = 0; s < 3; ++s) {
    const auto events = Events(Site("check", s), 5);
    const auto transient = std::find_if(events.begin(), events.end(), [](const nlohmann::json& e) {
      return e["verdict"] == "transient";
    });
    ASSERT_NE(transient, events.end()) << "site " << s;
    EXPECT_EQ((*transient)["site"], 1) << transient->dump();
    EXPECT_EQ((*transient)["rank"], 0) << transient->dump();
    EXPECT_EQ((*transient)["run"], "peer check") << transient->dump();
    EXPECT_EQ((*transient)["across"], "sites") << transient->dump();
  }
}

// sdc.on_faulty = exclude: the stuck core on site 2 of three is named by the other two at step 5;
// site 2 leaves the world, sites 0 and 1 compute step 5 again from its start with site 2's
// micro-batch and go on, and the run ends with the bits of the clean run (reproducible mode).
TEST_F(SitesSdcTest, AFaultySiteLeavesAndTheOthersEndWithTheCleanBits) {
  RunConfig c = cfg_;
  c.world.sites = 3;
  c.train.batch_size = 6;  // one micro-batch per site
  c.parallel.reproducible = true;
  c.world.heartbeat_s = 0.2;
  c.sdc.audit_every = 1;
  c.sdc.on_faulty = "exclude";
  ASSERT_TRUE(RunSites(c, "clean").ok());
  c.faults.inject = "bad_core:step=5,site=2,layer=1,gemm=2,p=1,bit=27,stuck=1";
  const Status st = TrainLocalWorld(c, root_ + "/excluded", {.coordinator = true, .lose = {}});
  ASSERT_TRUE(st.ok()) << st.ToString();
  EXPECT_EQ(Final("excluded"), Final("clean"));
  EXPECT_EQ(Metrics(Site("excluded", 2)).back()["step"], 5);
  for (int s = 0; s < 2; ++s) {
    const auto metrics = Metrics(Site("excluded", s));
    ASSERT_EQ(metrics.size(), 14u) << "site " << s;  // step 5 once, with the verdict
    const auto events = Events(Site("excluded", s), 5);
    const auto named = std::find_if(events.begin(), events.end(), [](const nlohmann::json& e) {
      return e["verdict"] == "faulty_rank";
    });
    ASSERT_NE(named, events.end()) << "site " << s;
    EXPECT_EQ((*named)["site"], 2) << named->dump();
  }
  // Without a majority (two sites) nobody can be told faulty: the run stops.
  c.world.sites = 2;
  c.train.batch_size = 4;
  c.faults.inject = "bad_core:step=5,site=1,layer=1,gemm=2,p=1,bit=27,stuck=1";
  const Status two = TrainLocalWorld(c, root_ + "/two", {.coordinator = true, .lose = {}});
  EXPECT_FALSE(two.ok());
  EXPECT_NE(two.message().find("computes wrong results"), std::string::npos) << two.ToString();
}

// A parameter flipped in the memory of a site with one replica is repaired from the other site
// before the step reads it: named by its site, and the run ends with the clean run's bits.
TEST_F(SitesSdcTest, StateAtRestIsRepairedFromAnotherSite) {
  ASSERT_TRUE(
      CleanAndFaulty("param:step=7,site=1,elem=100,bit=30;moment:step=9,site=0,moment=v,bit=29",
                     /*redo=*/false, /*guard=*/true));
  auto repaired = [&](int site, int step) {
    for (const auto& e : Events(Site("faulty", site), step))
      if (e["detector"] == "memory" && e["verdict"] == "repaired" &&
          e.value("source_site", -1) == 1 - site)
        return true;
    return false;
  };
  EXPECT_TRUE(repaired(1, 7));
  EXPECT_TRUE(repaired(0, 9));
}

// Without the WAN transport (an in-process WAN) a wan fault cannot strike: refused up front.
TEST_F(SitesSdcTest, AWanFaultNeedsTheTransport) {
  RunConfig c = cfg_;
  c.faults.inject = "wan:step=2,site=0";  // site 1 refuses too: no one waits for site 0
  const auto st = RunInProcessRanks(2, [&](Communicator& wan) -> Status {
    TrainOptions o;
    o.out_dir = fmt::format("{}/x/site-{}", root_, wan.rank());
    o.progress = false;
    o.world.site = wan.rank();
    o.world.wan = &wan;
    return Train(c, o).status();
  });
  for (const Status& s : st) {
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("a wan fault needs the WAN transport"), std::string::npos)
        << s.ToString();
  }
}

}  // namespace
}  // namespace atl
