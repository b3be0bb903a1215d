// Training on the GPU (train.device = "cuda") against the CPU: the loss curve over 20 steps within
// 1e-4 relative, two GPU runs with the same bits, checkpoints that cross devices, and the
// optimizer on the GPU against the CPU's without a transfer per step. Skipped, saying why, where
// no GPU is usable; train.device's refusals are checked everywhere.
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

#if ATOLL_HAVE_CUDA  // kernels::cuda's counts and probe
// bf16 copies (GPT::set_bf16_copies): a forward and backward give the same loss and gradients,
// bit for bit, with them as without, and round fewer elements: each block's four product inputs
// (ln1, atty, ln2, fch_gelu: N (2 C + C / tp + 4 C / tp)) and lnf's (N C), once in the forward
// and once in the backward; in the backward each block's dout of mlp.c_proj and attn.c_proj
// (dresidual, twice N C), of mlp.c_fc (dfch, 4 N C / tp) and of attn.c_attn (dqkv, 3 N C / tp);
// and the products' weights (twice), for one rounding of all the parameters, by the first
// forward after they change only; and on the tensor cores the Q, K, V the attention forward
// keeps for its backward (3 N C / tp a block). After the parameters change too. The whole model and
// a tensor-parallel shard (its all-reduces left out: the same either way); C / tp a multiple of
// 128, so that every weight is read from the copy of the parameters (GPT::set_bf16_copies).
TEST(CudaModel, Bf16CopiesChangeNoBitAndRoundLess) {
  std::string why;
  if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  SetBf16Matmul(true);
  struct Reset {
    ~Reset() { SetBf16Matmul(false); }
  } reset;
  const GPTConfig wide{.vocab_size = 96, .seq_len = 16, .n_layer = 3, .n_head = 4, .n_embd = 256};
  GPTConfig narrow = wide;  // C = 64: some weights' offsets are not multiples of 128
  narrow.n_embd = 64;
  const int B = 3, N = B * wide.seq_len;
  std::vector<int32_t> tokens(size_t(N) + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 37 + 11) % 96);
  struct Case {
    GPTConfig cfg;
    ModelShard shard;
  };
  for (const auto& [cfg, shard] :
       {Case{wide, {}}, Case{wide, {.tp_rank = 1, .tp_size = 2}}, Case{narrow, {}}}) {
    SCOPED_TRACE(testing::Message() << "C " << cfg.n_embd << " tp " << shard.tp_size);
    GPT<float> model(cfg, B, shard, 1, Device::kCuda);
    if (shard.tp_size > 1) model.set_tensor_parallel([](float*, size_t) {});
    model.InitParameters(7);
    struct Pass {
      float loss;
      std::vector<float> grads;
      uint64_t rounded;
    };
    auto pass = [&](bool copies) {
      model.set_bf16_copies(copies);
      model.ZeroGrad();
      const uint64_t before = kernels::cuda::Bf16RoundedElements();
      Pass p;
      p.loss = model.Forward(tokens.data(), tokens.data() + 1, B, cfg.seq_len);
      model.Backward(1.0f);
      p.rounded = kernels::cuda::Bf16RoundedElements() - before;
      p.grads.assign(model.grads(), model.grads() + model.num_params());
      return p;
    };
    auto same = [](const Pass& a, const Pass& b) {
      return std::memcmp(&a.loss, &b.loss, sizeof(float)) == 0 &&
             a.grads.size() == b.grads.size() &&
             std::memcmp(a.grads.data(), b.grads.data(), a.grads.size() * 4) == 0;
    };
    // With the copies first: the floats the copies replace (ln1, ln2, fch_gelu, lnf are then not
    // written) still hold the allocation's zeros, so a product reading one would be seen.
    const Pass copied = pass(true), plain = pass(false);
    EXPECT_TRUE(same(plain, copied));
    const uint64_t C = uint64_t(cfg.n_embd), tp = uint64_t(shard.tp_size);
    const uint64_t L = uint64_t(cfg.n_layer);
    const uint64_t per_pass = L * N * (2 * C + C / tp + 4 * C / tp) + N * C;
    const uint64_t douts = L * N * (2 * C + 4 * C / tp + 3 * C / tp);
    uint64_t weights = 0, unaligned = 0;  // what the products multiply by (read from the copy)
    for (const ParamTensor& t : model.layout())
      if (t.kind == ParamKind::kWte || t.kind == ParamKind::kAttnW ||
          t.kind == ParamKind::kAttnProjW || t.kind == ParamKind::kFcW ||
          t.kind == ParamKind::kFcProjW) {
        if (t.offset % 128 == 0)
          weights += t.numel;
        else
          ++unaligned;
      }
    EXPECT_EQ(unaligned > 0, cfg.n_embd == 64);
    const uint64_t params = model.num_params();  // rounded once, by the first forward
    // Attention off the tensor cores (compute capability below 8) rounds its copies in passes
    // of their own: atty's and dqkv's.
    const bool tensor_cores = kernels::cuda::Probe().cc_major >= 8;
    const uint64_t passes = tensor_cores ? 0 : L * N * 4 * C / tp;
    // On the tensor cores the backward takes the Q, K, V its forward kept (3 N C / tp a block)
    // instead of rounding them again.
    const uint64_t kept = tensor_cores ? L * N * 3 * C / tp : 0;
    EXPECT_EQ(plain.rounded + params + passes - copied.rounded,
              2 * per_pass + douts + 2 * weights + kept);
    const Pass again = pass(true);  // the parameters have not changed: not rounded again
    EXPECT_TRUE(same(again, copied));
    EXPECT_EQ(copied.rounded - again.rounded, params);
    // New parameters: the next forward's copies are of the new activations.
    float* p = model.params();
    for (size_t i = 0; i < model.num_params(); ++i) p[i] *= 1.25f;
    const Pass copied2 = pass(true), plain2 = pass(false);
    EXPECT_FALSE(same(copied2, copied));
    EXPECT_TRUE(same(plain2, copied2));
  }
  {  // A device-reading op hook (the step guard's) leaves ln1, ln2 and fch_gelu in bf16 alone:
     // the forward GEMMs that read them give it no `a`; attn.c_proj's atty stays float. In the
     // backward, fc's dout (dfch) is its copy alone: that GEMM (2) gives no `a` either.
    GPT<float> model(wide, B, {}, 1, Device::kCuda);
    model.InitParameters(7);
    const float unhooked = model.Forward(tokens.data(), tokens.data() + 1, B, wide.seq_len);
    int gemms = 0, without_a = 0, backward_gemms = 0, backward_without_a = 0;
    model.set_op_hook(
        [&](const GPT<float>::OpEvent& e) {
          if (e.kind == GPT<float>::OpKind::kGemmBackward) {
            ++backward_gemms;
            backward_without_a += e.a == nullptr ? (e.gemm == 2 ? 1 : 100) : 0;
          }
          if (e.kind != GPT<float>::OpKind::kGemmForward) return;
          ++gemms;
          without_a += e.a == nullptr;
        },
        /*device_reader=*/true);
    const float hooked = model.Forward(tokens.data(), tokens.data() + 1, B, wide.seq_len);
    EXPECT_EQ(std::memcmp(&hooked, &unhooked, sizeof(float)), 0);
    EXPECT_EQ(gemms, 4 * wide.n_layer);
    EXPECT_EQ(without_a, 3 * wide.n_layer);
    model.Backward();
    EXPECT_EQ(backward_gemms, 4 * wide.n_layer);
    EXPECT_EQ(backward_without_a, wide.n_layer);
  }
  // Training steps with the optimizer on the GPU (which writes the parameters there): the same
  // parameters after each, with the copies as without.
  std::vector<float> trained[2];
  for (const bool copies : {false, true}) {
    GPT<float> model(wide, B, {}, 1, Device::kCuda);
    model.set_bf16_copies(copies);
    model.InitParameters(7);
    AdamW opt(model.layout(), AdamW::Hyper{});
    opt.PlaceOnDevice();
    for (int step = 0; step < 3; ++step) {
      model.ZeroGrad();
      model.Forward(tokens.data(), tokens.data() + 1, B, wide.seq_len);
      model.Backward(1.0f);
      opt.StepOnDevice(model.device_params(), model.device_grads(), 1e-2, 1.0f);
    }
    trained[copies].assign(model.params(), model.params() + model.num_params());
  }
  EXPECT_EQ(std::memcmp(trained[0].data(), trained[1].data(), trained[0].size() * 4), 0);
}
#endif

// Under bf16 products the GPU keeps the logits in bf16 alone (kernels/cuda/ops.h
// ClassifierForward): logits() gives them widened (each a bf16), near the float products' logits;
// the whole model and a vocabulary-parallel shard (its all-reduce left out). A backward after bf16
// products were switched off is refused: what it would read was not written.
TEST(CudaModel, Bf16LogitsAreKeptInBf16) {
  std::string why;
  if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  struct Reset {
    ~Reset() { SetBf16Matmul(false); }
  } reset;
  const GPTConfig c{.vocab_size = 96, .seq_len = 16, .n_layer = 2, .n_head = 4, .n_embd = 64};
  const int B = 2, N = B * c.seq_len;
  std::vector<int32_t> tokens(size_t(N) + 1);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 29 + 5) % 96);
  for (const ModelShard shard : {ModelShard{}, ModelShard{.tp_rank = 1, .tp_size = 2}}) {
    SCOPED_TRACE(testing::Message() << "tp " << shard.tp_size);
    GPT<float> model(c, B, shard, 1, Device::kCuda);
    if (shard.tp_size > 1) model.set_tensor_parallel([](float*, size_t) {});
    model.InitParameters(3);
    const size_t n = size_t(N) * size_t(c.vocab_size / shard.tp_size);
    SetBf16Matmul(false);
    const float loss32 = model.Forward(tokens.data(), tokens.data() + 1, B, c.seq_len);
    const std::vector<float> f(model.logits(), model.logits() + n);
    SetBf16Matmul(true);
    const float loss16 = model.Forward(tokens.data(), tokens.data() + 1, B, c.seq_len);
    const std::vector<float> h(model.logits(), model.logits() + n);
    double err = 0, norm = 0;
    size_t not_bf16 = 0;
    for (size_t i = 0; i < n; ++i) {
      uint32_t u;
      std::memcpy(&u, &h[i], sizeof(u));
      not_bf16 += (u & 0xffffu) != 0;
      err += (double(h[i]) - f[i]) * (double(h[i]) - f[i]);
      norm += double(f[i]) * f[i];
    }
    EXPECT_EQ(not_bf16, 0u);
    EXPECT_GT(err, 0.0);
    EXPECT_LT(std::sqrt(err / norm), 1e-2);
    EXPECT_NEAR(loss16, loss32, 1e-2 * loss32);
    model.Backward(1.0f);          // reads the bf16 logits
    model.set_bf16_copies(false);  // no other activation in bf16 alone: the logits refuse it
    model.Forward(tokens.data(), tokens.data() + 1, B, c.seq_len);
    SetBf16Matmul(false);
    EXPECT_THROW(model.Backward(1.0f), std::logic_error);
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

// max |a - b| over max |b|: a whole buffer's error in units of its scale.
double NormalizedError(const float* a, const float* b, size_t n) {
  double err = 0, scale = 0;
  for (size_t i = 0; i < n; ++i) {
    err = std::max(err, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return err / scale;
}

// The optimizer on the GPU (train/optimizer.h) beside the CPU's, three steps of a small model:
// the same parameters, moments, norms and update squares within rounding; after the first step's
// uploads no step moves parameters, gradients or moments between host and GPU; the host's copies
// are current when read (one download), and what the host writes reaches the next step.
TEST(CudaOptimizer, StepsStayOnTheGpuAndMatchTheCpu) {
  std::string why;
  if (!DeviceUsable(Device::kCuda, &why)) GTEST_SKIP() << "no GPU here (" << why << ")";
  SetBf16Matmul(false);  // float products, whatever a test before left (the process's setting)
  const GPTConfig c{.vocab_size = 64, .seq_len = 16, .n_layer = 2, .n_head = 2, .n_embd = 16};
  GPT<float> cpu(c, 2), gpu(c, 2, {}, 1, Device::kCuda);
  cpu.InitParameters(5);
  gpu.InitParameters(5);
  const size_t n = cpu.num_params();
  AdamW cpu_opt(cpu.layout(), {}), gpu_opt(gpu.layout(), {});
  gpu_opt.PlaceOnDevice();
  std::vector<int32_t> in(32), tg(32);
  for (size_t i = 0; i < in.size(); ++i) {
    in[i] = int32_t((i * 7) % 64);
    tg[i] = int32_t((i * 5 + 3) % 64);
  }
  uint64_t moved = 0;
  for (int step = 0; step < 3; ++step) {
    SCOPED_TRACE(step);
    for (GPT<float>* m : {&cpu, &gpu}) {
      m->ZeroGrad();
      m->Forward(in.data(), tg.data(), 2, 16);
      m->Backward();
    }
    const double sq_cpu = GradSquaredSum(cpu.grads(), n);
    const double sq_gpu = DeviceGradSquaredSum(gpu.device_grads(), n);
    EXPECT_NEAR(sq_gpu, sq_cpu, 1e-4 * sq_cpu);
    cpu_opt.Step(cpu.params(), cpu.grads(), 1e-2, ClipScale(std::sqrt(sq_cpu), 1.0));
    gpu_opt.StepOnDevice(gpu.device_params(), gpu.device_grads(), 1e-2,
                         ClipScale(std::sqrt(sq_gpu), 1.0));
    if (step == 0) {  // the parameters and the (zero) moments went up once
      moved = gpu.transfers() + gpu_opt.transfers();
      EXPECT_EQ(moved, 3 * n * sizeof(float));
    } else {
      EXPECT_EQ(gpu.transfers() + gpu_opt.transfers(), moved);
    }
    for (size_t t = 0; t < cpu.layout().size(); ++t)
      EXPECT_NEAR(gpu_opt.update_squares()[t], cpu_opt.update_squares()[t],
                  1e-3 * cpu_opt.update_squares()[t] + 1e-12)
          << cpu.layout()[t].name;
  }
  const GPT<float>& view = gpu;
  const AdamW& opt_view = gpu_opt;
  EXPECT_LT(NormalizedError(view.params(), cpu.params(), n), 1e-4);
  EXPECT_LT(NormalizedError(opt_view.m(), cpu_opt.m(), n), 1e-4);
  EXPECT_LT(NormalizedError(opt_view.v(), cpu_opt.v(), n), 1e-4);
  EXPECT_LT(NormalizedError(view.grads(), cpu.grads(), n), 1e-4);
  // One download each of the parameters, the gradients and the moments; reading again is free.
  const uint64_t read = gpu.transfers() + gpu_opt.transfers();
  EXPECT_EQ(read, moved + 4 * n * sizeof(float));
  (void)view.params(), (void)opt_view.m();
  EXPECT_EQ(gpu.transfers() + gpu_opt.transfers(), read);
  // What the host writes reaches the GPU: the next forward uploads it, and uses it.
  gpu.params()[0] += 1.0f;
  cpu.params()[0] += 1.0f;
  const float cpu_loss = cpu.Forward(in.data(), tg.data(), 2, 16);
  const float gpu_loss = gpu.Forward(in.data(), tg.data(), 2, 16);
  EXPECT_NEAR(gpu_loss, cpu_loss, 1e-4 * cpu_loss);
  EXPECT_EQ(gpu.transfers() + gpu_opt.transfers(), read + n * sizeof(float));
  // So do written gradients and moments: the next step uploads them (here without the update's
  // squares, which are then zero).
  for (float* g : {gpu.grads(), cpu.grads()}) g[1] = 3.0f;
  for (float* m : {gpu_opt.m(), cpu_opt.m()}) m[1] = 0.25f;
  for (float* v : {gpu_opt.v(), cpu_opt.v()}) v[1] = 0.5f;
  gpu_opt.set_update_squares(false);
  cpu_opt.Step(cpu.params(), cpu.grads(), 1e-2, 1.0f);
  gpu_opt.StepOnDevice(gpu.device_params(), gpu.device_grads(), 1e-2, 1.0f);
  EXPECT_LT(NormalizedError(view.params(), cpu.params(), n), 1e-4);
  EXPECT_NEAR(view.params()[1], cpu.params()[1], 1e-6);
  EXPECT_NEAR(opt_view.m()[1], cpu_opt.m()[1], 1e-6);
  EXPECT_NEAR(opt_view.v()[1], cpu_opt.v()[1], 1e-6);
  for (double sq : gpu_opt.update_squares()) EXPECT_EQ(sq, 0.0);
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
