// Calibration on synthetic runs whose step times come from known constants plus noise: the fit
// must recover the constants and predict every run within 15%. And the ways a run directory can
// be wrong.
#include "plan/calibrate.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "core/rng.h"

namespace atl::plan {
namespace {

namespace fs = std::filesystem;

struct Shape {
  int64_t layers, embd, heads, seq, micro, tokens;
  int64_t vocab = 1024;
};

// Machine constants the synthetic runs obey.
constexpr double kFlops = 80e9;       // effective FLOP/s
constexpr double kPerMatmul = 40e-6;  // seconds per matmul
constexpr double kPerParam = 3e-9;    // seconds per parameter per step

class CalibrateTest : public testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::path(testing::TempDir()) / ("plan_calibrate_" + std::to_string(::getpid()));
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // Writes RUN/config.json (or config.toml) and RUN/metrics.jsonl with `steps` steps whose times
  // follow the constants, with +-noise relative jitter, and a slow first step (warm-up).
  std::string WriteRun(const std::string& name, const Shape& s, int steps, double noise,
                       bool toml = false) {
    fs::path dir = root_ / name;
    fs::create_directories(dir);
    // The trainer writes config.toml ([model], [train]); checkpoints carry the HF config.json.
    std::ofstream cfg(dir / "config.toml");
    if (toml) {
      cfg << "[model]\nn_layer = " << s.layers << "\nn_head = " << s.heads
          << "\nn_embd = " << s.embd << "\nseq_len = " << s.seq << "\nvocab_size = " << s.vocab
          << "\n";
    } else {
      std::ofstream(dir / "config.json")
          << "{\"model_type\": \"gpt2\", \"n_layer\": " << s.layers << ", \"n_head\": " << s.heads
          << ", \"n_embd\": " << s.embd << ", \"n_positions\": " << s.seq
          << ", \"vocab_size\": " << s.vocab << "}";
    }
    cfg << "[train]\nbatch_size = " << s.tokens / s.seq
        << "\nmicro_batch_size = " << s.micro / s.seq << "\nlr = 0.0006\n";
    cfg.close();
    CalibrationRun shape;
    shape.n_layer = s.layers;
    shape.n_embd = s.embd;
    shape.seq_len = s.seq;
    shape.vocab_size = s.vocab;
    shape.micro_batch_tokens = s.micro;
    auto f = StepFeatures(shape, static_cast<double>(s.tokens));
    double t = f[0] / kFlops + f[1] * kPerMatmul + f[2] * kPerParam;
    std::ofstream out(dir / "metrics.jsonl");
    for (int i = 1; i <= steps; ++i) {
      double jitter = 1 + noise * (2 * RandomUniform(7, i, RngPurpose::kTest, s.layers) - 1);
      double step = (i == 1 ? 5 * t : t * jitter);
      out << "{\"step\": " << i << ", \"loss\": 5.0, \"lr\": 0.0006, \"grad_norm\": 1.0, "
          << "\"tokens\": " << i * s.tokens << ", \"tokens_per_s\": " << s.tokens / step
          << ", \"step_ms\": " << step * 1000 << "}\n";
    }
    return (dir / "metrics.jsonl").string();
  }

  fs::path root_;
};

TEST_F(CalibrateTest, RecoversTheConstantsAndPredictsWithin15Percent) {
  // Small vocabularies and microbatches so the per-matmul overhead is a visible share of some
  // runs (as on a CPU), and large ones where arithmetic dominates.
  const Shape shapes[] = {{2, 64, 4, 64, 64, 2048},
                          {4, 128, 4, 128, 256, 4096},
                          {8, 256, 8, 128, 1024, 8192},
                          {12, 384, 6, 256, 2048, 8192},
                          {6, 512, 8, 256, 4096, 16384, 50257}};
  std::vector<CalibrationRun> runs;
  int k = 0;
  for (const Shape& s : shapes) {
    auto run = LoadCalibrationRun(WriteRun("run" + std::to_string(k++), s, 30, 0.03), {}, 2);
    ASSERT_TRUE(run.ok()) << run.status().ToString();
    EXPECT_EQ(run->steps_used, 28);
    EXPECT_DOUBLE_EQ(run->tokens_per_step, static_cast<double>(s.tokens));
    runs.push_back(*run);
  }
  auto fit = FitCalibration(&runs);
  ASSERT_TRUE(fit.ok()) << fit.status().ToString();
  EXPECT_TRUE(fit->used[0]);
  EXPECT_NEAR(fit->flops_per_s() / kFlops, 1.0, 0.1);
  EXPECT_TRUE(fit->used[1]);
  EXPECT_NEAR(fit->coef[1] / kPerMatmul, 1.0, 0.25);
  EXPECT_LE(fit->max_relative_error, 0.15);
  for (const auto& r : runs) EXPECT_NEAR(r.predicted_s / r.step_s, 1.0, 0.15) << r.metrics_path;
  std::string report = CalibrationReport(runs, *fit);
  EXPECT_NE(report.find("every run within 15%"), std::string::npos) << report;
  EXPECT_EQ(CalibrationJson(runs, *fit)["runs"].size(), runs.size());
}

TEST_F(CalibrateTest, OneRunFitsOnlyTheFlopRate) {
  auto run = LoadCalibrationRun(WriteRun("one", {4, 192, 4, 128, 1024, 4096}, 20, 0.0), {}, 2);
  ASSERT_TRUE(run.ok());
  std::vector<CalibrationRun> runs = {*run};
  auto fit = FitCalibration(&runs);
  ASSERT_TRUE(fit.ok());
  EXPECT_TRUE(fit->used[0]);
  EXPECT_FALSE(fit->used[1]);
  EXPECT_FALSE(fit->used[2]);
  EXPECT_NEAR(runs[0].predicted_s, runs[0].step_s, 1e-9 * runs[0].step_s);
}

TEST_F(CalibrateTest, ReadsTheTrainersTomlAndFlags) {
  Shape s{4, 192, 4, 128, 1024, 4096};
  auto run = LoadCalibrationRun(WriteRun("toml", s, 10, 0.0, /*toml=*/true), {}, 2);
  ASSERT_TRUE(run.ok()) << run.status().ToString();
  EXPECT_EQ(run->n_layer, 4);
  EXPECT_EQ(run->seq_len, 128);
  EXPECT_EQ(run->micro_batch_tokens, 1024);
  ShapeOverrides o;
  o.n_layer = 6;
  auto over = LoadCalibrationRun((root_ / "toml" / "metrics.jsonl").string(), o, 2);
  ASSERT_TRUE(over.ok());
  EXPECT_EQ(over->n_layer, 6);
}

TEST_F(CalibrateTest, RefusesBrokenRuns) {
  EXPECT_EQ(LoadCalibrationRun((root_ / "none/metrics.jsonl").string(), {}, 2).status().code(),
            StatusCode::kNotFound);
  // No shape anywhere: the error names what is missing and the flag that supplies it.
  fs::create_directories(root_ / "noshape");
  std::ofstream(root_ / "noshape/metrics.jsonl")
      << "{\"step\":1,\"tokens_per_s\":1,\"step_ms\":1}\n";
  auto noshape = LoadCalibrationRun((root_ / "noshape/metrics.jsonl").string(), {}, 0);
  EXPECT_EQ(noshape.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(noshape.status().message().find("--n-layer"), std::string::npos);
  // A torn line: corruption, with its line number.
  std::string path = WriteRun("torn", {2, 128, 4, 64, 512, 1024}, 5, 0.0);
  std::ofstream(path, std::ios::app) << "{\"step\": 6, \"tokens_per_s\": 10\n";
  auto torn = LoadCalibrationRun(path, {}, 2);
  EXPECT_EQ(torn.status().code(), StatusCode::kCorruption);
  EXPECT_NE(torn.status().message().find(":6:"), std::string::npos) << torn.status().message();
  // Only warm-up steps.
  std::string short_run = WriteRun("short", {2, 128, 4, 64, 512, 1024}, 2, 0.0);
  EXPECT_EQ(LoadCalibrationRun(short_run, {}, 2).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl::plan
