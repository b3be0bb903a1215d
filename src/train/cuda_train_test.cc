// Training on the GPU (train.device = "cuda") against the CPU: the loss curve over 20 steps within
// 1e-4 relative, two GPU runs with the same bits, and checkpoints that cross devices. Skipped,
// saying why, where no GPU is usable; train.device's refusals are checked everywhere.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "model/backend.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/test_util.h"

namespace atl {
namespace {

class CudaTrainTest : public TrainerTest {
 protected:
  void SetUp() override {
    std::string why;
    if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
    TrainerTest::SetUp();
    cfg_.train.steps = 20;
    gpu_ = cfg_;
    gpu_.train.device = "cuda";
  }
  RunConfig gpu_;
};

TEST_F(CudaTrainTest, LossCurveMatchesTheCpuOver20Steps) {
  const auto cpu = Metrics(Run(cfg_, "cpu")), gpu = Metrics(Run(gpu_, "gpu"));
  ASSERT_EQ(cpu.size(), 20u);
  ASSERT_EQ(gpu.size(), 20u);
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double a = cpu[i]["loss"].get<double>(), b = gpu[i]["loss"].get<double>();
    EXPECT_NEAR(b, a, 1e-4 * std::abs(a)) << "step " << i + 1;
    if (cpu[i].contains("val_loss")) {
      ASSERT_TRUE(gpu[i].contains("val_loss"));
      const double va = cpu[i]["val_loss"].get<double>(), vb = gpu[i]["val_loss"].get<double>();
      EXPECT_NEAR(vb, va, 1e-4 * std::abs(va)) << "step " << i + 1;
    }
  }
  EXPECT_LT(gpu.back()["loss"].get<double>(), gpu.front()["loss"].get<double>() - 0.5);
}

TEST_F(CudaTrainTest, TwoRunsGiveTheSameBits) {
  const std::string a = Run(gpu_, "a"), b = Run(gpu_, "b");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  EXPECT_EQ(FinalState(a), FinalState(b));
}

// Also with the step guard off (no op hook: the GPU path without host copies of the operands).
TEST_F(CudaTrainTest, TheGuardDoesNotChangeTheRun) {
  RunConfig plain = gpu_;
  plain.sdc.guard = false;
  EXPECT_EQ(FinalState(Run(gpu_, "guarded")), FinalState(Run(plain, "plain")));
}

// A GPU checkpoint resumed on the CPU continues as the GPU run does (within rounding), and the
// other way round.
TEST_F(CudaTrainTest, CheckpointsCrossDevices) {
  for (const bool from_gpu : {true, false}) {
    SCOPED_TRACE(from_gpu ? "GPU -> CPU" : "CPU -> GPU");
    RunConfig first = from_gpu ? gpu_ : cfg_, second = from_gpu ? cfg_ : gpu_;
    first.train.checkpoint_every = 10;
    second.train.checkpoint_every = 10;
    const std::string full = Run(first, from_gpu ? "gpu_full" : "cpu_full");
    auto ck = LoadCheckpoint(full + "/checkpoint-10", true);
    ASSERT_TRUE(ck.ok()) << ck.status().ToString();
    const std::string resumed = Run(second, from_gpu ? "on_cpu" : "on_gpu", &*ck);
    const auto all = Metrics(full), rest = Metrics(resumed);
    ASSERT_EQ(rest.size(), 10u);
    for (size_t i = 0; i < rest.size(); ++i) {
      const double a = all[10 + i]["loss"].get<double>(), b = rest[i]["loss"].get<double>();
      EXPECT_NEAR(b, a, 1e-4 * std::abs(a)) << "step " << 11 + i;
    }
  }
}

// Checked everywhere, with or without a GPU: an unknown device is refused; a split model on the
// GPU is a valid config (tests/mpi's layout tests train one on the CUDA emulator).
TEST(CudaTrainConfig, TheDeviceKeyIsChecked) {
  RunConfig c;
  c.train.device = "gpu";
  const Status st = ValidateRunConfig(c);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("train.device"), std::string::npos) << st.ToString();
  c.train.device = "cuda";
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.model.n_head = 4;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).ToString();
}

// Without a GPU, train.device = "cuda" is bad input (exit 2) saying why.
TEST_F(TrainerTest, WithoutAGpuCudaIsRefusedWithTheReason) {
  std::string why;
  if (DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "a GPU is here";
  RunConfig c = cfg_;
  c.train.device = "cuda";
  auto r = TryRun(c, "refused");
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(r.status().ExitCode(), 2);
  EXPECT_NE(r.status().message().find("train.device = cuda"), std::string::npos);
  EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().ToString();
}

}  // namespace
}  // namespace atl
