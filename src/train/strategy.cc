#include "train/strategy.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/log.h"

namespace atl {

void OuterNesterov(std::span<float> global, std::span<const float> d, std::span<float> momentum,
                   float lr, float mu) {
  const size_t n = global.size();
  float* __restrict g = global.data();
  const float* __restrict x = d.data();
  float* __restrict m = momentum.data();
  for (size_t i = 0; i < n; ++i) {
    const float mi = mu * m[i] + x[i];
    m[i] = mi;
    g[i] -= lr * (x[i] + mu * mi);
  }
}

std::vector<Range> SplitEvenly(size_t n, int parts) {
  std::vector<Range> out(static_cast<size_t>(parts));
  const size_t base = n / size_t(parts), extra = n % size_t(parts);
  size_t at = 0;
  for (size_t k = 0; k < out.size(); ++k) {
    const size_t len = base + (k < extra ? 1 : 0);
    out[k] = {at, at + len};
    at += len;
  }
  return out;
}

LowCommSync::LowCommSync(const LowCommOptions& options, Average average, const float* params,
                         size_t n)
    : options_(options),
      average_(std::move(average)),
      n_(n),
      fragments_(SplitEvenly(n, options.fragments)),
      global_(params, params + n),
      momentum_(n, 0.0f),
      residual_(n, 0.0f) {}

LowCommSync::~LowCommSync() {
  for (auto& p : pending_)
    if (p->result.valid()) p->result.wait();
}

std::vector<int> LowCommSync::Sends(int64_t completed) const {
  std::vector<int> out;
  const int64_t H = options_.inner_steps, P = options_.fragments;
  for (int p = 0; p < options_.fragments; ++p) {
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

void LowCommSync::Start(int fragment, int64_t merge_at, const float* params) {
  auto p = std::make_unique<Pending>();
  p->fragment = fragment;
  p->merge_at = merge_at;
  const Range r = fragment >= 0 ? fragments_[size_t(fragment)] : Range{0, n_};
  p->delta.resize(r.end - r.begin);
  for (size_t i = r.begin; i < r.end; ++i) p->delta[i - r.begin] = global_[i] - params[i];
  const int64_t round = rounds_++;
  std::span<float> data(p->delta);
  std::span<float> residual(residual_.data() + r.begin, r.end - r.begin);
  // Exchanges run one at a time, in the order they were started.
  std::shared_future<void> before = previous_;
  std::promise<void> done;
  previous_ = done.get_future().share();
  p->result = std::async(std::launch::async,
                         [this, before, round, data, residual, done = std::move(done)]() mutable {
                           if (before.valid()) before.wait();
                           auto r = average_(round, data, residual);
                           done.set_value();
                           return r;
                         });
  pending_.push_back(std::move(p));
}

Status LowCommSync::Merge(Pending& p, float* params, float alpha) {
  const double t0 = NowSeconds();
  StatusOr<ExchangeResult> r = p.result.get();
  last_wait_s_ += NowSeconds() - t0;
  if (!r.ok())
    return r.status().WithContext(
        fmt::format("the exchange of {}", p.fragment >= 0 ? fmt::format("fragment {}", p.fragment)
                                                          : std::string("the whole model")));
  bytes_sent_ += r->bytes_sent;
  ++completed_;
  last_sites_ = r->sites;
  const Range range = p.fragment >= 0 ? fragments_[size_t(p.fragment)] : Range{0, n_};
  const size_t len = range.end - range.begin;
  std::span<float> g(global_.data() + range.begin, len);
  OuterNesterov(g, p.delta, std::span<float>(momentum_.data() + range.begin, len),
                options_.outer_lr, options_.outer_momentum);
  float* local = params + range.begin;
  if (alpha == 0.0f) {
    std::copy(g.begin(), g.end(), local);
  } else {
    for (size_t i = 0; i < len; ++i) local[i] = alpha * local[i] + (1.0f - alpha) * g[i];
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
    Start(p, completed + options_.overlap, params);
    if (options_.overlap == 0) {  // DiLoCo: merge at once
      ATOLL_RETURN_IF_ERROR(Merge(*pending_.back(), params, options_.alpha));
      pending_.pop_back();
    }
  }
  merged_ = completed_ > merged_before;
  return Status::Ok();
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
  std::fill(residual_.begin(), residual_.end(), 0.0f);
  rounds_ = state.rounds;
  completed_ = state.exchanges;
}

namespace {
constexpr char kStateMagic[4] = {'A', 'T', 'L', 'R'};
constexpr uint32_t kStateVersion = 1;
constexpr size_t kStateHeader = 4 + 4 + 8 + 3 * 8;

template <typename T>
void Put(std::string* out, T v) {
  out->append(reinterpret_cast<const char*>(&v), sizeof(v));  // little-endian hosts only
}
template <typename T>
T Get(std::string_view b, size_t at) {
  T v;
  std::memcpy(&v, b.data() + at, sizeof(v));
  return v;
}
}  // namespace

std::string EncodeLowCommState(const LowCommState& st) {
  const size_t n = st.global.size();
  std::string out;
  out.reserve(kStateHeader + 3 * n * sizeof(float));
  out.append(kStateMagic, 4);
  Put<uint32_t>(&out, kStateVersion);
  Put<uint64_t>(&out, n);
  Put<int64_t>(&out, st.completed);
  Put<int64_t>(&out, st.rounds);
  Put<int64_t>(&out, st.exchanges);
  for (const auto* v : {&st.global, &st.momentum, &st.params})
    out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  return out;
}

StatusOr<LowCommState> DecodeLowCommState(std::string_view b, size_t n) {
  if (b.size() < kStateHeader || std::memcmp(b.data(), kStateMagic, 4) != 0)
    return Status::Corruption(
        fmt::format("rejoin state: {} bytes without the ATLR header", b.size()));
  if (const uint32_t v = Get<uint32_t>(b, 4); v != kStateVersion)
    return Status::Corruption(
        fmt::format("rejoin state: version {} (this build reads {})", v, kStateVersion));
  const uint64_t count = Get<uint64_t>(b, 8);
  if (count != n)
    return Status::InvalidArgument(fmt::format(
        "rejoin state: {} parameters, this model has {} (another model config?)", count, n));
  if (b.size() != kStateHeader + 3 * n * sizeof(float))
    return Status::Corruption(fmt::format("rejoin state: {} bytes, expected {}", b.size(),
                                          kStateHeader + 3 * n * sizeof(float)));
  LowCommState st;
  st.completed = Get<int64_t>(b, 16);
  st.rounds = Get<int64_t>(b, 24);
  st.exchanges = Get<int64_t>(b, 32);
  if (st.completed < 0 || st.rounds < 0 || st.exchanges < 0 || st.exchanges > st.rounds)
    return Status::Corruption(
        fmt::format("rejoin state: bad counters (step {}, round {}, {} "
                    "exchanges)",
                    st.completed, st.rounds, st.exchanges));
  const char* at = b.data() + kStateHeader;
  for (auto* v : {&st.global, &st.momentum, &st.params}) {
    v->resize(n);
    std::memcpy(v->data(), at, n * sizeof(float));
    at += n * sizeof(float);
  }
  return st;
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

AsyncClient::AsyncClient(const Options& options, ParameterServer* ps, size_t n)
    : options_(options), ps_(ps), n_(n), base_(n), update_(n), residual_(n, 0.0f) {}

Status AsyncClient::Start(float* params) {
  StatusOr<int64_t> last = ps_->Init(std::span<const float>(params, n_), options_.max_staleness);
  if (!last.ok()) return last.status().WithContext("the parameter server's Init");
  start_step_ = last_push_step_ = *last;
  ATOLL_ASSIGN_OR_RETURN(version_, ps_->Pull(std::span<float>(params, n_)));
  bytes_received_ += n_ * sizeof(float);
  std::copy(params, params + n_, base_.begin());
  return Status::Ok();
}

Status AsyncClient::PushAndPull(int64_t completed, float* params) {
  const double t0 = NowSeconds();
  for (size_t i = 0; i < n_; ++i) update_[i] = params[i] - base_[i];
  PsUpdate u;
  u.site = options_.site;
  u.base_version = version_;
  u.first_step = last_push_step_ + 1;
  u.last_step = completed;
  u.weight = 1.0f / float(options_.sites);
  Encode(options_.codec, update_, &u.encoded, residual_);
  bytes_sent_ += u.encoded.size();
  ATOLL_ASSIGN_OR_RETURN(const PsPushResult r, ps_->Push(u));
  ++pushes_;
  if (!r.accepted) {
    ++refused_;
    LogWarning(
        "site {}: the parameter server refused the update of steps {}..{} (base version {}, "
        "now {}: more than world.async.max_staleness = {} behind); pulling and going on",
        options_.site, u.first_step, u.last_step, u.base_version, r.current_version,
        options_.max_staleness);
  }
  last_push_step_ = completed;
  ATOLL_ASSIGN_OR_RETURN(version_, ps_->Pull(std::span<float>(params, n_)));
  bytes_received_ += n_ * sizeof(float);
  std::copy(params, params + n_, base_.begin());
  last_wait_s_ = NowSeconds() - t0;
  return Status::Ok();
}

StatusOr<bool> AsyncClient::AfterStep(int64_t completed, float* params) {
  last_wait_s_ = 0;
  if (!PullsAt(completed)) return false;
  ATOLL_RETURN_IF_ERROR(PushAndPull(completed, params));
  return true;
}

Status AsyncClient::Finish(int64_t completed, float* params,
                           const std::function<Status()>& barrier) {
  last_wait_s_ = 0;
  const double t0 = NowSeconds();
  if (completed > last_push_step_) {
    // The steps since the last push: push them, without taking the intermediate pull's result.
    ATOLL_RETURN_IF_ERROR(PushAndPull(completed, params));
  }
  if (barrier) ATOLL_RETURN_IF_ERROR(barrier());
  ATOLL_ASSIGN_OR_RETURN(version_, ps_->Pull(std::span<float>(params, n_)));
  bytes_received_ += n_ * sizeof(float);
  last_wait_s_ = NowSeconds() - t0;
  return Status::Ok();
}

}  // namespace atl
