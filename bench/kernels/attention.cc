// Attention benchmark (issue 18): the GPU attention's forward and backward alone, at one shape,
// for each block-row setting of the tensor-core kernels (kernels/attention_blocks.h,
// SetAttentionBlockRows: the forward's and dQ's query rows / the dK/dV kernel's key rows) and
// each backward kind (SetAttentionBackwardKind: dQ by a kernel of its own, split, or from the
// dK/dV kernel's partial sums, fused), timed in one run; and whether the settings give the same
// bits (they must, but for dQ between the kinds, whose difference is printed: the exit status is
// 1 when not).
//
//   build/release/bench/kernels_attention [--batch 8] [--seq 1024] [--heads 12] [--width 768]
//       [--steps 20] [--warmup 3] [--rows 64/64,128/64,64/128,128/128] [--backward split,fused]
//       [--precision bf16|fp32]
//
// A forward is AttentionForward as the model calls it (the pass that rounds Q, K, V into the
// kernels' layout, kept for the backward, then the kernel; out's bf16 copy written); a backward
// AttentionBackward with those kept operands (the pass over dO and out, then the dQ and the dK/dV
// kernels, or the fused dK/dV kernel and the sum of its dQ partials; dqkv written with its bf16
// copy). Each is called `steps` times back to back after
// `warmup` calls, the GPU waited for once at the end (host clock): the time a call is the total
// over steps. The settings take turns, three rounds; each gets its best round.
// FLOPs as FlashAttention counts them for a causal attention: forward 4 B NH T² D / 2, backward
// 2.5 times that (bench/torch_attention_gpu.py times PyTorch's scaled_dot_product_attention at
// the same shape and counts the same way). --precision fp32 times the float kernels (no tensor
// cores; --rows is then moot). Without a GPU it runs on nothing and says so (exit 2); its _emu
// build runs on the CUDA emulator (exact bits, no speed).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/attention_blocks.h"
#include "kernels/cuda/attention_tune.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace {

namespace cuda = atl::kernels::cuda;

struct Shape {
  int B = 8, T = 1024, NH = 12, C = 768;
};

// What one setting computed: out, lse, dqkv ([B, T, 3C]: dq, dk, dv) and the bf16 copies of
// out and dqkv.
struct Outputs {
  std::vector<float> out, lse, dqkv;
  std::vector<uint16_t> out16, dqkv16;
  // The same bits as o, dq too or (with_dq false) all but dq (columns 0 .. C of dqkv's rows).
  bool Same(const Outputs& o, size_t C, bool with_dq) const {
    auto same = [](const auto& a, const auto& b) {
      return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(a[0])) == 0;
    };
    auto same_grad = [&](const auto& a, const auto& b) {
      if (with_dq) return same(a, b);
      if (a.size() != b.size()) return false;
      for (size_t i = 0; i < a.size(); i += 3 * C)
        if (std::memcmp(&a[i + C], &b[i + C], 2 * C * sizeof(a[0])) != 0) return false;
      return true;
    };
    return same(out, o.out) && same(lse, o.lse) && same(out16, o.out16) &&
           same_grad(dqkv, o.dqkv) && same_grad(dqkv16, o.dqkv16);
  }
  // dq's normalized difference from o's: sqrt(Σ (a - b)² / Σ b²).
  double DqDifference(const Outputs& o, size_t C) const {
    double num = 0, den = 0;
    for (size_t i = 0; i < dqkv.size(); ++i)
      if (i % (3 * C) < C) {
        const double d = double(dqkv[i]) - o.dqkv[i];
        num += d * d;
        den += double(o.dqkv[i]) * o.dqkv[i];
      }
    return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  }
};

// A setting: block rows and backward kind.
struct Setting {
  atl::kernels::AttentionBlockRows rows;
  atl::kernels::AttentionBackwardKind kind;
  std::string Name() const { return ToString(rows) + " " + ToString(kind); }
  void Set() const {
    cuda::SetAttentionBlockRows(rows);
    cuda::SetAttentionBackwardKind(kind);
  }
};

using Timing = cuda::AttentionWork::Timing;

// Every byte of a set to 0xff (a float NaN, a bf16 NaN).
template <class T>
void Fill(cuda::DeviceArray<T>& a) {
  const std::vector<unsigned char> ones(a.size() * sizeof(T), 0xff);
  cuda::CopyToDevice(a.data(), ones.data(), ones.size());
}

// One forward and backward, every output filled with NaNs first (one left unwritten differs).
Outputs Results(cuda::AttentionWork& w) {
  Fill(w.out), Fill(w.lse), Fill(w.dqkv), Fill(w.out16), Fill(w.dqkv16);
  w.Forward();
  w.Backward();
  return {cuda::ToHost(w.out), cuda::ToHost(w.lse), cuda::ToHost(w.dqkv), cuda::ToHost(w.out16),
          cuda::ToHost(w.dqkv16)};
}

[[noreturn]] void Usage(const char* why) {
  if (why != nullptr) std::fprintf(stderr, "kernels_attention: %s\n", why);
  std::fprintf(why != nullptr ? stderr : stdout,
               "usage: kernels_attention [--batch 8] [--seq 1024] [--heads 12] [--width 768] "
               "[--steps 20] [--warmup 3] [--rows 64/64,128/64,64/128,128/128] "
               "[--backward split,fused] [--precision bf16|fp32]\n"
               "  --rows: block-row settings, query/key rows (64 or 128; Q alone is Q/64)\n"
               "  --backward: how dQ is computed, by a kernel of its own (split) or from the "
               "dK/dV kernel's partial sums (fused)\n");
  std::exit(why != nullptr ? 2 : 0);
}

// v as an integer from `least` to 2^24; else the usage, exit 2.
int Count(const char* flag, const char* v, int least = 1) {
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  if (end == v || *end != '\0' || n < least || n > (1 << 24))
    Usage((std::string(flag) + ": an integer from " + std::to_string(least) + ", not '" + v + "'")
              .c_str());
  return int(n);
}

// v's comma-separated items, each read by parse (bool parse(std::string_view, T*)); else the usage
// with `why`, exit 2.
template <class T, class Parse>
std::vector<T> List(std::string_view v, Parse parse, const char* why) {
  std::vector<T> items;
  for (;;) {
    const size_t comma = v.find(',');
    T item{};
    if (!parse(v.substr(0, comma), &item)) Usage(why);
    items.push_back(item);
    if (comma == std::string_view::npos) return items;
    v.remove_prefix(comma + 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  int steps = 20, warmup = 3;
  using atl::kernels::AttentionBlockRows;
  std::vector<AttentionBlockRows> rows(std::begin(atl::kernels::kAttentionBlockRowsAll),
                                       std::end(atl::kernels::kAttentionBlockRowsAll));
  using atl::kernels::AttentionBackwardKind;
  std::vector<AttentionBackwardKind> kinds = {AttentionBackwardKind::kSplit,
                                              AttentionBackwardKind::kFused};
  bool bf16 = true;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") Usage(nullptr);
    if (i + 1 >= argc) Usage((a + " needs a value").c_str());
    const char* v = argv[++i];
    if (a == "--batch")
      s.B = Count("--batch", v);
    else if (a == "--seq")
      s.T = Count("--seq", v);
    else if (a == "--heads")
      s.NH = Count("--heads", v);
    else if (a == "--width")
      s.C = Count("--width", v);
    else if (a == "--steps")
      steps = Count("--steps", v);
    else if (a == "--warmup")
      warmup = Count("--warmup", v, 0);
    else if (a == "--rows")
      rows = List<AttentionBlockRows>(
          v, atl::kernels::ParseAttentionBlockRows,
          "--rows: settings Q/K (query and key rows, 64 or 128), comma-separated");
    else if (a == "--backward")
      kinds = List<AttentionBackwardKind>(v, atl::kernels::ParseAttentionBackwardKind,
                                          "--backward: split or fused, comma-separated");
    else if (a == "--precision") {
      if (std::strcmp(v, "bf16") != 0 && std::strcmp(v, "fp32") != 0)
        Usage("--precision: bf16 or fp32");
      bf16 = std::strcmp(v, "bf16") == 0;
    } else {
      Usage(("unknown flag " + a).c_str());
    }
  }
  if (s.C % s.NH != 0) Usage("--width must be a multiple of --heads");
  if (rows.empty()) Usage("--rows: at least one setting");
  if (kinds.empty()) Usage("--backward: at least one kind");
  if (std::string why; !cuda::Available(&why)) {
    std::fprintf(stderr, "kernels_attention: no usable GPU: %s\n", why.c_str());
    return 2;
  }
  cuda::SetBf16Matmul(bf16);
  if (!bf16) rows = {AttentionBlockRows{}}, kinds = {AttentionBackwardKind::kSplit};
  std::vector<Setting> settings;
  for (const AttentionBackwardKind k : kinds)
    for (const AttentionBlockRows& r : rows) settings.push_back({r, k});
  const cuda::DeviceInfo info = cuda::Probe();
  const int D = s.C / s.NH;
  const double fwd_flop = 4.0 * s.B * s.NH * double(s.T) * s.T * D / 2.0;
  std::printf(
      "%s (%d SMs); attention B=%d T=%d NH=%d C=%d (head %d), %s, %s; a call: the mean of "
      "%d after %d warm-up, the best of 3 rounds taken in turn\n",
      info.name.c_str(), info.sm_count, s.B, s.T, s.NH, s.C, D, bf16 ? "bf16 operands" : "fp32",
      cuda::AttentionKeptElements(s.B, s.T, s.C, s.NH) > 0 ? "tensor cores" : "float kernels",
      steps, warmup);
  std::printf(
      "| rows (query/key), backward | forward ms | backward ms | forward TFLOP/s | backward "
      "TFLOP/s | "
      "both TFLOP/s |\n|---|---:|---:|---:|---:|---:|\n");
  cuda::AttentionWork bench(s.B, s.T, s.C, s.NH);
  std::vector<Timing> best(settings.size());
  for (int round = 0; round < 3; ++round)
    for (size_t i = 0; i < settings.size(); ++i) {
      settings[i].Set();
      const Timing t = bench.Time(steps, warmup);
      best[i] = round == 0 ? t : Timing::Fastest(best[i], t);
    }
  std::vector<Outputs> results;
  for (size_t i = 0; i < settings.size(); ++i) {
    const Timing& t = best[i];
    settings[i].Set();
    results.push_back(Results(bench));
    std::printf("| %s | %.3f | %.3f | %.1f | %.1f | %.1f |\n", settings[i].Name().c_str(),
                1e3 * t.forward_s, 1e3 * t.backward_s, fwd_flop / t.forward_s / 1e12,
                2.5 * fwd_flop / t.backward_s / 1e12,
                3.5 * fwd_flop / (t.forward_s + t.backward_s) / 1e12);
    std::fflush(stdout);
  }
  cuda::SetAttentionBlockRows({});
  cuda::SetAttentionBackwardKind(AttentionBackwardKind::kSplit);
  // Against the first setting, and dq against the first of the same kind.
  const size_t C = size_t(s.C);
  for (size_t i = 1; i < results.size(); ++i) {
    size_t kin = 0;
    while (settings[kin].kind != settings[i].kind) ++kin;
    for (const size_t against : {size_t(0), kin})
      if (!results[i].Same(results[against], C, /*with_dq=*/against == kin)) {
        std::printf("%s and %s: different bits (they must be the same%s)\n",
                    settings[against].Name().c_str(), settings[i].Name().c_str(),
                    against == kin ? "" : ", but for dq");
        return 1;
      }
    if (kin == i && kin != 0) {  // the first of the other kind: dq by another order of sums
      const double diff = results[i].DqDifference(results[0], C);
      std::printf("dq, %s against %s: normalized difference %.2e (at most 1e-5)\n",
                  settings[i].Name().c_str(), settings[0].Name().c_str(), diff);
      if (!(diff <= 1e-5)) return 1;  // NaN too
    }
  }
  if (results.size() > 1)
    std::printf("every setting gave the same bits%s\n",
                kinds.size() > 1 ? " (but dq between the backward kinds)" : "");
  return 0;
}
