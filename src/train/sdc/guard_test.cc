// The step guard: quiet on noisy and trending clean signals, loud on spikes and non-finite values,
// and it does not learn from the steps it flagged.
#include "train/sdc/guard.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/rng.h"

namespace atl {
namespace {

double Noise(uint64_t i) { return RandomNormal(5, 0, RngPurpose::kTest, i); }

TEST(StepGuard, MedianOfOddAndEvenCounts) {
  EXPECT_EQ(StepGuard::Median({3, 1, 2}), 2);
  EXPECT_EQ(StepGuard::Median({4, 1, 3, 2}), 2.5);
  EXPECT_TRUE(std::isnan(StepGuard::Median({})));
}

TEST(StepGuard, QuietOnANoisyDecliningLossLoudOnASpike) {
  StepGuard g;
  int alarms = 0;
  // A loss falling from 10 toward 3 with 2% noise, like a run's first thousand steps.
  auto loss = [](int s) { return (3 + 7 * std::exp(-s / 150.0)) * (1 + 0.02 * Noise(s)); };
  for (int s = 0; s < 1000; ++s) alarms += !g.Check({{"loss", loss(s)}}).empty();
  EXPECT_EQ(alarms, 0);
  const auto spike = g.Check({{"loss", loss(1000) * 3}});
  ASSERT_EQ(spike.size(), 1u);
  EXPECT_EQ(spike[0].name, "loss");
  EXPECT_GT(spike[0].deviations, 10);
  EXPECT_NEAR(spike[0].median, loss(1000), 0.1);
  // The spike was not learned: the same spike again is flagged again.
  EXPECT_EQ(g.Check({{"loss", loss(1000) * 3}}).size(), 1u);
  // A drop is as suspicious as a rise (a flipped sign, a zeroed tensor).
  EXPECT_EQ(g.Check({{"loss", loss(1000) * 0.3}}).size(), 1u);
}

TEST(StepGuard, AnOutlierLeavesTheOtherSignalsHistoriesGoing) {
  StepGuard g;
  for (int s = 0; s < 20; ++s)
    ASSERT_TRUE(g.Check({{"a", 1 + 0.01 * Noise(s)}, {"b", 5.0 + 0.01 * Noise(50 + s)}}).empty());
  // a spikes; b moves a little, which is added.
  ASSERT_EQ(g.Check({{"a", 9.0}, {"b", 5.02}}).size(), 1u);
  EXPECT_TRUE(g.Check({{"a", 1.0}, {"b", 5.0}}).empty());
}

TEST(StepGuard, AShiftToANewLevelRaisesAFewAlarmsNotOneEveryStep) {
  StepGuard g;
  for (int s = 0; s < 32; ++s) ASSERT_TRUE(g.Check({{"x", 1 + 0.01 * Noise(s)}}).empty());
  int alarms = 0;
  for (int s = 0; s < 100; ++s) alarms += !g.Check({{"x", 3 + 0.01 * Noise(200 + s)}}).empty();
  EXPECT_EQ(alarms, 3);  // shift_after
}

TEST(StepGuard, NonFiniteIsAnOutlierEvenBeforeWarmup) {
  StepGuard g;
  const auto o = g.Check({{"grad_norm", std::numeric_limits<double>::infinity()},
                          {"loss", std::nan("")},
                          {"update_rms", 1.0}});
  ASSERT_EQ(o.size(), 2u);
  EXPECT_EQ(o[0].name, "grad_norm");
  EXPECT_EQ(o[1].name, "loss");
  EXPECT_TRUE(g.Check({{"grad_norm", 1e30}}).empty()) << "a finite value before warmup passes";
}

TEST(StepGuard, AFlatHistoryHasARelativeFloor) {
  StepGuard g;
  for (int s = 0; s < 20; ++s) ASSERT_TRUE(g.Check({{"rms", 1.0}}).empty());
  EXPECT_TRUE(g.Check({{"rms", 1.0 + 1e-6}}).empty());  // a rounding difference
  EXPECT_TRUE(g.Check({{"rms", 1.5}}).empty());         // a drift within 2x
  EXPECT_EQ(g.Check({{"rms", 2.5}}).size(), 1u);
}

TEST(StepGuard, AcceptAddsAFlaggedStepFoundClean) {
  StepGuard::Options o;
  o.window = 8;
  StepGuard g(o);
  for (int s = 0; s < 8; ++s) ASSERT_TRUE(g.Check({{"x", 1.0 + 0.01 * Noise(s)}}).empty());
  ASSERT_EQ(g.Check({{"x", 3.0}}).size(), 1u);
  // A genuine shift (the replay agreed): once accepted enough times, it is the new normal.
  for (int s = 0; s < 8; ++s) g.Accept({{"x", 3.0 + 0.01 * Noise(100 + s)}});
  EXPECT_TRUE(g.Check({{"x", 3.0}}).empty());
}

}  // namespace
}  // namespace atl
