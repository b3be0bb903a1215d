// Audit replay in real training runs (train/sdc/audit.h): with sdc.on_alarm = redo, transient
// faults that the detectors flag are replayed away and the run ends bitwise equal to a clean
// one, each located to its micro-batch, block and op; sdc.audit_every replays clean steps
// (reproduced) and finds a flip too small for any detector; a data-parallel replica's fault is
// located on that replica, not on the replicas that received it through the reduction; state at
// rest (a fingerprint mismatch without memory checks) is not replayed, a replica that computed a
// step differently is; a rank that corrupts every run stops the run; GEMM checksums.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "train/test_util.h"

namespace atl {
namespace {

class ReplayTrainTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    cfg_.train.steps = 30;
    cfg_.train.grad_clip = 0;  // no clipping to hide a flip
  }
  // The run's replay events by step (1-based), each with its metrics line's step.
  static std::multimap<int, nlohmann::json> Replays(const std::string& dir) {
    const auto events = SdcEvents(dir, "replay");
    return std::multimap<int, nlohmann::json>(events.begin(), events.end());
  }
};

// Four transient faults of four kinds, each flipping an exponent bit the guard sees: every one is
// replayed away, located, and the run ends with the clean run's parameters, optimizer state and
// losses, bit for bit.
TEST_F(ReplayTrainTest, TransientFaultsAreReplayedAwayBitwise) {
  const std::string clean = Run(cfg_, "clean");
  RunConfig c = cfg_;
  c.sdc.on_alarm = "redo";
  c.faults.inject =
      "gemm_fwd:step=12,layer=1,gemm=3,micro=1,bit=30;gemm_bwd:step=16,layer=0,gemm=0,bit=30;"
      "activation:step=20,layer=1,bit=30;grad:step=24,elem=7,bit=30";
  const std::string dir = Run(c, "faulty");
  EXPECT_EQ(FinalState(dir), FinalState(clean));
  EXPECT_EQ(LossColumns(dir), LossColumns(clean));

  const auto replays = Replays(dir);
  ASSERT_EQ(replays.size(), 4u);
  auto at = [&](int step) {
    EXPECT_EQ(replays.count(step), 1u) << "step " << step;
    return replays.count(step) ? replays.find(step)->second : nlohmann::json();
  };
  for (const auto& [step, e] : replays) {
    EXPECT_EQ(e["verdict"], "transient") << e.dump();
    EXPECT_EQ(e["run"], "first") << e.dump();  // the third run matched the replay
    EXPECT_EQ(e["site"], 0);
    EXPECT_EQ(e["rank"], 0);
  }
  EXPECT_EQ(at(12)["micro"], 1);
  EXPECT_EQ(at(12)["layer"], 1);
  EXPECT_EQ(at(12)["op"], "gemm_fwd 3");
  EXPECT_EQ(at(16)["micro"], 0);  // the rank's first micro-batch
  EXPECT_EQ(at(16)["layer"], 0);
  EXPECT_EQ(at(16)["op"], "gemm_bwd 0");
  EXPECT_EQ(at(20)["layer"], 1);
  EXPECT_EQ(at(20)["op"], "activation");
  EXPECT_EQ(at(24)["op"], "grad");
  EXPECT_FALSE(at(24).contains("micro"));
  EXPECT_EQ(at(24)["what"], "wte.weight");  // element 7 of the flat buffer
  // The first execution's alarm comes before the verdict in the same line.
  for (const auto& m : Metrics(dir)) {
    if (m.contains("sdc")) {
      EXPECT_EQ(m["sdc"][0]["detector"], "guard") << m.dump();
    }
  }
}

// sdc.audit_every = 5: clean steps replay identically ("reproduced", nothing else changes); a
// mantissa flip too small for the guard (no alarm) is found by the audit of its step, located,
// and replayed away, so the run still ends as the clean one.
TEST_F(ReplayTrainTest, AuditsReproduceCleanStepsAndFindWhatTheGuardCannot) {
  const std::string clean = Run(cfg_, "clean");
  RunConfig c = cfg_;
  c.sdc.audit_every = 5;
  const std::string audited = Run(c, "audited");
  EXPECT_EQ(FinalState(audited), FinalState(clean));
  auto replays = Replays(audited);
  ASSERT_EQ(replays.size(), 6u);  // steps 5, 10, ..., 30
  for (const auto& [step, e] : replays) {
    EXPECT_EQ(step % 5, 0);
    EXPECT_EQ(e["verdict"], "reproduced") << e.dump();
    EXPECT_EQ(e["rank"], -1);
  }

  c.faults.inject = "gemm_fwd:step=10,layer=0,gemm=1,micro=1,bit=2";
  const std::string dir = Run(c, "faulty");
  EXPECT_EQ(FinalState(dir), FinalState(clean));
  replays = Replays(dir);
  ASSERT_EQ(replays.size(), 6u);
  const nlohmann::json& e = replays.find(10)->second;
  EXPECT_EQ(e["verdict"], "transient") << e.dump();
  EXPECT_EQ(e["micro"], 1);
  EXPECT_EQ(e["layer"], 0);
  EXPECT_EQ(e["op"], "gemm_fwd 1");
  for (const auto& m : Metrics(dir)) {  // the guard saw nothing
    if (!m.contains("sdc")) continue;
    for (const auto& ev : m["sdc"]) EXPECT_EQ(ev["detector"], "replay") << ev.dump();
  }
}

// Two data-parallel replicas (in-process ranks): a backward GEMM fault on replica 1 reaches
// replica 0's gradients through the all-reduce, but the replay names only replica 1, where the
// computation differed; the run ends as the clean dp 2 run does. With ZeRO-1 too.
TEST_F(ReplayTrainTest, AReplicasFaultIsLocatedOnThatReplica) {
  for (bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "zero" : "replicated");
    RunConfig c = cfg_;
    c.parallel.dp = 2;
    c.parallel.zero = zero;
    c.train.threads = 1;
    const std::string clean = root_ + "/dp2clean", dir = root_ + "/dp2faulty";
    ASSERT_TRUE(RunRanks(c, 2, clean));
    c.sdc.on_alarm = "redo";
    c.faults.inject = "gemm_bwd:step=15,rank=1,layer=1,gemm=2,bit=30";
    ASSERT_TRUE(RunRanks(c, 2, dir));
    EXPECT_EQ(FinalState(dir), FinalState(clean));
    const auto replays = Replays(dir);
    ASSERT_EQ(replays.size(), 1u);
    const nlohmann::json& e = replays.begin()->second;
    EXPECT_EQ(replays.begin()->first, 15);
    EXPECT_EQ(e["verdict"], "transient") << e.dump();
    EXPECT_EQ(e["rank"], 1);
    EXPECT_EQ(e["micro"], 1);  // replica 1's micro-batch of the batch of 2
    EXPECT_EQ(e["layer"], 1);
    EXPECT_EQ(e["op"], "gemm_bwd 2");
  }
}

// Without memory checks, a replica's parameter flipped in memory between steps (state at rest)
// is the fingerprints' to see; a replay would start from the same corrupt state, so redo does not
// replay for it (not at that step, and not at every step after it while the replicas stay apart).
// With them (the default), a gradient flipped after the reduction on one replica is: the
// replicas started the step equal, the mismatch after it is replayed, found on that replica and
// undone, bitwise.
TEST_F(ReplayTrainTest, FingerprintMismatchesAreNotReplayed) {
  RunConfig c = cfg_;
  c.parallel.dp = 3;
  c.train.batch_size = 6;
  c.train.threads = 1;
  c.sdc.on_alarm = "redo";
  c.faults.inject = "param:step=10,rank=1,elem=0,bit=3";
  c.sdc.memory = false;  // (which would repair it: sdc_train_test)
  const std::string dir = root_ + "/dp3";
  ASSERT_TRUE(RunRanks(c, 3, dir));
  int fingerprint_steps = 0;
  for (const auto& m : Metrics(dir)) {
    if (!m.contains("sdc")) continue;
    for (const auto& e : m["sdc"]) EXPECT_NE(e["detector"], "replay") << m.dump();
    fingerprint_steps += m["sdc"][0]["detector"] == "fingerprint";
  }
  EXPECT_EQ(fingerprint_steps, 21);  // steps 10..30: replica 1 stays apart

  RunConfig plain = cfg_;
  plain.parallel.dp = 3;
  plain.train.batch_size = 6;
  plain.train.threads = 1;
  const std::string clean = root_ + "/clean";
  ASSERT_TRUE(RunRanks(plain, 3, clean));
  RunConfig g = plain;
  g.sdc.on_alarm = "redo";
  g.sdc.guard = false;                                    // the fingerprints alone
  g.faults.inject = "grad:step=12,rank=2,elem=5,bit=12";  // a small change: no guard would see it
  const std::string flipped = root_ + "/grad";
  ASSERT_TRUE(RunRanks(g, 3, flipped));
  EXPECT_EQ(FinalState(flipped), FinalState(clean));
  const auto replays = Replays(flipped);
  ASSERT_EQ(replays.size(), 1u);
  const auto& [step, e] = *replays.begin();
  EXPECT_EQ(step, 12);
  EXPECT_EQ(e["verdict"], "transient");
  EXPECT_EQ(e["rank"], 2);
  EXPECT_EQ(e["op"], "grad");
  EXPECT_EQ(e["what"], "wte.weight");
}

// A bad core corrupts the replay as well: the run stops naming the step instead of taking a
// result no execution agrees with.
TEST_F(ReplayTrainTest, ARankThatCorruptsTheReplayTooStopsTheRun) {
  RunConfig c = cfg_;
  c.sdc.on_alarm = "redo";
  c.faults.inject = "bad_core:step=12,p=1";
  auto r = TryRun(c, "bad_core");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("keeps computing wrong results"), std::string::npos)
      << r.status().ToString();
  EXPECT_LT(Metrics(root_ + "/bad_core").size(), 30u);
}

}  // namespace
}  // namespace atl

namespace atl {
namespace {

// GEMM checksums (sdc.checksums): they change nothing in a clean run and raise nothing; they
// catch a flip of the lowest exponent bit of a GEMM product, a block output (the residual add's
// checksum) or the reduced gradient (its segment sums) in the step it strikes, even during the
// guard's warm-up, name its micro-batch, block and op (or the gradient's tensor), and the replay
// undoes it bitwise.
TEST_F(ReplayTrainTest, ChecksumsFindSmallGemmFlipsInTheirStep) {
  const std::string plain = Run(cfg_, "plain");
  RunConfig c = cfg_;
  c.sdc.on_alarm = "redo";
  c.sdc.checksums = true;
  const std::string clean = Run(c, "clean");
  EXPECT_EQ(FinalState(clean), FinalState(plain));
  for (const auto& m : Metrics(clean)) EXPECT_FALSE(m.contains("sdc")) << m.dump();

  // Element 7 is in wte, 1100 in wpe: a gradient flip names its tensor.
  c.faults.inject =
      "gemm_fwd:step=3,layer=1,gemm=2,micro=1,bit=23;grad:step=8,elem=7,bit=23;gemm_bwd:step=14,"
      "layer=0,gemm=1,bit=24;activation:step=20,layer=0,micro=1,bit=23;grad:step=26,elem=1100,"
      "bit=31";
  const std::string dir = Run(c, "faulty");
  EXPECT_EQ(FinalState(dir), FinalState(plain));
  std::map<int, std::vector<nlohmann::json>> by_step;
  for (const auto& m : Metrics(dir))
    if (m.contains("sdc"))
      for (const auto& e : m["sdc"]) by_step[m["step"].get<int>()].push_back(e);
  ASSERT_EQ(by_step.size(), 5u);
  auto checksum = [&](int step) {
    for (const auto& e : by_step[step])
      if (e["detector"] == "checksum") return e;
    ADD_FAILURE() << "no checksum event at step " << step;
    return nlohmann::json();
  };
  const nlohmann::json fwd = checksum(3), bwd = checksum(14);
  EXPECT_EQ(fwd["op"], "gemm_fwd 2");
  EXPECT_EQ(fwd["layer"], 1);
  EXPECT_EQ(fwd["micro"], 1);
  EXPECT_EQ(fwd["count"], 1);  // the flip does not reach another GEMM's check...
  EXPECT_EQ(bwd["op"], "gemm_bwd 1");
  EXPECT_EQ(bwd["layer"], 0);
  EXPECT_EQ(bwd["micro"], 0);
  // A block output's lowest exponent bit: the residual add's checksum.
  const nlohmann::json act = checksum(20);
  EXPECT_EQ(act["op"], "activation");
  EXPECT_EQ(act["layer"], 0);
  EXPECT_EQ(act["micro"], 1);
  // The reduced gradient's checksum: the tensor, no micro-batch.
  const nlohmann::json g1 = checksum(8), g2 = checksum(26);
  EXPECT_EQ(g1["op"], "grad");
  EXPECT_EQ(g1["what"], "wte.weight");
  EXPECT_EQ(g1["micro"], -1);
  EXPECT_EQ(g2["op"], "grad");
  EXPECT_EQ(g2["what"], "wpe.weight");
  for (int step : {3, 8, 14, 20, 26}) {  // ... and the replay finds the same place
    const auto& events = by_step[step];
    ASSERT_FALSE(events.empty());
    const auto r = std::find_if(events.begin(), events.end(),
                                [](const auto& e) { return e["detector"] == "replay"; });
    ASSERT_NE(r, events.end());
    EXPECT_EQ((*r)["verdict"], "transient");
    EXPECT_EQ((*r)["op"], checksum(step)["op"]);
  }
}

// Every checksum (GEMMs, residual adds, the reduced gradient) and the guard stay quiet on clean
// runs of every layout: float and fixed-point reductions, ZeRO, no overlap, pipeline stages with
// the tied wte's two halves, tensor parallel, gradient accumulation.
TEST_F(ReplayTrainTest, TheChecksumsRaiseNothingOnCleanRuns) {
  struct Layout {
    const char* name;
    int dp, tp, pp;
    bool zero, reproducible, overlap;
  };
  for (const Layout& l :
       {Layout{"dp2", 2, 1, 1, false, false, true}, Layout{"dp2-zero", 2, 1, 1, true, false, true},
        Layout{"dp2-no-overlap", 2, 1, 1, false, false, false},
        Layout{"pp2", 1, 1, 2, false, false, true},
        Layout{"pp2-reproducible", 1, 1, 2, false, true, true},
        Layout{"tp2", 1, 2, 1, false, false, true},
        Layout{"dp2-pp2-reproducible", 2, 1, 2, false, true, true}}) {
    SCOPED_TRACE(l.name);
    RunConfig c = cfg_;
    c.parallel.dp = l.dp;
    c.parallel.tp = l.tp;
    c.parallel.pp = l.pp;
    c.parallel.zero = l.zero;
    c.parallel.reproducible = l.reproducible;
    c.parallel.overlap = l.overlap;
    c.train.batch_size = 8;  // two micro-batches per replica: accumulation
    c.train.threads = 1;
    c.sdc.checksums = true;
    c.sdc.on_alarm = "redo";
    const std::string dir = root_ + "/" + l.name;
    ASSERT_TRUE(RunRanks(c, l.dp * l.tp * l.pp, dir));
    for (const auto& m : Metrics(dir)) EXPECT_FALSE(m.contains("sdc")) << m.dump();
  }
}

// The gradient checksum carried through the data-parallel reduction: with ZeRO in the
// reproducible mode (a fixed-point reduce-scatter), a clean run raises nothing; a flip of one
// replica's reduced shard is found on that replica in its step and replayed away bitwise.
TEST_F(ReplayTrainTest, TheGradientChecksumFollowsTheReduction) {
  RunConfig c = cfg_;
  c.parallel.dp = 2;
  c.parallel.zero = true;
  c.parallel.reproducible = true;
  c.sdc.on_alarm = "redo";
  c.sdc.checksums = true;
  c.train.threads = 1;
  const std::string clean = root_ + "/dp2clean", dir = root_ + "/dp2faulty";
  ASSERT_TRUE(RunRanks(c, 2, clean));
  for (const auto& m : Metrics(clean)) EXPECT_FALSE(m.contains("sdc")) << m.dump();
  c.faults.inject = "grad:step=10,rank=1,elem=100,bit=24";
  ASSERT_TRUE(RunRanks(c, 2, dir));
  EXPECT_EQ(FinalState(dir), FinalState(clean));
  int found = 0;
  for (const auto& m : Metrics(dir))
    if (m.contains("sdc"))
      for (const auto& e : m["sdc"]) {
        EXPECT_EQ(m["step"], 10) << e.dump();
        EXPECT_EQ(e["rank"], 1) << e.dump();
        EXPECT_EQ(e["op"], "grad") << e.dump();
        found += e["detector"] == "checksum";
      }
  EXPECT_EQ(found, 1);
}

}  // namespace
}  // namespace atl
