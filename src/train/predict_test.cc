// The planner inside training: the compute part from a calibration file (and the cores a rank
// gets), the WAN part of each strategy against its formula, the measured parts, and a run without
// a calibration.
#include "train/predict.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "plan/calibrate.h"

namespace atl {
namespace {

class PredictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/predict_test";
    std::filesystem::create_directories(dir_);
    cal_ = dir_ + "/calibration.json";
    // 100 GFLOP/s, 400 us per matmul, 4 ns per parameter, fitted at 1 thread.
    ASSERT_TRUE(WriteFileAtomic(cal_, R"({"coef": [1e-11, 4e-4, 4e-9], "threads": 1})").ok());
    cfg_.model = {.vocab_size = 50257, .seq_len = 64, .n_layer = 2, .n_head = 4, .n_embd = 64};
    cfg_.train.batch_size = 24;
    cfg_.train.micro_batch_size = 8;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // The calibrated time of one rank's step alone at one thread.
  double Alone(const RunConfig& c) const {
    plan::CalibrationRun r;
    r.n_layer = c.model.n_layer;
    r.n_head = c.model.n_head;
    r.n_embd = c.model.n_embd;
    r.seq_len = c.model.seq_len;
    r.vocab_size = c.model.vocab_size;
    r.micro_batch_tokens = c.train.micro_batch_size * c.model.seq_len;
    const double replicas = double(c.world.sites * c.parallel.dp);
    const auto f = plan::StepFeatures(r, double(c.train.batch_size) / replicas * c.model.seq_len);
    return 1e-11 * f[0] + 4e-4 * f[1] + 4e-9 * f[2];
  }

  std::string dir_, cal_;
  RunConfig cfg_;
};

TEST_F(PredictTest, ComputeScalesWithTheCoresARankGets) {
  const double alone = Alone(cfg_);
  auto one = PredictStep(cfg_, 1, 1, 2, cal_);
  ASSERT_TRUE(one.have_compute) << one.basis;
  EXPECT_NEAR(one.parts.compute_s, alone, 1e-12 * alone);
  EXPECT_NEAR(PredictStep(cfg_, 2, 1, 2, cal_).parts.compute_s, alone / 2, 1e-12);
  // Three one-thread processes on two cores: each gets 2/3 of a core.
  EXPECT_NEAR(PredictStep(cfg_, 1, 3, 2, cal_).parts.compute_s, alone * 1.5, 1e-12);
  // Three sites split the batch: a third of the tokens each.
  RunConfig world = cfg_;
  world.world.sites = 3;
  EXPECT_NEAR(PredictStep(world, 1, 1, 2, cal_).parts.compute_s, Alone(world), 1e-12);
  EXPECT_LT(Alone(world), alone);
  EXPECT_EQ(one.parts.wan_s, 0.0);  // one site
}

TEST_F(PredictTest, WanWaitOfEachStrategy) {
  RunConfig w = cfg_;
  w.world.sites = 3;
  w.world.link.latency_ms = 40;
  w.world.link.bandwidth_mbps = 100;
  const double P = double(NumParameters(w.model));
  const double ring = 2.0 * 2 / 3;  // 2 (D - 1) / D
  const double latency = 2.0 * 2 * 0.040;
  w.world.strategy = "sync";
  const double sync = latency + ring * P * 4 * 8 / 100e6;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, sync, 1e-12 * sync);
  w.world.strategy = "diloco";
  w.world.codec = "int4";
  w.world.diloco.inner_steps = 30;
  const double diloco = (latency + ring * P * 0.5 * 8 / 100e6) / 30;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, diloco, 1e-12 * diloco);
  // Streaming: a third of the parameters every 10 steps, hidden behind 4 steps of compute.
  w.world.strategy = "streaming";
  w.world.streaming.fragments = 3;
  w.world.streaming.overlap_steps = 4;
  const StepPrediction s = PredictStep(w, 1, 1, 2, cal_);
  const double fragment = latency + ring * P / 3 * 0.5 * 8 / 100e6;
  EXPECT_NEAR(s.parts.wan_s, std::max(0.0, fragment - 4 * s.parts.compute_s) / 10, 1e-12);
  w.world.streaming.overlap_steps = 0;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, fragment / 10, 1e-12);
  w.world.strategy = "async";
  EXPECT_EQ(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, 0.0);
}

TEST_F(PredictTest, WithoutACalibrationItSaysHowToMakeOne) {
  const StepPrediction p = PredictStep(cfg_, 1, 1, 2, dir_ + "/none.json");
  EXPECT_FALSE(p.have_compute);
  EXPECT_EQ(p.parts.compute_s, 0.0);
  EXPECT_NE(p.basis.find("atoll plan calibrate --save"), std::string::npos) << p.basis;
  EXPECT_NE(DescribePrediction(p).find("compute not predicted"), std::string::npos);
  ASSERT_TRUE(WriteFileAtomic(dir_ + "/bad.json", "{\"coef\": 3}").ok());
  EXPECT_FALSE(PredictStep(cfg_, 1, 1, 2, dir_ + "/bad.json").have_compute);
}

TEST_F(PredictTest, MeasuredPartsAreMediansAfterTheWarmUp) {
  // Two warm-up steps, then steps of 100..104 ms with 10 ms on the WAN; one outlier.
  const StepParts m = MeasuredParts({900, 800, 100, 101, 102, 500, 103}, {0, 0, 10, 10, 10, 10, 10},
                                    /*in_site_s=*/0.002, /*skip=*/2);
  EXPECT_NEAR(m.wan_s, 0.010, 1e-12);
  EXPECT_NEAR(m.compute_s, 0.092 - 0.002, 1e-12);  // median of step - wan, less in-site
  EXPECT_NEAR(m.in_site_s, 0.002, 1e-12);
  const StepPrediction p = PredictStep(cfg_, 1, 1, 2, cal_);
  const auto rows = nlohmann::json::parse(ComparisonJson(p, m));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["part"], "compute");
  EXPECT_NEAR(rows[0]["measured_ms"].get<double>(), 90, 1e-9);
  EXPECT_NEAR(rows[3]["predicted_ms"].get<double>(), p.parts.total() * 1e3, 1e-9);
  EXPECT_NE(DescribeComparison(p, m).find("WAN wait"), std::string::npos);
}

}  // namespace
}  // namespace atl
