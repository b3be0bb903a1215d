// The GPT model and its optimizer on the GPU without the trainer: bf16 copies of activations and
// weights that change no bit and round less, bf16 logits, and AdamW's steps that stay on the GPU
// and match the CPU's. Skipped, saying why, where no GPU is usable (cuda_train_test.cc trains).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/backend.h"
#include "model/gpt.h"
#include "train/optimizer.h"

namespace atl {
namespace {

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

}  // namespace
}  // namespace atl
