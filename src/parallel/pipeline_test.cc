// Pipeline schedules: written-out cases, the structural properties over many (pp, m), and a
// discrete-event simulation of all stages together that proves each schedule completes under
// blocking receives and non-blocking sends.
#include "parallel/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace atl {
namespace {

constexpr PipeScheduleKind kKinds[] = {PipeScheduleKind::kGPipe, PipeScheduleKind::k1F1B};

PipeOp F(int micro, int slot) { return {PipeOp::kForward, micro, slot}; }
PipeOp B(int micro, int slot) { return {PipeOp::kBackward, micro, slot}; }

std::string Show(const std::vector<PipeOp>& ops) {
  std::string s;
  for (const PipeOp& op : ops)
    s += fmt::format("{}{}/{} ", op.kind == PipeOp::kForward ? 'F' : 'B', op.micro, op.slot);
  return s;
}

// ---- The simulator. ----

struct SimResult {
  bool completed = false;
  int ticks = 0;                    // time steps, one op per stage per step, each op one step
  std::vector<int> peak_in_flight;  // per stage: most forwards not yet matched by their backward
  std::string stuck;                // when not completed: each stage's blocked op
};

// Runs every stage's op list in order. An op may start once what it receives has been sent: the
// forward of micro j on stage s needs the forward of j done on s - 1, the backward of j on s needs
// the backward of j done on s + 1 (blocking receives). Sends never wait (buffered). A step in
// which no stage can move while some have ops left is a deadlock.
SimResult Simulate(const std::vector<std::vector<PipeOp>>& stages, int m) {
  const int pp = int(stages.size());
  std::vector<std::vector<char>> fwd(size_t(pp), std::vector<char>(size_t(m), 0));
  std::vector<std::vector<char>> bwd = fwd;
  std::vector<size_t> pc(size_t(pp), 0);
  std::vector<int> in_flight(size_t(pp), 0);
  SimResult r;
  r.peak_in_flight.assign(size_t(pp), 0);
  auto ready = [&](int s, const PipeOp& op) {
    if (op.kind == PipeOp::kForward) return s == 0 || fwd[size_t(s - 1)][size_t(op.micro)] != 0;
    return s == pp - 1 || bwd[size_t(s + 1)][size_t(op.micro)] != 0;
  };
  for (;;) {
    bool left = false;
    std::vector<int> runnable;
    for (int s = 0; s < pp; ++s) {
      if (pc[size_t(s)] == stages[size_t(s)].size()) continue;
      left = true;
      if (ready(s, stages[size_t(s)][pc[size_t(s)]])) runnable.push_back(s);
    }
    if (!left) {
      r.completed = true;
      return r;
    }
    if (runnable.empty()) {
      for (int s = 0; s < pp; ++s)
        if (pc[size_t(s)] < stages[size_t(s)].size())
          r.stuck += fmt::format("stage {} at {}; ", s, Show({stages[size_t(s)][pc[size_t(s)]]}));
      return r;
    }
    // Ops of this step complete at its end: a message sent now is received at the next step.
    for (int s : runnable) {
      const PipeOp& op = stages[size_t(s)][pc[size_t(s)]++];
      if (op.kind == PipeOp::kForward) {
        fwd[size_t(s)][size_t(op.micro)] = 1;
        r.peak_in_flight[size_t(s)] = std::max(r.peak_in_flight[size_t(s)], ++in_flight[size_t(s)]);
      } else {
        bwd[size_t(s)][size_t(op.micro)] = 1;
        --in_flight[size_t(s)];
      }
    }
    ++r.ticks;
  }
}

std::vector<std::vector<PipeOp>> AllStages(PipeScheduleKind kind, int pp, int m) {
  std::vector<std::vector<PipeOp>> stages;
  for (int s = 0; s < pp; ++s) stages.push_back(MakePipeSchedule(kind, pp, s, m));
  return stages;
}

// The simulator is not vacuous: stage 1 waits for forward 1 before it sends backward 0, while stage
// 0 sends forward 1 only after receiving backward 0: a deadlock, reported with both blocked ops.
TEST(PipeSimulator, DetectsADeadlock) {
  const std::vector<std::vector<PipeOp>> bad = {
      {F(0, 0), B(0, 0), F(1, 0), B(1, 0)},
      {F(0, 0), F(1, 1), B(1, 1), B(0, 0)},
  };
  SimResult r = Simulate(bad, 2);
  EXPECT_FALSE(r.completed);
  EXPECT_NE(r.stuck.find("stage 0 at B0"), std::string::npos) << r.stuck;
  EXPECT_NE(r.stuck.find("stage 1 at F1"), std::string::npos) << r.stuck;
}

TEST(PipeSimulator, EveryScheduleCompletes) {
  for (PipeScheduleKind kind : kKinds) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int m = 1; m <= 9; ++m) {
        SCOPED_TRACE(fmt::format("{} pp {} m {}", PipeScheduleName(kind), pp, m));
        const auto stages = AllStages(kind, pp, m);
        SimResult r = Simulate(stages, m);
        ASSERT_TRUE(r.completed) << "deadlock: " << r.stuck;
        // Forward and backward of equal cost: both schedules fill and drain the pipeline once,
        // so the step takes 2 (m + pp - 1) op times; 1F1B saves memory, not bubble.
        EXPECT_EQ(r.ticks, 2 * (m + pp - 1));
        for (int s = 0; s < pp; ++s)
          EXPECT_EQ(r.peak_in_flight[size_t(s)], SlotsUsed(stages[size_t(s)])) << "stage " << s;
      }
    }
  }
}

// ---- Structure of one stage's ops. ----

TEST(PipeSchedule, EveryMicroBatchOnceForwardThenBackwardWithConsistentSlots) {
  for (PipeScheduleKind kind : kKinds) {
    for (int pp = 1; pp <= 5; ++pp) {
      for (int s = 0; s < pp; ++s) {
        for (int m = 1; m <= 9; ++m) {
          SCOPED_TRACE(fmt::format("{} pp {} stage {} m {}", PipeScheduleName(kind), pp, s, m));
          const auto ops = MakePipeSchedule(kind, pp, s, m);
          ASSERT_EQ(ops.size(), size_t(2 * m)) << Show(ops);
          std::vector<int> fwd_at(size_t(m), -1), bwd_at(size_t(m), -1), slot_of(size_t(m), -1);
          std::vector<bool> taken;
          std::vector<int> bwd_order;
          for (int i = 0; i < int(ops.size()); ++i) {
            const PipeOp& op = ops[size_t(i)];
            ASSERT_TRUE(op.micro >= 0 && op.micro < m) << Show(ops);
            const size_t j = size_t(op.micro);
            if (op.kind == PipeOp::kForward) {
              ASSERT_EQ(fwd_at[j], -1) << "forward twice: " << Show(ops);
              fwd_at[j] = i;
              // The lowest free slot.
              const int lowest = int(std::find(taken.begin(), taken.end(), false) - taken.begin());
              ASSERT_EQ(op.slot, lowest) << Show(ops);
              if (lowest == int(taken.size())) taken.push_back(false);
              taken[size_t(lowest)] = true;
              slot_of[j] = op.slot;
            } else {
              ASSERT_EQ(bwd_at[j], -1) << "backward twice: " << Show(ops);
              ASSERT_NE(fwd_at[j], -1) << "backward before forward: " << Show(ops);
              bwd_at[j] = i;
              ASSERT_EQ(op.slot, slot_of[j]) << Show(ops);
              taken[size_t(op.slot)] = false;
              bwd_order.push_back(op.micro);
            }
          }
          // Forwards always run in micro-batch order; backwards per the schedule.
          for (int j = 1; j < m; ++j) EXPECT_LT(fwd_at[size_t(j - 1)], fwd_at[size_t(j)]);
          std::vector<int> want(size_t(m), 0);
          for (int j = 0; j < m; ++j)
            want[size_t(j)] = kind == PipeScheduleKind::kGPipe ? m - 1 - j : j;
          EXPECT_EQ(bwd_order, want);
          const int slots = kind == PipeScheduleKind::kGPipe ? m : std::min(pp - s, m);
          EXPECT_EQ(SlotsUsed(ops), slots) << Show(ops);
        }
      }
    }
  }
}

TEST(PipeSchedule, GPipeWrittenOut) {
  const std::vector<PipeOp> want = {F(0, 0), F(1, 1), F(2, 2), B(2, 2), B(1, 1), B(0, 0)};
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::kGPipe, 2, 0, 3), want);
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::kGPipe, 2, 1, 3), want);  // the same on every stage
}

TEST(PipeSchedule, OneFOneBWrittenOut) {
  // pp 4, stage 0, 6 micro-batches: 3 warm-up forwards, 3 pairs, 3 cool-down backwards; the slot
  // freed by B0 is taken by F4.
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::k1F1B, 4, 0, 6),
            (std::vector<PipeOp>{F(0, 0), F(1, 1), F(2, 2), F(3, 3), B(0, 0), F(4, 0), B(1, 1),
                                 F(5, 1), B(2, 2), B(3, 3), B(4, 0), B(5, 1)}));
  // Stage 2 of 4: one warm-up forward, two slots.
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::k1F1B, 4, 2, 3),
            (std::vector<PipeOp>{F(0, 0), F(1, 1), B(0, 0), F(2, 0), B(1, 1), B(2, 0)}));
  // The last stage alternates from the start with a single slot.
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::k1F1B, 4, 3, 3),
            (std::vector<PipeOp>{F(0, 0), B(0, 0), F(1, 0), B(1, 0), F(2, 0), B(2, 0)}));
  // Fewer micro-batches than the warm-up: all forwards, then all backwards in order.
  EXPECT_EQ(MakePipeSchedule(PipeScheduleKind::k1F1B, 5, 0, 2),
            (std::vector<PipeOp>{F(0, 0), F(1, 1), B(0, 0), B(1, 1)}));
}

TEST(PipeSchedule, SlotsUsed) {
  EXPECT_EQ(SlotsUsed({}), 0);
  EXPECT_EQ(SlotsUsed({F(0, 0), B(0, 0)}), 1);
  EXPECT_EQ(SlotsUsed({F(0, 0), F(1, 1), F(2, 2), B(0, 0), B(1, 1), B(2, 2)}), 3);
}

// ---- Names. ----

TEST(PipeSchedule, NamesRoundTrip) {
  for (PipeScheduleKind kind : kKinds) {
    auto k = ParsePipeSchedule(PipeScheduleName(kind));
    ASSERT_TRUE(k.ok()) << k.status().ToString();
    EXPECT_EQ(*k, kind);
  }
  EXPECT_STREQ(PipeScheduleName(PipeScheduleKind::kGPipe), "gpipe");
  EXPECT_STREQ(PipeScheduleName(PipeScheduleKind::k1F1B), "1f1b");
}

TEST(PipeSchedule, UnknownNameListsTheChoices) {
  for (const char* name : {"GPipe", "1F1B", "", "interleaved"}) {
    auto k = ParsePipeSchedule(name);
    ASSERT_FALSE(k.ok()) << name;
    EXPECT_EQ(k.status().code(), StatusCode::kInvalidArgument);
    const std::string msg = k.status().message();
    EXPECT_NE(msg.find(fmt::format("'{}'", name)), std::string::npos) << msg;
    EXPECT_NE(msg.find("gpipe"), std::string::npos) << msg;
    EXPECT_NE(msg.find("1f1b"), std::string::npos) << msg;
  }
}

// ---- Layers. ----

TEST(StageLayers, PartitionInOrderEarlierStagesLarger) {
  for (int pp = 1; pp <= 8; ++pp) {
    for (int n = pp; n <= 3 * pp + 2; ++n) {
      SCOPED_TRACE(fmt::format("n_layer {} pp {}", n, pp));
      int next = 0, prev_size = n + 1, min_size = n, max_size = 0;
      for (int s = 0; s < pp; ++s) {
        const LayerRange r = StageLayers(n, pp, s);
        EXPECT_EQ(r.begin, next);
        const int size = r.end - r.begin;
        EXPECT_GE(size, 1);  // n_layer >= pp: every stage has a block
        EXPECT_LE(size, prev_size);
        min_size = std::min(min_size, size);
        max_size = std::max(max_size, size);
        prev_size = size;
        next = r.end;
      }
      EXPECT_EQ(next, n);
      EXPECT_LE(max_size - min_size, 1);
    }
  }
}

TEST(StageLayers, WrittenOut) {
  const int want[4][2] = {{0, 3}, {3, 6}, {6, 8}, {8, 10}};
  for (int s = 0; s < 4; ++s) {
    const LayerRange r = StageLayers(10, 4, s);
    EXPECT_EQ(r.begin, want[s][0]);
    EXPECT_EQ(r.end, want[s][1]);
  }
  const LayerRange all = StageLayers(12, 1, 0);
  EXPECT_EQ(all.begin, 0);
  EXPECT_EQ(all.end, 12);
}

}  // namespace
}  // namespace atl
