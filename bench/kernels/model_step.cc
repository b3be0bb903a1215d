// Model step benchmark: GPT<float> Forward + Backward (no optimizer) tokens/s and MFU.
//
//   build/.../bench/kernels_model_step [--preset tiny|small|gpt2-124m|gpt2-350m|all]
//       [--threads 1,2] [--batch B] [--steps S] [--warmup W] [--profile] [--sgemm GFLOPS]
//       [--device cpu|cuda] [--precision fp32|bf16] [--bf16-copies on|off]
//       [--attention-rows Q/K] [--attention-backward split|fused]
//
// --device cuda runs the model on the GPU (float); MFU is then against --sgemm (default 67,000
// GFLOP/s: an H100 SXM's dense fp32 rate), and --profile waits for the GPU after every op.
// --precision bf16 (GPU only) rounds every product's operands to bf16 on the tensor cores, as
// train.precision = "bf16" does (attention's too for heads up to 64); --sgemm then defaults to
// 989,000 (the H100 SXM's dense bf16 rate), and the line adds the elements rounded to bf16 per
// step (each read as float and written as bf16). --bf16-copies off: the products round their
// inputs and weights themselves instead of reading the bf16 copies their producers write and the
// copy of the parameters made once a step (GPT::set_bf16_copies; the same bits, to time what the
// copies save). Each step marks the parameters changed, as a training step's optimizer does. On
// the GPU the line also gives the bytes set by zeroing passes per step (the gradients' ZeroGrad
// among them). --attention-rows Q/K: the rows of a block of the tensor-core attention's kernels,
// the forward's and dQ's query rows and the dK/dV kernel's key rows, 64 or 128 each (Q alone:
// Q/64; SetAttentionBlockRows, the same bits), to time the step either way;
// --attention-backward fused: dQ from the dK/dV kernel's partial sums instead of a kernel of its
// own (SetAttentionBackwardKind; dQ's bits change, by another order of sums).
//
// Shapes are those of configs/{tiny,small,gpt2-124m}.toml; the batch defaults to the preset's
// micro_batch_size (gpt2-124m: 1, to fit beside other users' jobs).
//
// FLOPs per token (forward + backward = 3x forward), the same definition as
// bench/bench_vs_torch.sh:
//   N = L * 12 C^2 + V C   (matmul weights: qkv, attn proj, fc, mlp proj; the tied head)
//   F = 6 N + 12 L T C     (attention's QK^T and AV over all T keys, as PaLM / nanoGPT count)
// MFU = F * tokens/s / SGEMM rate, the rate measured here at the same thread count (the best of
// atoll's tiled scheme and OpenBLAS's threaded sgemm on a 2048^3 product), unless --sgemm
// gives one. Timings: best step of S timed steps after W warm-up steps (a shared machine: the
// best step is the least disturbed one); the mean is printed too, and the process CPU time of the
// best-CPU step (with 1 thread, a measure of the work that a busy machine barely disturbs).
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/gemm.h"
#include "kernels/ops.h"
#include "model/backend.h"
#include "model/gpt.h"

namespace {

struct Preset {
  const char* name;
  atl::GPTConfig cfg;
  int batch;
};

atl::GPTConfig Shape(int L, int H, int C, int T, int V) {
  atl::GPTConfig c;
  c.n_layer = L;
  c.n_head = H;
  c.n_embd = C;
  c.seq_len = T;
  c.vocab_size = V;
  return c;
}

double CpuNow() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Best GFLOP/s of a 2048^3 SGEMM at the current OpenMP thread count, either way.
double SgemmRate(int threads) {
  const int n = 2048;
  std::vector<float> a(size_t(n) * n, 0.01f), b(size_t(n) * n, 0.02f), c(size_t(n) * n);
  auto time_best = [&](auto&& run) {
    run();
    double best = 0;
    for (int r = 0; r < 3; ++r) {
      const double t0 = Now();
      run();
      best = std::max(best, 2.0 * n * n * n / (Now() - t0) / 1e9);
    }
    return best;
  };
  omp_set_num_threads(threads);
  openblas_set_num_threads(1);
  const double tiles = time_best([&] {
    atl::kernels::cpu::ParallelGemm<float>(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n,
                                           0.0f, c.data(), n);
  });
  openblas_set_num_threads(threads);
  const double blas = time_best([&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
  });
  openblas_set_num_threads(1);
  return std::max(tiles, blas);
}

void Run(const Preset& p, int threads, int batch, int steps, int warmup, bool profile,
         double sgemm_gflops, atl::Device device, bool bf16_copies) {
  omp_set_num_threads(threads);
  const atl::GPTConfig& c = p.cfg;
  const int B = batch, T = c.seq_len;
  atl::GPT<float> model(c, B, {}, 1, device);
  model.set_bf16_copies(bf16_copies);
  model.InitParameters(1337);
  std::mt19937 gen(1);
  std::vector<int32_t> in(size_t(B) * T), tg(size_t(B) * T);
  for (auto& x : in) x = int32_t(gen() % uint32_t(c.vocab_size));
  for (auto& x : tg) x = int32_t(gen() % uint32_t(c.vocab_size));
  double best = 1e30, total = 0, best_cpu = 1e30;
  float loss = 0;
  uint64_t rounded = 0, zeroed = 0, waits = 0;
  for (int s = 0; s < warmup + steps; ++s) {
    if (s == warmup) {
      rounded = atl::Bf16RoundedElements();
      zeroed = atl::DeviceZeroed();
      waits = atl::DeviceWaits();
      if (profile) {
        model.reset_op_times();
        model.set_profiling(true);
      }
    }
    const double t0 = Now(), c0 = CpuNow();
    // What a training step's optimizer does to the parameters (there on the GPU): they change,
    // so the bf16 copy of them is made again (nothing is copied or run here).
    if (device == atl::Device::kCuda) model.device_params();
    model.ZeroGrad();
    loss = model.Forward(in.data(), tg.data(), B, T);
    model.Backward();
    const double dt = Now() - t0, dc = CpuNow() - c0;
    if (s >= warmup) {
      best_cpu = std::min(best_cpu, dc);
      best = std::min(best, dt);
      total += dt;
    }
  }
  const double L = c.n_layer, C = c.n_embd, V = c.vocab_size;
  const double n_matmul = L * 12 * C * C + V * C;
  const double flops_tok = 6 * n_matmul + 12 * L * T * C;
  const double tokens = double(B) * T;
  const double tps = tokens / best;
  rounded = atl::Bf16RoundedElements() - rounded;
  zeroed = atl::DeviceZeroed() - zeroed;
  waits = atl::DeviceWaits() - waits;
  std::printf(
      "%-10s L%-2d H%-2d C%-4d T%-5d V%-6d B%-2d threads %d | %8.1f ms/step (mean %.1f) "
      "| %9.0f tokens/s | %6.1f GFLOP/s | MFU %5.1f%% of %.0f | cpu %.1f ms | loss %.4f",
      p.name, c.n_layer, c.n_head, c.n_embd, T, c.vocab_size, B, threads, best * 1e3,
      total / steps * 1e3, tps, flops_tok * tps / 1e9, 100 * flops_tok * tps / (sgemm_gflops * 1e9),
      sgemm_gflops, best_cpu * 1e3, loss);
  if (device == atl::Device::kCuda)
    std::printf(" | zeroed %.1f MB/step | host waits %.1f/step", double(zeroed) / steps / 1e6,
                double(waits) / steps);
  if (device == atl::Device::kCuda && atl::Bf16Matmul())
    std::printf(" | bf16 rounding %.1f M elements/step (copies %s)", double(rounded) / steps / 1e6,
                bf16_copies ? "on" : "off");
  std::printf("\n");
  if (profile) {
    const auto times = model.op_times();
    double sum = 0;
    for (const auto& t : times) sum += t.seconds;
    for (const auto& t : times) {
      std::printf("    %-16s %8.2f ms/step  %5.1f%%  (%lld calls/step)\n", t.op,
                  t.seconds / steps * 1e3, 100 * t.seconds / sum,
                  static_cast<long long>(t.calls / steps));
    }
    std::printf("    %-16s %8.2f ms/step (rest: zeroing, bookkeeping %.2f ms)\n", "sum of ops",
                sum / steps * 1e3, total / steps * 1e3 - sum / steps * 1e3);
  }
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  atl::kernels::ReexecWithRuntimeDefaults(argv);  // OMP_WAIT_POLICY=passive unless set
  std::string preset = "small";
  std::vector<int> threads = {1, 2};
  int batch = 0, steps = 5, warmup = 2;
  bool profile = false;
  double sgemm = 0;
  atl::Device device = atl::Device::kCpu;
  bool bf16 = false, bf16_copies = true;
  atl::kernels::AttentionBlockRows attention_rows;
  atl::kernels::AttentionBackwardKind attention_backward =
      atl::kernels::AttentionBackwardKind::kSplit;
  for (int i = 1; i < argc; ++i) {
    auto next = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "kernels_model_step: %s needs a value\n", argv[i]);
        std::exit(2);
      }
      return argv[++i];
    };
    if (!std::strcmp(argv[i], "--preset"))
      preset = next();
    else if (!std::strcmp(argv[i], "--threads")) {
      threads.clear();
      for (char* p = next(); p && *p;) {
        threads.push_back(std::atoi(p));
        p = std::strchr(p, ',');
        if (p) ++p;
      }
    } else if (!std::strcmp(argv[i], "--batch"))
      batch = std::atoi(next());
    else if (!std::strcmp(argv[i], "--steps"))
      steps = std::atoi(next());
    else if (!std::strcmp(argv[i], "--warmup"))
      warmup = std::atoi(next());
    else if (!std::strcmp(argv[i], "--sgemm"))
      sgemm = std::atof(next());
    else if (!std::strcmp(argv[i], "--profile"))
      profile = true;
    else if (!std::strcmp(argv[i], "--bf16-copies")) {
      const std::string v = next();
      if (v != "on" && v != "off") {
        std::fprintf(stderr, "kernels_model_step: --bf16-copies: on or off\n");
        return 2;
      }
      bf16_copies = v == "on";
    } else if (!std::strcmp(argv[i], "--attention-rows")) {
      if (!atl::kernels::ParseAttentionBlockRows(next(), &attention_rows)) {
        std::fprintf(stderr,
                     "kernels_model_step: --attention-rows: Q/K, query and key rows 64 or 128\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--attention-backward")) {
      if (!atl::kernels::ParseAttentionBackwardKind(next(), &attention_backward)) {
        std::fprintf(stderr, "kernels_model_step: --attention-backward: split or fused\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--device")) {
      if (!atl::ParseDevice(next(), &device)) {
        std::fprintf(stderr, "kernels_model_step: --device: cpu or cuda\n");
        return 2;
      }
    } else if (!std::strcmp(argv[i], "--precision")) {
      const std::string p = next();
      if (p != "fp32" && p != "bf16") {
        std::fprintf(stderr, "kernels_model_step: --precision: fp32 or bf16\n");
        return 2;
      }
      bf16 = p == "bf16";
    } else {
      std::fprintf(stderr,
                   "usage: kernels_model_step [--preset tiny|small|gpt2-124m|all] [--threads 1,2] "
                   "[--batch B] [--steps S] [--warmup W] [--profile] [--sgemm GFLOPS] "
                   "[--device cpu|cuda] [--precision fp32|bf16] [--bf16-copies on|off] "
                   "[--attention-rows Q/K] [--attention-backward split|fused]\n");
      return 2;
    }
  }
  const std::vector<Preset> presets = {
      {"tiny", Shape(2, 2, 32, 16, 50257), 2},
      {"small", Shape(4, 4, 192, 128, 50257), 8},
      {"gpt2-124m", Shape(12, 12, 768, 1024, 50257), 1},
      {"gpt2-350m", Shape(24, 16, 1024, 1024, 50257), 1},
  };
  if (std::string why; !atl::DeviceUsable(device, &why)) {
    std::fprintf(stderr, "kernels_model_step: --device %s: %s\n", atl::DeviceName(device),
                 why.c_str());
    return 2;
  }
  if (bf16 && device != atl::Device::kCuda) {
    std::fprintf(stderr, "kernels_model_step: --precision bf16 needs --device cuda\n");
    return 2;
  }
  if (device == atl::Device::kCuda) {
    threads = {1};
    if (sgemm <= 0) sgemm = bf16 ? 989000 : 67000;
    atl::SetBf16Matmul(bf16);
    atl::SetAttentionBlockRows(attention_rows);
    atl::SetAttentionBackwardKind(attention_backward);
  }
  const auto info = atl::kernels::InitBackend();
  double load[3] = {0, 0, 0};
  if (FILE* f = std::fopen("/proc/loadavg", "r")) {
    if (std::fscanf(f, "%lf %lf %lf", &load[0], &load[1], &load[2]) != 3) load[0] = -1;
    std::fclose(f);
  }
  std::printf(
      "OpenBLAS core %s%s; OMP_WAIT_POLICY=%s; forward+backward per step, best of %d after %d "
      "warm-up; load average %.2f %.2f %.2f (a busy machine makes every figure lower)\n",
      info.blas_core.c_str(), info.blas_retargeted ? " (switched by InitBackend)" : "",
      std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "(unset)", steps, warmup,
      load[0], load[1], load[2]);
  for (int t : threads) {
    const double rate = sgemm > 0 ? sgemm : SgemmRate(t);
    std::printf("SGEMM rate at %d thread(s): %.1f GFLOP/s%s\n", t, rate,
                sgemm > 0 ? " (given)" : " (2048^3, best of tiles / OpenBLAS threads)");
    for (const Preset& p : presets) {
      if (preset != "all" && preset != p.name) continue;
      Run(p, t, batch > 0 ? batch : p.batch, steps, warmup, profile, rate, device, bf16_copies);
    }
  }
  return 0;
}
