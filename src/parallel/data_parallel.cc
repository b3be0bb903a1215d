#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "core/log.h"

namespace atl {

namespace {
constexpr double kFixedScale = 0x1p40;  // units of 2^-40
constexpr double kFixedUnscale = 0x1p-40;
}  // namespace

std::vector<GradBucket> MakeGradBuckets(const GPTConfig& cfg, double bucket_bytes,
                                        size_t elem_bytes) {
  const auto layout = ParameterLayout(cfg);
  const size_t n = NumParameters(cfg);
  const int L = cfg.n_layer;
  std::vector<size_t> block_begin(size_t(std::max(L, 0)), n);
  for (const auto& t : layout)
    if (t.layer >= 0)
      block_begin[size_t(t.layer)] = std::min(block_begin[size_t(t.layer)], t.offset);
  std::vector<GradBucket> out;
  size_t end = n;
  for (int l = L - 1; l >= 1; --l) {
    if (double(end - block_begin[size_t(l)]) * double(elem_bytes) >= bucket_bytes) {
      out.push_back({block_begin[size_t(l)], end, l});
      end = block_begin[size_t(l)];
    }
  }
  out.push_back({0, end, -1});
  return out;
}

GradientReducer::GradientReducer(Communicator* comm, const GPTConfig& cfg, double bucket_mb,
                                 bool reproducible, int64_t micro_batches)
    : comm_(comm),
      reproducible_(reproducible),
      micro_batches_(std::max<int64_t>(micro_batches, 1)),
      n_(NumParameters(cfg)),
      buckets_(MakeGradBuckets(cfg, bucket_mb * 1024.0 * 1024.0,
                               reproducible ? sizeof(int64_t) : sizeof(float))),
      handles_(buckets_.size()),
      started_(buckets_.size(), false) {
  if (reproducible_) acc_.assign(n_, 0);
}

void GradientReducer::Begin() {
  std::fill(started_.begin(), started_.end(), false);
  hook_status_ = Status::Ok();
}

void GradientReducer::Launch(size_t i, float* grads) {
  started_[i] = true;
  if (reproducible_) {
    Status s = AddRange(grads, buckets_[i].begin, buckets_[i].end);
    if (!s.ok() && hook_status_.ok()) hook_status_ = s;
  }
  if (comm_ == nullptr || comm_->size() == 1) return;
  const GradBucket& b = buckets_[i];
  if (reproducible_)
    handles_[i] = comm_->IAllReduce(acc_.data() + b.begin, b.end - b.begin, DType::kInt64);
  else
    handles_[i] = comm_->IAllReduce(grads + b.begin, b.end - b.begin, DType::kFloat32);
}

std::function<void(int)> GradientReducer::Hook(float* grads) {
  return [this, grads](int layer) {
    for (size_t i = 0; i < buckets_.size(); ++i)
      if (!started_[i] && buckets_[i].ready_after == layer) Launch(i, grads);
  };
}

void GradientReducer::BeginFixedPoint() {
  Begin();
  std::fill(acc_.begin(), acc_.end(), int64_t{0});
}

Status GradientReducer::AddRange(float* grads, size_t begin, size_t end) {
  // |sum| over every micro-batch of the step stays below 2^62 units. One pass, vectorizable:
  // rint (round half to even, inlined) and the range check as a flag.
  const double limit = std::ldexp(1.0, 62) / double(micro_batches_);
  const int64_t b = int64_t(begin), e = int64_t(end);
  int64_t* acc = acc_.data();
  int ok = 1;
#pragma omp parallel for simd schedule(static) reduction(& : ok)
  for (int64_t i = b; i < e; ++i) {
    const double v = double(grads[i]) * kFixedScale;
    const bool in_range = std::fabs(v) < limit;
    ok &= int(in_range);
    acc[i] += in_range ? int64_t(std::rint(v)) : 0;
    grads[i] = 0.0f;
  }
  if (!ok)
    return Status::Internal(fmt::format(
        "parallel.reproducible: a gradient element in {}..{} is outside the fixed-point range "
        "(|g| < {} with {} micro-batches per step, or not finite); the run diverged or needs "
        "parallel.reproducible = false",
        begin, end, limit * kFixedUnscale, micro_batches_));
  return Status::Ok();
}

Status GradientReducer::Add(float* grads) { return AddRange(grads, 0, n_); }

Status GradientReducer::Finish(float* grads) {
  const double t0 = NowSeconds();
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!started_[i]) Launch(i, grads);
  Status first = hook_status_;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Status s = handles_[i].Wait();
    if (!s.ok() && first.ok())
      first = s.WithContext(fmt::format("data-parallel gradient bucket {} (elements {}..{})", i,
                                        buckets_[i].begin, buckets_[i].end));
  }
  if (first.ok() && reproducible_) {
    const int64_t n = int64_t(n_);
    const int64_t* acc = acc_.data();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) grads[i] = float(double(acc[i]) * kFixedUnscale);
  }
  last_wait_s_ = NowSeconds() - t0;
  return first;
}

}  // namespace atl
