// The peer check of an audit replay (train/sdc/peers.h): the verdict from the replicas' traces,
// and in real data-parallel runs (in-process ranks; replicas of one rank, or of several with tp
// or pp > 1): clean steps are confirmed by other ranks and the run ends bitwise as without
// audits; a stuck core, which its own replay repeats, is named by the other ranks (dp 3: the
// rank; dp 2: both ranks) and stops the run.
#include <gtest/gtest.h>

#include <set>

#include "train/sdc/peers.h"
#include "train/test_util.h"

namespace atl {
namespace {

// A trace of two micro-batches (first_micro, first_micro + 1), two ops each, whose op `bad` (0..3;
// -1: none) computed something else.
StepTrace Trace(int64_t first_micro, int bad = -1) {
  StepTrace t;
  for (int i = 0; i < 4; ++i) {
    t.At(first_micro + i / 2);
    const float out[2] = {float(i % 2), i == bad ? 9.f : 1.f};
    t.OnOp(i % 2 == 0 ? FaultKind::kGemmForward : FaultKind::kActivation, 1, 2, out, 2);
  }
  t.SetLosses({2.5, 2.25}, first_micro);
  return t;
}

// PeerVerdict's events, parsed.
std::vector<nlohmann::json> Verdict(const std::vector<std::vector<uint64_t>>& own,
                                    const std::vector<std::vector<uint64_t>>& next,
                                    const std::vector<std::vector<uint64_t>>& prev,
                                    const StepTrace& layout, const std::vector<int64_t>& first,
                                    int site) {
  std::vector<nlohmann::json> out;
  for (const std::string& e :
       PeerEvents(PeerVerdict(own, next, prev, layout, first, site, 6), site, 6, false))
    out.push_back(nlohmann::json::parse(e));
  return out;
}

TEST(PeerVerdict, TheExecutionOutsideTheMajorityNamesItsRank) {
  const std::vector<int64_t> first = {0, 2, 4};
  auto words = [&](int replica, int bad = -1) {
    return TraceWords(Trace(first[size_t(replica)], bad));
  };
  // own[x], next[x] (x's execution of x+1's micro-batches), prev[x] (of x-1's).
  std::vector<std::vector<uint64_t>> own = {words(0), words(1), words(2)};
  std::vector<std::vector<uint64_t>> next = {words(1), words(2), words(0)};
  std::vector<std::vector<uint64_t>> prev = {words(2), words(0), words(1)};
  const StepTrace layout = Trace(0);  // rank 0's own

  auto agree = Verdict(own, next, prev, layout, first, 0);
  ASSERT_EQ(agree.size(), 1u);
  EXPECT_EQ(agree[0]["verdict"], "reproduced");
  EXPECT_EQ(agree[0]["peers"], "agree");
  EXPECT_EQ(agree[0]["rank"], -1);

  // Rank 1 computes wrong wherever it computes: its own micro-batches (op 3: micro 3's
  // activation) and its neighbours' (rank 0's at op 1, rank 2's at op 2).
  own[1] = words(1, 3);
  next[1] = words(2, 2);
  prev[1] = words(0, 1);
  auto one = Verdict(own, next, prev, layout, first, 1);
  ASSERT_EQ(one.size(), 1u) << one[0].dump();
  EXPECT_EQ(one[0]["verdict"], "faulty_rank");
  EXPECT_EQ(one[0]["detector"], "replay");
  EXPECT_EQ(one[0]["site"], 1);
  EXPECT_EQ(one[0]["rank"], 1);
  EXPECT_EQ(one[0]["majority"], true);
  EXPECT_EQ(one[0]["peer"], 0);  // rank 0's execution of its micro-batches disagreed
  // Named where it first computed its own micro-batches wrong: op 3, micro-batch 3.
  EXPECT_EQ(one[0]["micro"], 3);
  EXPECT_EQ(one[0]["layer"], 1);
  EXPECT_EQ(one[0]["op"], "activation");
  EXPECT_EQ(one[0]["what"], "micro-batches of rank 1");

  // Rank 1 wrong on rank 0's micro-batches only: named where (op 1 of micro-batch 0), with rank 0,
  // whose execution it disagreed with.
  own[1] = words(1);
  next[1] = words(2);
  one = Verdict(own, next, prev, layout, first, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["rank"], 1);
  EXPECT_EQ(one[0]["peer"], 0);
  EXPECT_EQ(one[0]["micro"], 0);
  EXPECT_EQ(one[0]["op"], "activation");
  EXPECT_EQ(one[0]["what"], "micro-batches of rank 0");
  // Rank 1 ran rank 0's micro-batches once: it must repeat that before the verdict stands.
  const auto found = PeerVerdict(own, next, prev, layout, first, 0, 6);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].recomputer, 1);
  EXPECT_EQ(found[0].data_of, 0);

  // A loss that differs and nothing else: op "loss" of its micro-batch.
  prev[1] = words(0);
  std::vector<uint64_t> loss = words(1);
  loss.back() ^= 1;
  next[0] = loss;  // rank 0's execution of rank 1's second micro-batch
  one = Verdict(own, next, prev, layout, first, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["rank"], 0);
  EXPECT_EQ(one[0]["op"], "loss");
  EXPECT_EQ(one[0]["micro"], 3);

  // Three different executions of one replica's micro-batches: no majority.
  next[0] = words(1, 0);
  prev[2] = words(1, 2);
  own[1] = words(1, 1);
  one = Verdict(own, next, prev, layout, first, 0);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]["majority"], false);
  EXPECT_EQ(one[0]["rank"], 1);
}

TEST(PeerVerdict, TwoReplicasThatDisagreeAreBothNamed) {
  const std::vector<int64_t> first = {0, 2};
  std::vector<std::vector<uint64_t>> own = {TraceWords(Trace(0)), TraceWords(Trace(2, 0))};
  std::vector<std::vector<uint64_t>> next = {TraceWords(Trace(2)), TraceWords(Trace(0))};
  const std::vector<std::vector<uint64_t>> prev(2);
  const auto v = Verdict(own, next, prev, Trace(0), first, 0);
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0]["verdict"], "faulty_rank");
  EXPECT_EQ(v[0]["majority"], false);
  EXPECT_EQ(std::set<int>({v[0]["rank"].get<int>(), v[0]["peer"].get<int>()}),
            std::set<int>({0, 1}));
  EXPECT_EQ(v[0]["micro"], 2);
  EXPECT_EQ(v[0]["op"], "gemm_fwd 2");
}

class PeersTrainTest : public TrainerTest {
 protected:
  void SetUp() override {
    TrainerTest::SetUp();
    cfg_.train.steps = 8;
    cfg_.train.threads = 1;
    cfg_.train.grad_clip = 0;
  }
  // The replay events of the run in dir, by step.
  static std::vector<std::pair<int, nlohmann::json>> Replays(const std::string& dir) {
    return SdcEvents(dir, "replay");
  }
  // Runs c on `ranks` ranks without audits and with one every 3 steps: the audited run ends
  // bitwise as the plain one, and its audits (steps 3 and 6) reproduced, the peers agreeing.
  void ExpectCleanAuditsChangeNothing(RunConfig c, int ranks) {
    const std::string plain = root_ + "/plain", audited = root_ + "/audited";
    ASSERT_TRUE(RunRanks(c, ranks, plain));
    c.sdc.audit_every = 3;
    ASSERT_TRUE(RunRanks(c, ranks, audited));
    EXPECT_EQ(FinalState(audited), FinalState(plain));
    EXPECT_EQ(LossColumns(audited), LossColumns(plain));
    const auto replays = Replays(audited);
    ASSERT_EQ(replays.size(), 2u);  // steps 3 and 6
    for (const auto& [step, e] : replays) {
      EXPECT_EQ(step % 3, 0);
      EXPECT_EQ(e["verdict"], "reproduced") << e.dump();
      EXPECT_EQ(e["peers"], "agree") << e.dump();
    }
  }
  // Runs c (audits every step) on `ranks` ranks clean and with `inject`, a fault in the peer
  // check itself: the faulty run ends as the clean one, the other audits reproduced with the
  // peers agreeing; returns the step-4 events that are not "reproduced", each checked to be a
  // transient fault of the peer check's run of micro-batch 1.
  std::vector<nlohmann::json> TransientPeerCheckEvents(RunConfig c, int ranks,
                                                       const std::string& inject) {
    const std::string clean = root_ + "/clean", dir = root_ + "/faulty";
    EXPECT_TRUE(RunRanks(c, ranks, clean));
    c.faults.inject = inject;
    EXPECT_TRUE(RunRanks(c, ranks, dir));
    EXPECT_EQ(FinalState(dir), FinalState(clean));
    std::vector<nlohmann::json> out;
    for (const auto& [step, e] : Replays(dir)) {
      if (e["verdict"] == "reproduced") {
        EXPECT_EQ(e["peers"], "agree") << e.dump();
        continue;
      }
      EXPECT_EQ(step, 4);
      EXPECT_EQ(e["verdict"], "transient") << e.dump();
      EXPECT_EQ(e["run"], "peer check");
      EXPECT_EQ(e["micro"], 1);
      out.push_back(e);
    }
    return out;
  }
};

// Audits of clean steps at dp 2 and dp 3 (with ZeRO-1 and the reproducible reduction too): every
// one reproduced and confirmed by the other ranks, and the recomputations leave nothing behind: the
// run ends bitwise as the same run without audits.
TEST_F(PeersTrainTest, CleanStepsAreConfirmedByOtherRanksAndChangeNothing) {
  for (const auto& [dp, zero, exact] : {std::tuple{2, false, false}, std::tuple{2, true, false},
                                        std::tuple{2, false, true}, std::tuple{3, false, false}}) {
    SCOPED_TRACE(fmt::format("dp {}{}{}", dp, zero ? " zero" : "", exact ? " reproducible" : ""));
    RunConfig c = cfg_;
    c.parallel.dp = dp;
    c.parallel.zero = zero;
    c.parallel.reproducible = exact;
    c.train.batch_size = 2 * dp;
    ExpectCleanAuditsChangeNothing(c, dp);
  }
}

// A transient fault that strikes only the peer check (rank 2's execution of rank 1's
// micro-batch): rank 2 runs it again, gets the majority's result, and is not named faulty; the
// event says so ("transient", run "peer check"), and the step stands: the run ends as a clean one.
TEST_F(PeersTrainTest, AFaultInThePeerCheckItselfIsTransient) {
  RunConfig c = cfg_;
  c.parallel.dp = 3;
  c.train.batch_size = 6;  // one micro-batch per replica: rank r's is micro-batch r
  c.sdc.audit_every = 1;
  const auto events =
      TransientPeerCheckEvents(c, 3, "gemm_fwd:step=4,rank=2,layer=1,gemm=2,micro=1,bit=27");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0]["rank"], 2);
  EXPECT_EQ(events[0]["op"], "gemm_fwd 2");
}

// A stuck core on rank 1 from step 5 (forward and backward GEMM 2 of block 1, the same flip
// whenever it computes the same micro-batch): its own replay repeats it, so the replay alone
// reports "reproduced". With three replicas the other two name rank 1 where it first differed,
// and every rank stops at that step with the line written.
TEST_F(PeersTrainTest, AStuckCoreIsNamedByTheOtherRanksAndStopsTheRun) {
  RunConfig c = cfg_;
  c.parallel.dp = 3;
  c.train.batch_size = 6;
  c.sdc.audit_every = 1;
  c.faults.inject = "bad_core:step=5,rank=1,layer=1,gemm=2,p=1,bit=27,stuck=1";
  const std::string dir = root_ + "/dp3";
  for (const Status& st : RankStatuses(c, 3, dir)) {
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("computes wrong results"), std::string::npos) << st.ToString();
  }
  const auto metrics = Metrics(dir);
  ASSERT_EQ(metrics.size(), 5u);
  const auto replays = Replays(dir);
  ASSERT_EQ(replays.size(), 5u);
  for (int k = 0; k < 4; ++k) EXPECT_EQ(replays[size_t(k)].second["peers"], "agree");
  const auto& [step, e] = replays.back();
  EXPECT_EQ(step, 5);
  EXPECT_EQ(e["verdict"], "faulty_rank") << e.dump();
  EXPECT_EQ(e["rank"], 1);
  EXPECT_EQ(e["majority"], true);
  EXPECT_EQ(e["layer"], 1);
  EXPECT_EQ(e["op"], "gemm_fwd 2");
  EXPECT_EQ(e["micro"], 1);  // its own (one micro-batch per replica)
  EXPECT_EQ(e["what"], "micro-batches of rank 1");

  // Two replicas: no majority, both named.
  c.parallel.dp = 2;
  c.train.batch_size = 4;
  const std::string two = root_ + "/dp2";
  for (const Status& st : RankStatuses(c, 2, two)) EXPECT_FALSE(st.ok());
  const auto r2 = Replays(two);
  ASSERT_FALSE(r2.empty());
  EXPECT_EQ(r2.back().first, 5);
  EXPECT_EQ(r2.back().second["verdict"], "faulty_rank");
  EXPECT_EQ(r2.back().second["majority"], false);
  EXPECT_EQ(
      std::set<int>({r2.back().second["rank"].get<int>(), r2.back().second["peer"].get<int>()}),
      std::set<int>({0, 1}));
}

// Replicas of several ranks (tp or pp > 1): a replica's ranks recompute their neighbours'
// micro-batches together, each rank comparing with the same position of the other replicas.
// Clean steps are confirmed and the run ends as without audits.
TEST_F(PeersTrainTest, ReplicasOfSeveralRanksConfirmCleanSteps) {
  for (const auto& [dp, tp, pp] : {std::tuple{2, 2, 1}, std::tuple{2, 1, 2}, std::tuple{3, 2, 1}}) {
    SCOPED_TRACE(fmt::format("dp {} tp {} pp {}", dp, tp, pp));
    RunConfig c = cfg_;
    c.parallel.dp = dp;
    c.parallel.tp = tp;
    c.parallel.pp = pp;
    c.train.batch_size = 2 * dp;
    c.train.micro_batch_size = 1;
    ExpectCleanAuditsChangeNothing(c, dp * tp * pp);
  }
}

// A stuck core on one rank of a replica of several: the fault reaches the replica's other ranks
// (through the tensor-parallel all-reduce, or the pipeline's sends), and the peer check names
// the rank where it struck (faulty_rank, at its GEMM) and the others as reached; every rank stops,
// its message naming the faulty rank only. dp 3: a majority names it; dp 2: the recomputation
// confirms the two suspects.
TEST_F(PeersTrainTest, AStuckCoreInAReplicaOfSeveralRanksIsNamedWhereItStruck) {
  struct Case {
    int dp, tp, pp;
    int faulty, peer;     // the faulty_rank event's rank and peer
    int reached, beside;  // the reached event's rank and peer
    bool majority;
  };
  // World rank = (pp_rank * dp + dp_rank) * tp + tp_rank; the core is on a rank of replica 1.
  // dp 2: no third execution decides, so the events name the two replicas' ranks at their
  // position (the suspects, either way round).
  for (const Case& k : {Case{3, 2, 1, 3, 1, 2, 0, true}, Case{2, 2, 1, 3, 1, 2, 0, false},
                        Case{3, 1, 2, 4, 3, 1, 0, true}}) {
    SCOPED_TRACE(fmt::format("dp {} tp {} pp {}", k.dp, k.tp, k.pp));
    RunConfig c = cfg_;
    c.parallel.dp = k.dp;
    c.parallel.tp = k.tp;
    c.parallel.pp = k.pp;
    c.train.batch_size = 2 * k.dp;
    c.train.micro_batch_size = 2;  // one micro-batch per replica: replica r's is micro-batch r
    c.sdc.audit_every = 1;
    c.faults.inject =
        fmt::format("bad_core:step=5,rank={},layer=1,gemm=2,p=1,bit=27,stuck=1", k.faulty);
    const std::string dir = root_ + "/stuck";
    auto names = [](const std::string& text, int rank) {
      return text.find(fmt::format("\"rank\":{},", rank)) != std::string::npos ||
             text.find(fmt::format("\"peer\":{},", rank)) != std::string::npos;
    };
    for (const Status& st : RankStatuses(c, k.dp * k.tp * k.pp, dir)) {
      EXPECT_FALSE(st.ok());
      EXPECT_NE(st.message().find("computes wrong results"), std::string::npos) << st.ToString();
      EXPECT_TRUE(names(st.message(), k.faulty)) << st.ToString();
      EXPECT_FALSE(names(st.message(), k.reached)) << st.ToString();
    }
    auto pair = [&](const nlohmann::json& e, int a, int b) {
      if (k.majority) return e["rank"] == a && e["peer"] == b;
      return std::set<int>{e["rank"].get<int>(), e["peer"].get<int>()} == std::set<int>{a, b};
    };
    int named = 0, passed_on = 0;
    for (const auto& [step, e] : Replays(dir)) {
      if (e["verdict"] == "reproduced") {
        EXPECT_EQ(e["peers"], "agree") << e.dump();
        continue;
      }
      EXPECT_EQ(step, 5);
      EXPECT_EQ(e["majority"], k.majority) << e.dump();
      if (k.majority) {
        EXPECT_EQ(e["what"], "micro-batches of replica 1") << e.dump();
        EXPECT_EQ(e["micro"], 1) << e.dump();
      }
      if (e["verdict"] == "faulty_rank") {
        EXPECT_TRUE(pair(e, k.faulty, k.peer)) << e.dump();
        EXPECT_EQ(e["layer"], 1) << e.dump();
        EXPECT_EQ(e["op"], "gemm_fwd 2") << e.dump();
        ++named;
      } else {
        EXPECT_EQ(e["verdict"], "reached") << e.dump();
        EXPECT_TRUE(pair(e, k.reached, k.beside)) << e.dump();
        ++passed_on;
      }
    }
    EXPECT_EQ(named, 1);
    EXPECT_EQ(passed_on, 1);
  }
}

// A transient fault that strikes only the peer check, on a replica of two ranks: rank 5 (replica
// 2's tp rank 1) computing replica 1's micro-batch. The fault reaches its tp peer (rank 4) too;
// replica 2 runs the micro-batch again, gets the majority's result, and the events say
// "transient" (run "peer check") for replica 2's ranks; the step stands.
TEST_F(PeersTrainTest, AFaultInThePeerCheckOfAReplicaOfSeveralRanksIsTransient) {
  RunConfig c = cfg_;
  c.parallel.dp = 3;
  c.parallel.tp = 2;
  c.train.batch_size = 6;
  c.train.micro_batch_size = 2;
  c.sdc.audit_every = 1;
  std::set<int> ranks;
  for (const auto& e :
       TransientPeerCheckEvents(c, 6, "gemm_fwd:step=4,rank=5,layer=1,gemm=2,micro=1,bit=27")) {
    ranks.insert(e["rank"].get<int>());
    if (e["rank"] == 5) {
      EXPECT_EQ(e["op"], "gemm_fwd 2");
    }
  }
  EXPECT_TRUE(ranks.count(5)) << "rank 5's execution is not named";
  for (int r : ranks) EXPECT_TRUE(r == 4 || r == 5) << r;
}

}  // namespace
}  // namespace atl
