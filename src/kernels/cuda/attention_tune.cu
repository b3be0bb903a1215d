// The attention at one shape as the model runs it, timed; and the block rows chosen by those
// timings (attention_tune.h). Host code only: it calls the backend's ops.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>
#include <utility>

#include "kernels/cuda/attention_tune.h"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

AttentionWork::AttentionWork(int B, int T, int C, int NH, uint32_t seed)
    : B(B),
      T(T),
      C(C),
      NH(NH),
      qkv(3 * size_t(B) * T * C),
      dout(size_t(B) * T * C),
      out(size_t(B) * T * C),
      lse(size_t(B) * NH * T),
      dqkv(3 * size_t(B) * T * C),
      out16(size_t(B) * T * C),
      dqkv16(3 * size_t(B) * T * C),
      // At least 8: a pointer the ops may take, where nothing is kept.
      kept(std::max<size_t>(8, AttentionKeptElements(B, T, C, NH))) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> h(qkv.size());
  for (float& v : h) v = normal(rng);
  qkv.Upload(h.data(), h.size());
  h.resize(dout.size());
  for (float& v : h) v = 0.1f * normal(rng);
  dout.Upload(h.data(), h.size());
}

void AttentionWork::Forward() {
  AttentionForward(out.data(), lse.data(), qkv.data(), B, T, C, NH, out16.data(), kept.data());
}

void AttentionWork::Backward() {
  AttentionBackward(dqkv.data(), dout.data(), out.data(), qkv.data(), lse.data(), B, T, C, NH,
                    dqkv16.data(), GradInto::kWrite, kept.data());
}

AttentionWork::Timing AttentionWork::Time(int steps, int warmup) {
  Timing t;
  for (int i = 0; i < warmup; ++i) Forward(), Backward();
  Synchronize();
  double t0 = Now();
  for (int i = 0; i < steps; ++i) Forward();
  Synchronize();
  t.forward_s = (Now() - t0) / steps;
  t0 = Now();
  for (int i = 0; i < steps; ++i) Backward();
  Synchronize();
  t.backward_s = (Now() - t0) / steps;
  return t;
}

std::string AttentionTuning::Describe() const {
  if (timed.empty()) return fmt::format("{} (not timed: {})", ToString(rows), why_not);
  std::string times;
  for (const Candidate& c : timed)
    times += fmt::format("{}{} {:.3f}", times.empty() ? "" : ", ", ToString(c.rows),
                         1e3 * (c.best.forward_s + c.best.backward_s));
  return fmt::format("{}, the fastest of {} (forward + backward ms: {})", ToString(rows),
                     timed.size(), times);
}

AttentionTuning TuneAttentionBlockRows(int B, int T, int C, int NH, int steps, int warmup,
                                       int rounds) {
  AttentionTuning tuning;
  tuning.rows = SetAttentionBlockRows({});
  SetAttentionBlockRows(tuning.rows);
  if (AttentionKeptElements(B, T, C, NH) == 0) {
    tuning.why_not =
        "this attention does not run on the tensor cores (float products, heads "
        "over 64 or a GPU before sm_80), where block rows do not apply";
    return tuning;
  }
  AttentionWork work(B, T, C, NH);
  for (const AttentionBlockRows& rows : kAttentionBlockRowsAll) tuning.timed.push_back({rows, {}});
  for (int round = 0; round < rounds; ++round)
    for (AttentionTuning::Candidate& c : tuning.timed) {
      SetAttentionBlockRows(c.rows);
      const AttentionWork::Timing t = work.Time(steps, warmup);
      if (round == 0 || t.forward_s < c.best.forward_s) c.best.forward_s = t.forward_s;
      if (round == 0 || t.backward_s < c.best.backward_s) c.best.backward_s = t.backward_s;
    }
  const auto fastest =
      std::min_element(tuning.timed.begin(), tuning.timed.end(), [](const auto& a, const auto& b) {
        return a.best.forward_s + a.best.backward_s < b.best.forward_s + b.best.backward_s;
      });
  tuning.rows = fastest->rows;
  SetAttentionBlockRows(tuning.rows);
  return tuning;
}

}  // namespace atl::kernels::cuda
