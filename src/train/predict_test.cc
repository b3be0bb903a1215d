// The planner inside training: the compute part from a calibration file (and the cores a rank
// gets), the WAN part of each strategy against its formula, the measured parts, and a run without
// a calibration.
#include "train/predict.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <nlohmann/json.hpp>
#include <unistd.h>

#include "core/file.h"
#include "plan/calibrate.h"
#include "world/codec.h"

namespace atl {
namespace {

class PredictTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // One directory per test and process: ctest runs this suite's tests side by side.
    dir_ = ::testing::TempDir() + "/predict_test_" +
           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
           std::to_string(::getpid());
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
  static double Alone(const RunConfig& c) {
    const auto f = RankStepFeatures(c);
    return 1e-11 * f[0] + 4e-4 * f[1] + 4e-9 * f[2];
  }

  std::string dir_, cal_;
  RunConfig cfg_;
};

TEST_F(PredictTest, TheRankShareOfTheBatch) {
  // 24 sequences of 64 tokens over 3 sites: 512 tokens a rank, in micro-batches of 8 x 64.
  RunConfig world = cfg_;
  world.world.sites = 3;
  plan::CalibrationRun shape;
  shape.n_layer = 2;
  shape.n_head = 4;
  shape.n_embd = 64;
  shape.seq_len = 64;
  shape.vocab_size = 50257;
  shape.micro_batch_tokens = 512;
  EXPECT_EQ(RankStepFeatures(world), plan::StepFeatures(shape, 512));
  EXPECT_EQ(RankStepFeatures(cfg_), plan::StepFeatures(shape, 1536));
}

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
  w.world.pairs["0-2"] = {.latency_ms = 80, .bandwidth_mbps = 50};  // the slowest pair bounds
  const double P = double(NumParameters(w.model));
  const double bw = 50e6, lat = 0.080;
  // sync: the gradient's ring all-reduce (float32) and the losses', 2 (D - 1) hops each.
  w.world.strategy = "sync";
  const double sync = 4 * 2 * lat + 2.0 * 2 / 3 * P * 4 * 8 / bw;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, sync, 1e-12 * sync);
  w.parallel.reproducible = true;  // int64 words
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, sync + 2.0 * 2 / 3 * P * 4 * 8 / bw,
              1e-12 * sync);
  w.parallel.reproducible = false;
  // diloco: every link carries 2 x the int4 encoding (block scales included) of P / D floats.
  w.world.strategy = "diloco";
  w.world.codec = "int4";
  w.world.diloco.inner_steps = 30;
  const auto piece = [](double n) {
    return double(EncodedBytes(Codec::kInt4, size_t(std::ceil(n / 3))));
  };
  EXPECT_GT(piece(P), P / 3 / 2);  // more than 4 bits a float
  const double diloco = (2 * lat + 2 * piece(P) * 8 / bw) / 30;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, diloco, 1e-12 * diloco);
  // streaming: a third of the parameters every 10 steps, hidden behind 4 steps of compute.
  w.world.strategy = "streaming";
  w.world.streaming.fragments = 3;
  w.world.streaming.overlap_steps = 4;
  const StepPrediction s = PredictStep(w, 1, 1, 2, cal_);
  const double fragment = 2 * lat + 2 * piece(P / 3) * 8 / bw;
  EXPECT_NEAR(s.parts.wan_s, std::max(0.0, fragment - 4 * s.parts.compute_s) / 10, 1e-12);
  w.world.streaming.overlap_steps = 0;
  EXPECT_NEAR(PredictStep(w, 1, 1, 2, cal_).parts.wan_s, fragment / 10, 1e-12);
  // Not modelled: async; streaming without the compute part it hides behind.
  EXPECT_FALSE(PredictStep(w, 1, 1, 2, dir_ + "/none.json").have_wan);
  w.world.strategy = "async";
  EXPECT_FALSE(PredictStep(w, 1, 1, 2, cal_).have_wan);
  EXPECT_TRUE(PredictStep(cfg_, 1, 1, 2, cal_).have_wan);  // one site: nothing to wait for
}

TEST_F(PredictTest, WithoutACalibrationItSaysHowToMakeOne) {
  const StepPrediction p = PredictStep(cfg_, 1, 1, 2, dir_ + "/none.json");
  EXPECT_FALSE(p.have_compute);
  EXPECT_EQ(p.parts.compute_s, 0.0);
  EXPECT_NE(p.basis.find("--save " + dir_ + "/none.json --threads N"), std::string::npos)
      << p.basis;
  EXPECT_NE(DescribePrediction(p).find("compute not predicted"), std::string::npos);
  for (const char* bad : {R"({"coef": 3})", R"({"coef": [1, "x", 2]})", R"({"coef": [1, -1, 2]})",
                          R"({"coef": [1, 1, 1], "threads": 0})", "not json"}) {
    ASSERT_TRUE(WriteFileAtomic(dir_ + "/bad.json", bad).ok());
    const StepPrediction q = PredictStep(cfg_, 1, 1, 2, dir_ + "/bad.json");
    EXPECT_FALSE(q.have_compute) << bad;
    EXPECT_NE(q.basis.find("is not a calibration"), std::string::npos) << q.basis;
  }
  // Tensor and pipeline ranks: not predicted.
  RunConfig tp = cfg_;
  tp.parallel.tp = 2;
  EXPECT_FALSE(PredictStep(tp, 1, 1, 2, cal_).have_compute);
}

TEST_F(PredictTest, MeasuredPartsAreMediansAfterTheWarmUp) {
  // Two warm-up steps; an exchange's 30 ms at step 3; the last step's final exchange (90 ms) is
  // not a step's share; one slow step.
  const StepParts m = MeasuredParts({900, 800, 130, 100, 101, 500, 192}, {0, 0, 30, 0, 0, 0, 90},
                                    /*in_site_s=*/0.002, /*skip=*/2);
  EXPECT_NEAR(m.wan_s, 0.030 / 4, 1e-12);          // the mean over steps 3..6
  EXPECT_NEAR(m.compute_s, 0.101 - 0.002, 1e-12);  // the median of step - wan, less in-site
  EXPECT_NEAR(m.in_site_s, 0.002, 1e-12);
  const StepPrediction p = PredictStep(cfg_, 1, 1, 2, cal_);
  const auto rows = nlohmann::json::parse(ComparisonJson(p, m));
  ASSERT_EQ(rows.size(), 4u);
  EXPECT_EQ(rows[0]["part"], "compute");
  EXPECT_NEAR(rows[0]["measured_ms"].get<double>(), 99, 1e-9);
  EXPECT_NEAR(rows[3]["predicted_ms"].get<double>(), p.parts.total() * 1e3, 1e-9);
  EXPECT_NE(DescribeComparison(p, m).find("WAN wait"), std::string::npos);
}

}  // namespace
}  // namespace atl
