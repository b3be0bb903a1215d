// Goodput simulation: calibrated on Llama 3, consistent with Young/Daly, deterministic, and
// sensitive to what it claims to model (restart growth, SDC, replicas).
#include "plan/goodput.h"

#include <gtest/gtest.h>

#include <cmath>

namespace atl::plan {
namespace {

TEST(Goodput, YoungAndDalyFormulas) {
  // Young: sqrt(2 x 20 x 10000) = 632.46 s. Daly adds sqrt(d/2M)/3 + (d/2M)/9 and subtracts d.
  EXPECT_NEAR(YoungInterval(20, 10000), 632.4555, 1e-3);
  double x = 20.0 / 20000;
  EXPECT_NEAR(DalyInterval(20, 10000), 632.4555 * (1 + std::sqrt(x) / 3 + x / 9) - 20, 1e-3);
  EXPECT_DOUBLE_EQ(DalyInterval(30000, 10000), 10000);  // cost beyond 2M: checkpoint every M
  GoodputSettings s;
  // Llama 3: 466 interruptions in 54 days -> system MTBF 54 x 24 / 466 h = 2.78 h.
  EXPECT_NEAR(SystemMtbfSeconds(s), 54 * 86400.0 / 466, 1e-6);
  EXPECT_NEAR(RestartSeconds(s, Recovery::kCheckpoint), 120 + 7.5 * 16.384, 1e-9);
}

TEST(Goodput, CalibratedOnLlama3) {
  GoodputSettings s;
  auto r = RunGoodput(s);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  // About 466 interruptions in 54 days (Poisson: +-22 per trial; the mean of 16 trials).
  EXPECT_NEAR(r->checkpoint_at_daly.interruptions, 466, 25);
  // "More than 90% effective training time."
  EXPECT_GT(r->checkpoint_at_daly.goodput, 0.90);
  EXPECT_LT(r->checkpoint_at_daly.goodput, 0.97);
  // The simulated optimum agrees with Daly's interval within a factor of two and a fraction of a
  // percent of goodput.
  EXPECT_GT(r->best_checkpoint.interval_s, r->daly_s / 2.01);
  EXPECT_LT(r->best_checkpoint.interval_s, r->daly_s * 2.01);
  EXPECT_LT(r->best_checkpoint.goodput - r->checkpoint_at_daly.goodput, 0.005);
  // The time accounting closes: kept + lost + saving + restarting = wall time.
  const GoodputStats& g = r->checkpoint_at_daly;
  EXPECT_NEAR(g.goodput + g.lost_fraction + g.checkpoint_fraction + g.restart_fraction, 1.0, 1e-9);
  // Cheap in-memory replicas with a fast restart beat persistent checkpoints.
  EXPECT_GT(r->best_replica.goodput, r->best_checkpoint.goodput);
}

TEST(Goodput, NoFailuresCostsOnlyCheckpoints) {
  GoodputSettings s;
  s.failure_rate_per_gpu_hour = 1e-30;
  s.sdc_rate_per_gpu_hour = 0;
  s.trials = 2;
  GoodputStats st = SimulateGoodput(s, Recovery::kCheckpoint, 1000);
  EXPECT_EQ(st.interruptions, 0);
  // Every 1000 s of work costs 20 s: goodput 1000 / 1020.
  EXPECT_NEAR(st.goodput, 1000.0 / 1020.0, 1e-4);
}

TEST(Goodput, DeterministicForASeed) {
  GoodputSettings s;
  s.trials = 4;
  GoodputStats a = SimulateGoodput(s, Recovery::kCheckpoint, 600);
  GoodputStats b = SimulateGoodput(s, Recovery::kCheckpoint, 600);
  EXPECT_EQ(a.goodput, b.goodput);
  EXPECT_EQ(a.interruptions, b.interruptions);
  s.seed = 2;
  GoodputStats c = SimulateGoodput(s, Recovery::kCheckpoint, 600);
  EXPECT_NE(a.goodput, c.goodput);
}

TEST(Goodput, StartupGrowthAndCorruptionHurt) {
  GoodputSettings small;
  small.trials = 4;
  GoodputSettings big = small;
  big.gpus = 16384 * 8;  // 8x the failures and a 1 h restart
  auto rs = RunGoodput(small), rb = RunGoodput(big);
  ASSERT_TRUE(rs.ok() && rb.ok());
  EXPECT_LT(rb->best_checkpoint.goodput, rs->best_checkpoint.goodput - 0.1);
  GoodputSettings sdc = small;
  sdc.sdc_rate_per_gpu_hour *= 20;
  sdc.sdc_detection_delay_s = 4 * 3600;  // found late: roll back past several checkpoints
  GoodputStats clean = SimulateGoodput(small, Recovery::kCheckpoint, 600);
  GoodputStats dirty = SimulateGoodput(sdc, Recovery::kCheckpoint, 600);
  EXPECT_GT(dirty.lost_fraction, clean.lost_fraction + 0.01);
}

TEST(Goodput, RestartsLongerThanTheMtbfStallTheRun) {
  GoodputSettings s;
  s.gpus = 1000000;  // MTBF 164 s, restart 2 h: no restart ever completes
  s.trials = 2;
  s.days = 2;
  GoodputStats st = SimulateGoodput(s, Recovery::kCheckpoint, 600);
  EXPECT_LT(st.goodput, 0.01);
  EXPECT_GT(st.restart_fraction, 0.99);
}

TEST(Goodput, RefusesBadSettings) {
  GoodputSettings s;
  s.gpus = 0;
  EXPECT_EQ(RunGoodput(s).status().code(), StatusCode::kInvalidArgument);
  s = GoodputSettings{};
  s.checkpoint_cost_s = 0;
  EXPECT_EQ(RunGoodput(s).status().code(), StatusCode::kInvalidArgument);
  s = GoodputSettings{};
  s.trials = 0;
  EXPECT_EQ(RunGoodput(s).status().ExitCode(), 2);
}

// bench/startup.sh's constants become the model's restart times, scaled to the site size.
TEST(Goodput, MeasuredStartupSetsTheRestartTimes) {
  const nlohmann::json j = {{"fixed_s", 0.3},
                            {"per_rank_s", 0.2},
                            {"per_site_s", 0.1},
                            {"restart_from_memory_s", 4.0},
                            {"restart_from_disk_s", 1.0}};
  auto m = ParseMeasuredStartup(j);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  GoodputSettings s;
  ApplyMeasuredStartup(*m, 8, &s);
  EXPECT_DOUBLE_EQ(s.restart_base_s, 1.0 - 0.1 * 3 + 0.2 * 7);  // its 3 sites counted once
  EXPECT_DOUBLE_EQ(s.replica_restart_base_s, 4.0 + 0.2 * 7);
  EXPECT_DOUBLE_EQ(s.restart_per_1k_gpus_s, 0.1 * 1000 / 8);
  s.gpus = 16384;
  EXPECT_DOUBLE_EQ(RestartSeconds(s, Recovery::kCheckpoint), 2.1 + 12.5 * 16.384);
  nlohmann::json missing = j;
  missing.erase("per_site_s");
  EXPECT_EQ(ParseMeasuredStartup(missing).status().code(), StatusCode::kInvalidArgument);
  nlohmann::json zero = j;
  zero["restart_from_disk_s"] = 0;
  EXPECT_FALSE(ParseMeasuredStartup(zero).ok());
}

}  // namespace
}  // namespace atl::plan
