// The attention at one shape as the model runs it, and the block-row settings timed on it
// (attention_tune.h). Host code only: it calls the backend's ops.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <iterator>
#include <random>

#include "kernels/cuda/attention_tune.h"
#include "kernels/cuda/ops.h"

namespace atl::kernels::cuda {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// a filled with scale times normal draws of rng: a block of up to 2^20, repeated.
void FillNormal(DeviceArray<float>& a, std::mt19937& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> block(std::min<size_t>(a.size(), size_t(1) << 20));
  for (float& v : block) v = normal(rng);
  for (size_t at = 0; at < a.size(); at += block.size())
    CopyToDevice(a.data() + at, block.data(),
                 std::min(block.size(), a.size() - at) * sizeof(float));
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
  FillNormal(qkv, rng, 1.0f);
  FillNormal(dout, rng, 0.1f);
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

std::vector<double> AttentionTimings::Totals() const {
  std::vector<double> totals;
  for (const Candidate& c : timed) totals.push_back(c.best.total());
  return totals;
}

AttentionTimings TimeAttentionBlockRows(int B, int T, int C, int NH,
                                        const AttentionTimingOptions& options) {
  AttentionTimings timings;
  if (AttentionKeptElements(B, T, C, NH) == 0) {
    timings.why_not =
        "this attention does not run on the tensor cores (float products, heads over 64 or a GPU "
        "before sm_80), where block rows do not apply";
    return timings;
  }
  const AttentionBlockRows before = SetAttentionBlockRows({});
  struct Restore {
    AttentionBlockRows rows;
    ~Restore() { SetAttentionBlockRows(rows); }
  } restore{before};
  AttentionWork work(B, T, C, NH);
  // The warm-up, at the default setting: its pace sizes the measurements.
  Synchronize();
  const double t0 = Now();
  int calls = 0;
  do {
    work.Forward();
    work.Backward();
    Synchronize();
    ++calls;
  } while (Now() - t0 < options.warmup_s && calls < 200);
  const double call_s = (Now() - t0) / calls;
  const int steps = std::max(
      options.min_steps, int(std::min(std::ceil(options.target_s / std::max(call_s, 1e-9)), 64.0)));
  const size_t n = std::size(kAttentionBlockRowsAll);
  for (const AttentionBlockRows& rows : kAttentionBlockRowsAll) timings.timed.push_back({rows, {}});
  for (int round = 0; round < options.rounds; ++round)
    for (size_t k = 0; k < n; ++k) {
      AttentionTimings::Candidate& c = timings.timed[(k + size_t(round)) % n];
      SetAttentionBlockRows(c.rows);
      const AttentionWork::Timing t = work.Time(steps, /*warmup=*/1);
      c.best = round == 0 ? t : AttentionWork::Timing::Fastest(c.best, t);
    }
  return timings;
}

}  // namespace atl::kernels::cuda
