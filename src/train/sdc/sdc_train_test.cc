// Faults and detectors in real training runs: each fault kind strikes the step it names, the
// guard flags a corrupted gradient and stays quiet on clean runs, fingerprints name the corrupt
// data-parallel replica, and sdc.on_alarm = stop ends the run.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "train/test_util.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

class SdcTrainTest : public TrainerTest {
 protected:
  // Every sdc event of the run, in step order, with its metrics line's step.
  static std::vector<nlohmann::json> Events(const std::string& dir) {
    std::vector<nlohmann::json> out;
    for (const auto& m : Metrics(dir))
      if (m.contains("sdc"))
        for (auto e : m["sdc"]) {
          EXPECT_FALSE(e.contains("step"));  // one "step" per line, for scripts that grep it
          e["step"] = m["step"];
          out.push_back(e);
        }
    return out;
  }
};

// [faults]: each kind strikes the step it names (the metrics match the clean run's before it and
// differ from it on), and every flip is logged to faults.jsonl with where it struck.
TEST_F(SdcTrainTest, InjectedFaultsStrikeTheirStepAndAreLogged) {
  RunConfig no_clip = cfg_;
  no_clip.train.grad_clip = 0;  // no clipping to hide the flip
  const std::vector<std::string> base = LossColumns(Run(no_clip, "base"));
  for (const char* spec :
       {"param:step=6,elem=100,bit=30", "grad:step=6,elem=7,bit=30",
        "gemm_fwd:step=6,layer=1,gemm=3,bit=30,micro=1", "gemm_bwd:step=6,layer=0,gemm=0,bit=30",
        "activation:step=6,layer=1,bit=30", "moment:step=6,moment=m,bit=30"}) {
    SCOPED_TRACE(spec);
    RunConfig c = no_clip;
    c.faults.inject = spec;
    const std::string dir = root_ + "/faulty";
    fs::remove_all(dir);
    auto r = TryRun(c, "faulty");
    const std::vector<std::string> got = LossColumns(dir);
    // The steps before the fault are the clean run's, bit for bit.
    ASSERT_GE(got.size(), 5u);
    for (size_t i = 0; i < 5; ++i) EXPECT_EQ(got[i], base[i]) << "step " << i + 1;
    if (r.ok()) {
      ASSERT_EQ(got.size(), base.size());
      EXPECT_NE(got, base);
    } else {  // a flip to a huge value may make the run diverge: at the fault's step or after it
      EXPECT_NE(r.status().message().find("diverged at step"), std::string::npos)
          << r.status().ToString();
      EXPECT_GE(got.size(), 5u);
    }
    const std::string log = Bytes(dir + "/faults.jsonl");
    const auto j = nlohmann::json::parse(log.substr(0, log.find('\n')));
    EXPECT_EQ(j["step"], 6);
    EXPECT_EQ(j["bit"], 30);
    EXPECT_EQ(j["kind"], std::string(spec).substr(0, std::string(spec).find(':')));
    if (std::string(spec).find("micro=1") != std::string::npos) {
      EXPECT_EQ(j["micro"], 1);
    }
    EXPECT_EQ(std::count(log.begin(), log.end(), '\n'), 1);
  }
  EXPECT_EQ(LossColumns(Run(no_clip, "clean2")), base);  // nothing left behind
}

TEST_F(SdcTrainTest, TheGuardFlagsACorruptedGradientAndIsQuietOnCleanRuns) {
  RunConfig c = cfg_;
  c.train.steps = 30;
  EXPECT_TRUE(Events(Run(c, "clean")).empty());
  RunConfig micro1 = c;
  micro1.train.micro_batch_size = 1;  // another schedule, also clean
  EXPECT_TRUE(Events(Run(micro1, "clean_micro1")).empty());
  // An exponent bit of one gradient element: the norm jumps by many orders of magnitude.
  c.faults.inject = "grad:step=20,elem=7,bit=30";
  const std::string dir = Run(c, "faulty");
  const auto events = Events(dir);
  ASSERT_FALSE(events.empty());
  EXPECT_EQ(events[0]["step"], 20);
  EXPECT_EQ(events[0]["detector"], "guard");
  bool norm = false;
  for (const auto& e : events) norm |= e["step"] == 20 && e["what"] == "grad_norm";
  EXPECT_TRUE(norm);
  EXPECT_EQ(events[0]["rank"], -1);  // a signal every rank shares
  // The events log holds the same findings, a line each, with the step and "event": "sdc"; a
  // clean run's is empty.
  std::vector<nlohmann::json> logged;
  std::ifstream in(dir + "/events.jsonl");
  for (std::string line; std::getline(in, line);) logged.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(logged.size(), events.size());
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(logged[i]["event"], "sdc");
    logged[i].erase("event");
    EXPECT_EQ(logged[i], events[i]);
  }
  EXPECT_EQ(Bytes(root_ + "/clean/events.jsonl"), "");
}

TEST_F(SdcTrainTest, OnAlarmStopEndsTheRunNamingTheStep) {
  RunConfig c = cfg_;
  c.train.steps = 30;
  c.sdc.on_alarm = "stop";
  c.faults.inject = "grad:step=20,elem=7,bit=30";
  auto r = TryRun(c, "stop");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("silent data corruption suspected at step 20"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(Metrics(root_ + "/stop").size(), 19u);  // the alarmed step is not reported as done
}

// Three data-parallel replicas (in-process ranks): a flipped low mantissa bit of one parameter
// on replica 1 (past the guard's warmup, and too small for it: no guard event) is named by the
// fingerprints at that step, with the tensor; with ZeRO too.
TEST_F(SdcTrainTest, FingerprintsNameTheCorruptReplica) {
  for (bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "zero" : "replicated");
    RunConfig c = cfg_;
    c.parallel.zero = zero;
    c.train.batch_size = 6;
    c.train.micro_batch_size = 2;
    c.parallel.dp = 3;
    c.train.threads = 1;
    c.faults.inject = "param:step=10,rank=1,elem=0,bit=3";
    c.sdc.memory = false;  // (which would find and repair it before the step: below)
    const std::string dir = root_ + (zero ? "/dp3zero" : "/dp3");
    ASSERT_TRUE(RunRanks(c, 3, dir));
    const auto events = Events(dir);
    ASSERT_FALSE(events.empty());
    EXPECT_EQ(events[0]["step"], 10);
    EXPECT_EQ(events[0]["detector"], "fingerprint");
    EXPECT_EQ(events[0]["rank"], 1);
    EXPECT_EQ(events[0]["what"], "params:wte.weight");
    EXPECT_EQ(events[0]["majority"], true);
    for (const auto& e : events) EXPECT_EQ(e["detector"], "fingerprint") << e.dump();
  }
}

// Memory checks (sdc.memory, on by default): a parameter or moment flipped at rest, even its
// lowest bit, is found by its own rank at the start of the step it would first be used in and
// named with the tensor; a data-parallel replica's copy repairs it, so the run ends bitwise equal
// to the clean run (ZeRO: parameters repaired, a moment shard only named); alone (dp 1) it is
// named, not repaired.
TEST_F(SdcTrainTest, MemoryChecksFindAndRepairStateFlippedAtRest) {
  for (bool zero : {false, true}) {
    SCOPED_TRACE(zero ? "zero" : "replicated");
    RunConfig c = cfg_;
    c.parallel.zero = zero;
    c.parallel.dp = 2;
    c.parallel.reproducible = true;
    c.train.threads = 1;
    const std::string clean = root_ + (zero ? "/clean-zero" : "/clean");
    ASSERT_TRUE(RunRanks(c, 2, clean));
    EXPECT_TRUE(Events(clean).empty());
    c.faults.inject = "param:step=6,rank=1,elem=0,bit=0;moment:step=9,rank=0,moment=v,elem=5,bit=2";
    const std::string dir = root_ + (zero ? "/flipped-zero" : "/flipped");
    ASSERT_TRUE(RunRanks(c, 2, dir));
    const auto events = Events(dir);
    ASSERT_EQ(events.size(), 2u) << nlohmann::json(events).dump();
    EXPECT_EQ(events[0]["step"], 6);
    EXPECT_EQ(events[0]["detector"], "memory");
    EXPECT_EQ(events[0]["rank"], 1);
    EXPECT_EQ(events[0]["what"], "params:wte.weight");
    EXPECT_EQ(events[0]["verdict"], "repaired");
    EXPECT_EQ(events[0]["source"], 0);
    EXPECT_EQ(events[1]["step"], 9);
    EXPECT_EQ(events[1]["rank"], 0);
    EXPECT_EQ(events[1]["what"], zero ? "moment_v:shard" : "moment_v:wte.weight");
    EXPECT_EQ(events[1]["verdict"], zero ? "not repaired" : "repaired");
    if (!zero) {
      EXPECT_EQ(events[1]["source"], 1);
      EXPECT_EQ(FinalState(dir), FinalState(clean));
    }
  }
  // A repaired flip does not stop a run with on_alarm = stop (it is as if it never happened).
  RunConfig stop = cfg_;
  stop.parallel.dp = 2;
  stop.train.threads = 1;
  stop.sdc.on_alarm = "stop";
  stop.faults.inject = "param:step=4,rank=1,elem=9,bit=30";
  ASSERT_TRUE(RunRanks(stop, 2, root_ + "/stop"));
  EXPECT_EQ(Events(root_ + "/stop").size(), 1u);
  // Alone: named, not repaired; the state is sealed before the first step too.
  RunConfig one = cfg_;
  one.faults.inject = "param:step=1,elem=3,bit=5;param:step=6,elem=40,bit=1";
  const auto events = Events(Run(one, "one"));
  ASSERT_EQ(events.size(), 2u) << nlohmann::json(events).dump();
  EXPECT_EQ(events[0]["step"], 1);
  EXPECT_EQ(events[1]["step"], 6);
  for (const auto& e : events) {
    EXPECT_EQ(e["detector"], "memory");
    EXPECT_EQ(e["verdict"], "not repaired");
    EXPECT_EQ(e["what"], "params:wte.weight");
  }
}

}  // namespace
}  // namespace atl
