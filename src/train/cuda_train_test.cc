// Training on the GPU (train.device = "cuda") against the CPU: the loss curve over 20 steps within
// 1e-4 relative, two GPU runs with the same bits, bf16 runs, the detectors reading the GPU, and
// checkpoints that cross devices (cuda_model_test.cc: the model and optimizer without the
// trainer). Skipped, saying why, where no GPU is usable; train.device's refusals are checked
// everywhere.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/optimizer.h"
#include "train/sdc/fingerprint.h"
#include "train/sdc/memory.h"
#include "train/sdc/monitor.h"
#include "train/test_util.h"

namespace atl {
namespace {

// The process's GPU settings that a run sets (bf16 products, the attention's block rows and
// backward kind) back as they were, whatever happens.
struct AttentionSettingsBack {
  kernels::AttentionBlockRows rows = SetAttentionBlockRows({});
  kernels::AttentionBackwardKind kind =
      SetAttentionBackwardKind(kernels::AttentionBackwardKind::kSplit);
  ~AttentionSettingsBack() {
    SetBf16Matmul(false);
    SetAttentionBlockRows(rows);
    SetAttentionBackwardKind(kind);
  }
};

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
  // The training loss of run `got` within rel (relative) of run `want`'s, step by step.
  static void ExpectLossesNear(const std::string& got, const std::string& want, double rel) {
    const auto g = Metrics(got), w = Metrics(want);
    ASSERT_EQ(g.size(), w.size());
    for (size_t i = 0; i < g.size(); ++i) {
      const double x = g[i]["loss"].get<double>(), y = w[i]["loss"].get<double>();
      EXPECT_NEAR(x, y, rel * std::abs(y)) << "step " << i + 1;
    }
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

// train.init_from on the GPU: the weights written into the host's copy reach the GPU before the
// first step (a run from trained weights, on the GPU as on the CPU within 1e-4, its first loss far
// below a random start's).
TEST_F(CudaTrainTest, InitFromWeightsReachesTheGpu) {
  cfg_.train.steps = 6;
  const std::string trained = Run(cfg_, "trained") + "/checkpoint";
  RunConfig cpu = cfg_, gpu = gpu_;
  gpu.train.steps = cpu.train.steps = 4;
  const double fresh = Metrics(Run(gpu, "fresh"))[0]["loss"].get<double>();
  cpu.train.init_from = gpu.train.init_from = trained;
  const std::string c = Run(cpu, "cpu"), g = Run(gpu, "gpu");
  ASSERT_EQ(Metrics(c).size(), 4u);
  ExpectLossesNear(g, c, 1e-4);
  EXPECT_LT(Metrics(g)[0]["loss"].get<double>(), fresh - 0.3);
}

TEST_F(CudaTrainTest, TwoRunsGiveTheSameBits) {
  const std::string a = Run(gpu_, "a"), b = Run(gpu_, "b");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  EXPECT_EQ(FinalState(a), FinalState(b));
}

// With the step guard and the memory checks off (no op hook, no hashing) the run has the bits of
// the checked run, whose checks read the GPU's activations and state (they change nothing).
TEST_F(CudaTrainTest, TheChecksDoNotChangeTheRun) {
  RunConfig plain = gpu_;
  plain.sdc.guard = false;
  plain.sdc.memory = false;
  EXPECT_EQ(FinalState(Run(gpu_, "checked")), FinalState(Run(plain, "plain")));
  EXPECT_EQ(LossColumns(Run(gpu_, "checked2")), LossColumns(Run(plain, "plain2")));
}

#if ATOLL_HAVE_CUDA
// The default checks (the step guard, the memory checks) read the GPU's state where it lives: a
// step moves a few kilobytes between the host and the GPU (token ids, the loss, a max |x| per
// block output, 8 bytes a tensor per hash), not the model. Per step: what two runs of 2 and 6
// steps moved apart, divided by 4 (the setup and the final checkpoint cancel), after a run that
// leaves the hashes' range tables on the GPU (kept there for the process, as in a long run).
TEST_F(CudaTrainTest, TheDefaultChecksReadTheGpuWhereItIs) {
  RunConfig c = gpu_;
  c.model.n_embd = 64;  // the model's bytes well above what a step must move
  c.train.eval_batches = 0;
  const std::vector<ParamTensor> layout = ParameterLayout(c.model);
  const double model_bytes = double(layout.back().offset + layout.back().numel) * sizeof(float);
  auto per_step = [&](const RunConfig& cfg, const std::string& name) {
    kernels::cuda::CopyCounts at[2];
    RunConfig warm = cfg;
    warm.train.steps = 1;
    Run(warm, name + "_warm");
    for (const int64_t steps : {2, 6}) {
      RunConfig r = cfg;
      r.train.steps = steps;
      const auto before = kernels::cuda::Copied();
      Run(r, name + std::to_string(steps));
      const auto after = kernels::cuda::Copied();
      at[steps == 6] = {after.to_device - before.to_device, after.to_host - before.to_host};
    }
    return std::pair{double(at[1].to_device - at[0].to_device) / 4,
                     double(at[1].to_host - at[0].to_host) / 4};
  };
  RunConfig plain = c;
  plain.sdc.guard = false;
  plain.sdc.memory = false;
  const auto [up, down] = per_step(c, "checked");
  const auto [plain_up, plain_down] = per_step(plain, "plain");
  std::printf("bytes a step, up and down: checked %.0f, %.0f; unchecked %.0f, %.0f; model %.0f\n",
              up, down, plain_up, plain_down, model_bytes);
  EXPECT_LT(up, model_bytes / 20);
  EXPECT_LT(down, model_bytes / 20);
  EXPECT_GE(up, plain_up);
  EXPECT_GE(down, plain_down);
}

// A parameter or moment flipped at rest in a GPU run is found by the memory checks, hashing the
// GPU's buffers, at the start of the step it would first be used in, and named (alone: not
// repaired).
TEST_F(CudaTrainTest, MemoryChecksFindFlipsInTheGpusState) {
  RunConfig c = gpu_;
  c.faults.inject =
      "param:step=1,elem=3,bit=5;param:step=6,elem=40,bit=0;"
      "moment:step=9,moment=v,elem=5,bit=2";
  const auto events = SdcEvents(Run(c, "flipped"), "memory");
  ASSERT_EQ(events.size(), 3u);
  const int steps[] = {1, 6, 9};
  const char* what[] = {"params:wte.weight", "params:wte.weight", "moment_v:wte.weight"};
  for (size_t i = 0; i < events.size(); ++i) {
    EXPECT_EQ(events[i].first, steps[i]);
    EXPECT_EQ(events[i].second["what"], what[i]);
    EXPECT_EQ(events[i].second["verdict"], "not repaired");
  }
}

// A bit flipped in GPU memory, where no host copy sees it: the seal over the GPU's buffers names
// the tensor (parameters and moments), the replicas' fingerprints differ in that tensor alone,
// and a host read afterwards gets the GPU's copy, the one the checks saw.
TEST(CudaSdc, TheMemoryChecksSeeAFlipInGpuMemory) {
  std::string why;
  if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  const GPTConfig c{.vocab_size = 64, .seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};
  GPT<float> gpu(c, 2, {}, 1, Device::kCuda);
  gpu.InitParameters(5);
  AdamW opt(gpu.layout(), {});
  opt.PlaceOnDevice();
  const GPT<float>& view = gpu;
  (void)view.params();  // the host's copy, current now
  RestSeal seal(gpu.layout(), opt.size(), false, Device::kCuda, Device::kCuda);
  seal.Seal(gpu.resident_params(), opt.resident_m(), opt.resident_v());
  EXPECT_TRUE(seal.Verify(gpu.resident_params(), opt.resident_m(), opt.resident_v()).empty());
  const std::vector<uint64_t> clean =
      TensorFingerprints(gpu.layout(), gpu.resident_params(), Device::kCuda);
  auto flip = [](const float* at) {  // bit 3 of one word, in GPU memory alone
    uint32_t w = 0;
    kernels::cuda::CopyToHost(&w, at, sizeof w);
    w ^= 8u;
    kernels::cuda::CopyToDevice(const_cast<float*>(at), &w, sizeof w);
  };
  const ParamTensor& t = gpu.layout()[3];
  const size_t k = t.offset + t.numel / 2;
  const float before = view.params()[k];
  flip(gpu.resident_params() + k);
  flip(opt.resident_v() + 7);  // in wte
  EXPECT_EQ(seal.Verify(gpu.resident_params(), opt.resident_m(), opt.resident_v()),
            (std::vector<std::string>{"params:" + ShortTensorName(t.name), "moment_v:wte.weight"}));
  const std::vector<uint64_t> now =
      TensorFingerprints(gpu.layout(), gpu.resident_params(), Device::kCuda);
  for (size_t i = 0; i < now.size(); ++i) EXPECT_EQ(now[i] != clean[i], i == 3) << i;
  uint32_t a, b;
  const float after = view.params()[k];
  std::memcpy(&a, &before, 4);
  std::memcpy(&b, &after, 4);
  EXPECT_EQ(a ^ b, 8u);
}
#endif

#if ATOLL_HAVE_CUDA
// The step guard's activation signal on the GPU: each block's max |output| over the step's
// micro-batches kept there (no wait a block output) and read at once, the same as the host's
// from the same outputs, a non-finite one making it infinity; the next step starts from zero.
TEST(CudaSdc, TheGuardKeepsTheStepsActivationMaximaOnTheGpu) {
  std::string why;
  if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  SdcOptions o;
  o.fingerprints = o.memory = false;
  SdcMonitor gpu(o, {}, 0, 0, 0, nullptr, {}, false), host(o, {}, 0, 0, 0, nullptr, {}, false);
  std::mt19937 gen(3);
  std::normal_distribution<float> dist(0.0f, 2.0f);
  std::vector<std::vector<float>> outs(6, std::vector<float>(70000));
  for (auto& x : outs)
    for (float& v : x) v = dist(gen);
  outs[4][123] = std::numeric_limits<float>::quiet_NaN();
  std::vector<kernels::cuda::DeviceArray<float>> on_gpu;
  for (const auto& x : outs) on_gpu.push_back(kernels::cuda::ToDevice(x));
  // Two micro-batches of blocks 0, 1 and 3 (block 2 unseen); the NaN in block 1's second.
  const int layer[] = {0, 1, 3, 0, 1, 3};
  gpu.OnActivation(3, on_gpu[0].data(), outs[0].size(), true);  // buffer and scratch allocated
  host.OnActivation(3, outs[0].data(), outs[0].size());
  const uint64_t waits = DeviceWaits();
  for (size_t i = 0; i < outs.size(); ++i) {
    gpu.OnActivation(layer[i], on_gpu[i].data(), outs[i].size(), true);
    host.OnActivation(layer[i], outs[i].data(), outs[i].size());
  }
  EXPECT_EQ(DeviceWaits(), waits);
  const std::vector<double> want = host.activation_maxima();
  ASSERT_EQ(want.size(), 4u);
  EXPECT_EQ(want[2], 0.0);
  EXPECT_EQ(want[1], std::numeric_limits<double>::infinity());
  EXPECT_GT(want[0], 5.0);
  EXPECT_EQ(gpu.activation_maxima(), want);
  // AfterStep reads and clears them.
  ASSERT_TRUE(gpu.AfterStep(0, 1.0, 1.0, 0.0, nullptr, nullptr, nullptr).ok());
  gpu.OnActivation(0, on_gpu[2].data(), outs[2].size(), true);
  float m = 0;
  for (float v : outs[2]) m = std::max(m, std::abs(v));
  EXPECT_EQ(gpu.activation_maxima(), (std::vector<double>{double(m), 0.0, 0.0, 0.0}));
}
#endif

// bf16 products (train.precision = bf16): the loss curve near the fp32 GPU run's (within bf16's
// rounding), falling as much; two bf16 runs give the same bits; and not fp32's bits (the setting
// takes effect, and the fp32 run after it resets it).
TEST_F(CudaTrainTest, Bf16FollowsFp32AndRepeatsItself) {
  RunConfig bf = gpu_;
  bf.train.precision = "bf16";
  struct Reset {  // the process's setting back to float, whatever happens here
    ~Reset() { SetBf16Matmul(false); }
  } reset;
  const std::string a = Run(bf, "bf16_a"), b = Run(bf, "bf16_b"), f = Run(gpu_, "fp32");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  EXPECT_EQ(FinalState(a), FinalState(b));
  EXPECT_NE(LossColumns(a), LossColumns(f));
  ExpectLossesNear(a, f, 2e-2);
  const auto mb = Metrics(a);
  EXPECT_LT(mb.back()["loss"].get<double>(), mb.front()["loss"].get<double>() - 0.5);
}

// The fused attention backward (dQ's partial sums from the dK/dV kernel) in training, at T = 80:
// two key blocks, so its dq is the split's products summed in another order. Its run repeats
// itself bit for bit, is not the split's bits (the sums ran), and follows the split's loss curve
// within float rounding's growth over the steps (not bf16's).
// (train.attention_backward = fused.) Each run sets the process's kind from its config, the
// split run between the fused ones too.
TEST_F(CudaTrainTest, Bf16FusedAttentionBackwardTrainsAsTheSplit) {
  RunConfig bf = gpu_;
  bf.train.precision = "bf16";
  bf.model.seq_len = 80;
  bf.train.steps = 8;
  const AttentionSettingsBack reset;
  RunConfig fused = bf;
  fused.train.attention_backward = "fused";
  auto kind_in_force = [] {
    const kernels::AttentionBackwardKind k =
        SetAttentionBackwardKind(kernels::AttentionBackwardKind::kSplit);
    SetAttentionBackwardKind(k);
    return std::string(ToString(k));
  };
  const std::string a = Run(fused, "fused_a");
  EXPECT_EQ(kind_in_force(), "fused");
  const std::string split = Run(bf, "split");
  EXPECT_EQ(kind_in_force(), "split");
  const std::string b = Run(fused, "fused_b");
  EXPECT_EQ(LossColumns(a), LossColumns(b));
  EXPECT_EQ(FinalState(a), FinalState(b));
  EXPECT_NE(FinalState(a), FinalState(split));
  ExpectLossesNear(a, split, 1e-4);
}

// train.attention_rows: auto (the block rows timed when the run starts; on the emulator not
// timed, the default kept) and each fixed setting give the same bits, and the setting in force
// after a run is the one it asked for; auto's log line says what it timed, or why it did not.
TEST_F(CudaTrainTest, Bf16AttentionRowsAutoOrFixedGiveTheSameBits) {
  RunConfig bf = gpu_;
  bf.train.precision = "bf16";
  bf.model.seq_len = 80;
  bf.train.steps = 3;
  bf.train.eval_batches = 0;
  const AttentionSettingsBack reset;
  SetAttentionBlockRows({128, 128});  // auto starts from the default whatever was in force
  testing::internal::CaptureStderr();
  const std::string want = FinalState(Run(bf, "auto"));
  const std::string log = testing::internal::GetCapturedStderr();
  const std::string chosen = ToString(SetAttentionBlockRows({}));
  if (GpuEmulated()) {
    EXPECT_NE(log.find("train.attention_rows = auto: 64/64 (not timed: on the CUDA emulator"),
              std::string::npos)
        << log;
    EXPECT_EQ(chosen, "64/64");
  } else {
    EXPECT_NE(
        log.find("train.attention_rows = auto: " + chosen + " (forward + backward ms: 64/64 "),
        std::string::npos)
        << log;
  }
  for (const char* rows : {"128/128", "64/64", "128/64", "64/128"}) {
    RunConfig fixed = bf;
    fixed.train.attention_rows = rows;
    std::string name = std::string("rows_") + rows;
    std::replace(name.begin(), name.end(), '/', '_');
    const std::string dir = Run(fixed, name);
    EXPECT_EQ(ToString(SetAttentionBlockRows({})), rows);
    EXPECT_EQ(FinalState(dir), want) << rows;
  }
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
  c.train.device = "cpu";
  c.train.precision = "bf16";  // on the CPU
  const Status cpu_bf16 = ValidateRunConfig(c);
  EXPECT_EQ(cpu_bf16.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(cpu_bf16.message().find("train.precision"), std::string::npos) << cpu_bf16.ToString();
  c.train.device = "cuda";
  c.train.precision = "fp16";
  EXPECT_NE(ValidateRunConfig(c).message().find("must be fp32 or bf16"), std::string::npos);
  c.train.precision = "bf16";
  c.sdc.checksums = true;  // their bound is float32's
  EXPECT_NE(ValidateRunConfig(c).message().find("sdc.checksums"), std::string::npos);
  c.sdc.checksums = false;
  c.parallel.tp = 2;
  c.parallel.pp = 2;
  c.model.n_head = 4;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).ToString();
  // The attention kernel's limit: head size 128 runs, 129 is refused, on the GPU only.
  c.model.n_embd = 4 * 129;
  EXPECT_NE(ValidateRunConfig(c).message().find("head sizes up to 128"), std::string::npos);
  c.model.n_embd = 4 * 128;
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).ToString();
  c.model.n_embd = 4 * 129;
  c.train.device = "cpu";
  c.train.precision = "fp32";
  EXPECT_TRUE(ValidateRunConfig(c).ok()) << ValidateRunConfig(c).ToString();
  // NCCL moves GPU memory: refused on the CPU; an unknown backend is refused by name.
  c.parallel.comm = "nccl";
  EXPECT_NE(ValidateRunConfig(c).message().find("nccl needs train.device = cuda"),
            std::string::npos);
  c.parallel.comm = "gloo";
  EXPECT_NE(ValidateRunConfig(c).message().find("parallel.comm"), std::string::npos);
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
