#include "train/strategies/lowcomm.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/hash.h"
#include "core/log.h"
#include "train/strategies/outer.h"

namespace atl {

LowCommSync::LowCommSync(LowCommOptions options, Average average, const float* params, size_t n)
    : options_(std::move(options)),
      average_(std::move(average)),
      n_(n),
      fragments_(options_.fragments.empty() ? WholeBuffer(n) : options_.fragments),
      whole_(WholeBuffer(n).front()),
      global_(params, params + n),
      momentum_(n, 0.0f),
      residual_(n, 0.0f) {}

LowCommSync::~LowCommSync() {
  for (auto& p : pending_)
    if (p->result.valid()) p->result.wait();
}

std::vector<int> LowCommSync::Sends(int64_t completed) const {
  std::vector<int> out;
  const int64_t H = options_.inner_steps, P = int64_t(fragments_.size());
  for (int p = 0; p < int(P); ++p) {
    const int64_t off = (int64_t(p) + 1) * H / P;
    if (completed >= off && (completed - off) % H == 0) out.push_back(p);
  }
  return out;
}

int64_t LowCommSync::StepOfExchange(int64_t round) const {
  if (round < 0) return -1;
  int64_t seen = 0;
  for (int64_t c = 1; c <= options_.total_steps; ++c) {
    const int64_t k = int64_t(Sends(c).size());
    if (round < seen + k) return c;
    seen += k;
  }
  return -1;
}

std::vector<int> LowCommSync::Merges(int64_t completed) const {
  if (completed - options_.overlap < 1) return {};
  return Sends(completed - options_.overlap);
}

const Fragment& LowCommSync::FragmentOf(int fragment) const {
  return fragment >= 0 ? fragments_[size_t(fragment)] : whole_;
}

void LowCommSync::Outcome(Pending& p, std::span<const float> mean) const {
  const Fragment& f = FragmentOf(p.fragment);
  p.new_global.resize(f.size());
  Gather(f, global_.data(), p.new_global.data());
  if (p.fragment < 0) {  // the final exchange: a plain average of the replicas
    SubtractInto(p.new_global, p.new_global, mean);
    return;
  }
  p.new_momentum.resize(f.size());
  Gather(f, momentum_.data(), p.new_momentum.data());
  OuterNesterov(p.new_global, mean, p.new_momentum, options_.outer_lr, options_.outer_momentum);
}

uint64_t LowCommSync::DigestOf(const Pending& p) {
  // Everything the commit replaces: the global parameters and, for an outer step, the momentum
  // (a difference there can hide in the rounding of this step's parameters and show later).
  const uint64_t g = Hash64(p.new_global.data(), p.new_global.size() * sizeof(float));
  return Hash64(p.new_momentum.data(), p.new_momentum.size() * sizeof(float), /*seed=*/g);
}

void LowCommSync::Start(int fragment, int64_t merge_at, const float* params) {
  auto p = std::make_unique<Pending>();
  p->fragment = fragment;
  p->merge_at = merge_at;
  const Fragment& f = FragmentOf(fragment);
  p->delta.resize(f.size());
  size_t at = 0;
  for (const Range& r : f.ranges)
    for (size_t i = r.begin; i < r.end; ++i) p->delta[at++] = global_[i] - params[i];
  p->residual.resize(f.size());
  Gather(f, residual_.data(), p->residual.data());
  const int64_t round = rounds_++;
  Pending* raw = p.get();
  // Exchanges run one at a time, in the order they were started. The digest callback (possibly
  // once per attempt) reads global_ and momentum_ of this fragment only, which nothing else
  // touches until its merge, and writes the pending's new_* alone.
  std::shared_future<void> before = previous_;
  std::promise<void> done;
  previous_ = done.get_future().share();
  p->result = std::async(std::launch::async, [this, raw, before, round, pace = pace_,
                                              done = std::move(done)]() mutable {
    // The next exchange may start when this one ends, however it ends.
    struct Release {
      std::promise<void>& done;
      ~Release() { done.set_value(); }
    } release{done};
    if (before.valid()) before.wait();
    return average_(
        round, raw->delta, raw->residual,
        [this, raw](std::span<const float> mean) {
          Outcome(*raw, mean);
          return DigestOf(*raw);
        },
        pace);
  });
  pending_.push_back(std::move(p));
}

Status LowCommSync::Merge(Pending& p, float* params, float alpha) {
  const double t0 = NowSeconds();
  StatusOr<ExchangeResult> r = p.result.get();
  last_wait_s_ += NowSeconds() - t0;
  const Fragment& f = FragmentOf(p.fragment);
  Scatter(f, p.residual.data(), residual_.data());  // as the exchange left it (failed: unchanged)
  if (!r.ok())
    return r.status().WithContext(
        fmt::format("the exchange of {}", p.fragment >= 0 ? fmt::format("fragment {}", p.fragment)
                                                          : std::string("the whole model")));
  bytes_sent_ += r->bytes_sent;
  ++completed_;
  last_sites_ = r->sites;
  last_paces_ = r->paces;
  // The average committed: what its digest was computed from. (A digest callback that did not
  // run, as in tests with a fake exchange, leaves it to be computed here from the same average.)
  if (p.new_global.size() != f.size()) Outcome(p, p.delta);
  Scatter(f, p.new_global.data(), global_.data());
  if (p.fragment >= 0) Scatter(f, p.new_momentum.data(), momentum_.data());
  size_t at = 0;
  for (const Range& range : f.ranges) {
    MergeLocal(std::span<float>(params + range.begin, range.size()),
               std::span<const float>(p.new_global.data() + at, range.size()), alpha);
    at += range.size();
  }
  return Status::Ok();
}

Status LowCommSync::AfterStep(int64_t completed, float* params) {
  last_wait_s_ = 0;
  const int64_t merged_before = completed_;
  while (!pending_.empty() && pending_.front()->merge_at <= completed) {
    ATOLL_RETURN_IF_ERROR(Merge(*pending_.front(), params, options_.alpha));
    pending_.erase(pending_.begin());
  }
  for (int p : Sends(completed)) {
    // A fragment's previous exchange is merged before its next starts (the config keeps tau <
    // H / P, so this only waits when LowCommSync is driven otherwise): its delta needs the
    // previous outer step, and the exchange thread reads the fragment's global parameters.
    for (auto it = pending_.begin(); it != pending_.end(); ++it)
      if ((*it)->fragment == p) {
        ATOLL_RETURN_IF_ERROR(Merge(**it, params, options_.alpha));
        pending_.erase(it);
        break;
      }
    Start(p, completed + options_.overlap, params);
    if (options_.overlap == 0) {  // DiLoCo: merge at once
      ATOLL_RETURN_IF_ERROR(Merge(*pending_.back(), params, options_.alpha));
      pending_.pop_back();
    }
  }
  merged_ = completed_ > merged_before;
  return Status::Ok();
}

Status LowCommSync::Finish(float* params) {
  last_wait_s_ = 0;
  while (!pending_.empty()) {
    ATOLL_RETURN_IF_ERROR(Merge(*pending_.front(), params, options_.alpha));
    pending_.erase(pending_.begin());
  }
  if (!options_.final_sync) return Status::Ok();
  Start(-1, options_.total_steps, params);
  Status s = Merge(*pending_.back(), params, /*alpha=*/0.0f);
  pending_.pop_back();
  return s;
}

std::shared_ptr<const std::string> LowCommSync::QuietState(int64_t completed,
                                                           const float* params) const {
  if (!merged_ || !pending_.empty() || completed >= options_.total_steps) return nullptr;
  LowCommState st;
  st.completed = completed;
  st.rounds = rounds_;
  st.exchanges = completed_;
  st.global = global_;
  st.momentum = momentum_;
  st.params.assign(params, params + n_);
  return std::make_shared<const std::string>(EncodeLowCommState(st));
}

void LowCommSync::Restore(const LowCommState& state) {
  global_ = state.global;
  momentum_ = state.momentum;
  if (state.residual.size() == residual_.size())
    residual_ = state.residual;
  else
    std::fill(residual_.begin(), residual_.end(), 0.0f);
  rounds_ = state.rounds;
  completed_ = state.exchanges;
}

std::unique_ptr<LowCommState> LowCommSync::ResumeState(int64_t completed,
                                                       const float* params) const {
  if (!pending_.empty()) return nullptr;
  auto st = std::make_unique<LowCommState>();
  st->completed = completed;
  st->rounds = rounds_;
  st->exchanges = completed_;
  st->global = global_;
  st->momentum = momentum_;
  st->params.assign(params, params + n_);
  st->residual = residual_;
  return st;
}

}  // namespace atl
