#include "parallel/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iterator>
#include <limits>
#include <map>
#include <stdexcept>

#include "core/log.h"

namespace atl {

namespace {
constexpr double kFixedScale = 0x1p40;  // units of 2^-40
constexpr double kFixedUnscale = 0x1p-40;
}  // namespace

std::vector<GradBucket> MakeGradBuckets(const std::vector<ParamTensor>& layout, double bucket_bytes,
                                        size_t elem_bytes) {
  size_t n = 0;
  std::map<int, size_t> block_begin;  // global layer -> its first element
  for (const auto& t : layout) {
    n = std::max(n, t.offset + t.numel);
    if (t.layer < 0) continue;
    auto [it, inserted] = block_begin.emplace(t.layer, t.offset);
    if (!inserted) it->second = std::min(it->second, t.offset);
  }
  std::vector<GradBucket> out;
  size_t end = n;
  // From the top block down to the second lowest: the lowest always goes with the final bucket.
  for (auto it = block_begin.rbegin(); it != block_begin.rend(); ++it) {
    if (std::next(it) == block_begin.rend()) break;
    if (double(end - it->second) * double(elem_bytes) >= bucket_bytes) {
      out.push_back({it->second, end, it->first});
      end = it->second;
    }
  }
  out.push_back({0, end, -1});
  return out;
}

std::vector<GradBucket> MakeGradBuckets(const GPTConfig& cfg, double bucket_bytes,
                                        size_t elem_bytes) {
  return MakeGradBuckets(ParameterLayout(cfg), bucket_bytes, elem_bytes);
}

GradientReducer::GradientReducer(Communicator* comm, const GPTConfig& cfg, double bucket_mb,
                                 bool reproducible, int64_t micro_batches)
    : GradientReducer(comm, ParameterLayout(cfg),
                      Options{.bucket_mb = bucket_mb,
                              .reproducible = reproducible,
                              .micro_batches = micro_batches,
                              .zero = false}) {}

GradientReducer::GradientReducer(Communicator* comm, const std::vector<ParamTensor>& layout,
                                 Options options)
    : comm_(comm),
      reproducible_(options.reproducible),
      zero_(options.zero),
      micro_batches_(std::max<int64_t>(options.micro_batches, 1)),
      ranks_(options.zero && comm != nullptr ? std::max(comm->size(), 1) : 1),
      buckets_(MakeGradBuckets(layout, options.bucket_mb * 1024.0 * 1024.0,
                               options.reproducible ? sizeof(int64_t) : sizeof(float))),
      handles_(buckets_.size()),
      started_(buckets_.size(), false) {
  if (device_memory() && (reproducible_ || zero_))
    throw std::invalid_argument(
        "GradientReducer: a communicator of device memory (NCCL) sums in the normal mode only "
        "(the reproducible mode and ZeRO-1 work on host memory)");
  for (const auto& t : layout) n_ = std::max(n_, t.offset + t.numel);
  const size_t D = size_t(ranks_), r = comm != nullptr ? size_t(comm->rank()) : 0;
  // owned_: bucket by bucket from the bottom of the buffer (the last bucket) up.
  owned_.resize(buckets_.size());
  splits_.resize(buckets_.size());
  size_t stage = 0, small = 0, acc = 0;
  for (size_t k = 0; k < buckets_.size(); ++k) {
    const size_t i = buckets_.size() - 1 - k;
    const GradBucket& b = buckets_[i];
    const size_t len = b.end - b.begin;
    const size_t p = (len + D - 1) / D;
    const size_t own_b = std::min(b.end, b.begin + r * p), own_e = std::min(b.end, own_b + p);
    owned_[k] = {own_b, own_e - own_b, shard_size_};
    shard_size_ += own_e - own_b;
    Split& sp = splits_[i];
    sp.piece = p;
    sp.padded = D * p > len;
    sp.stage = stage;
    if (sp.padded) stage += D * p;
    sp.small = small;
    small += p;
    sp.acc = sharded() ? acc : b.begin;
    acc += D * p;
  }
  if (reproducible_) acc_.assign(sharded() ? acc : n_, 0);
  if (sharded()) {
    shard_.assign(shard_size_, 0.0f);
    stage_.assign(stage, 0.0f);
    small_.assign(small, 0.0f);
    if (reproducible_) recv64_.assign(small, 0);
    shard_grads_ = shard_.data();
  }
}

std::vector<size_t> GradientReducer::Cuts() const {
  std::vector<size_t> cuts;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& b = buckets_[i];
    cuts.push_back(b.begin);
    cuts.push_back(b.end);
    if (sharded())
      for (int r = 1; r < ranks_; ++r)
        cuts.push_back(std::min(b.end, b.begin + size_t(r) * splits_[i].piece));
  }
  return cuts;
}

void GradientReducer::Begin() {
  if (checksum_ != nullptr) checksum_->Begin();
  std::fill(started_.begin(), started_.end(), false);
  hook_status_ = Status::Ok();
}

void GradientReducer::set_checksum(GradChecksum* c) {
  if (c != nullptr && device_memory())
    throw std::invalid_argument(
        "GradientReducer: gradient checksums read host memory; this communicator sums GPU "
        "memory (NCCL)");
  checksum_ = c;
}

void GradientReducer::Launch(size_t i, float* grads) {
  started_[i] = true;
  const GradBucket& b = buckets_[i];
  const size_t len = b.end - b.begin;
  const Split& sp = splits_[i];
  if (reproducible_) {
    Status s = AddRange(grads, b.begin, b.end, acc_.data() + sp.acc);
    if (!s.ok() && hook_status_.ok()) hook_status_ = s;
  }
  // This replica's contribution, before the reduction starts to change it.
  if (checksum_ != nullptr) {
    if (reproducible_)
      checksum_->PredictFixed(acc_.data() + sp.acc, b.begin, b.end, kFixedUnscale);
    else
      checksum_->Predict(grads, b.begin, b.end);
  }
  if (comm_ == nullptr || comm_->size() == 1 || len == 0) return;
  if (!sharded()) {
    if (reproducible_)
      handles_[i] = comm_->IAllReduce(acc_.data() + b.begin, len, DType::kInt64);
    else
      handles_[i] = comm_->IAllReduce(grads + b.begin, len, DType::kFloat32);
    return;
  }
  // ZeRO: reduce-scatter D blocks of p. The int64 accumulator is padded per bucket already; the
  // float gradients go through the zero-padded staging unless D divides the bucket.
  const OwnedRange& own = Owned(i);
  if (reproducible_) {
    handles_[i] = comm_->IReduceScatter(acc_.data() + sp.acc, recv64_.data() + sp.small, sp.piece,
                                        DType::kInt64);
    return;
  }
  const float* send = grads + b.begin;
  if (sp.padded) {
    float* st = stage_.data() + sp.stage;
    std::memcpy(st, send, len * sizeof(float));
    std::fill(st + len, st + size_t(ranks_) * sp.piece, 0.0f);
    send = st;
  }
  // A short (or empty) piece is received whole into small_ and copied by Finish.
  float* recv = own.length == sp.piece ? shard_.data() + own.shard_begin : small_.data() + sp.small;
  handles_[i] = comm_->IReduceScatter(send, recv, sp.piece, DType::kFloat32);
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

Status GradientReducer::AddRange(float* grads, size_t begin, size_t end, int64_t* acc) {
  // acc[k] accumulates grads[begin + k]. |sum| over every micro-batch of the step stays below
  // 2^62 units. One pass, vectorizable: rint (round half to even, inlined) and the range check
  // as a flag.
  const double limit = std::ldexp(1.0, 62) / double(micro_batches_);
  const int64_t len = int64_t(end - begin);
  float* g = grads + begin;
  int ok = 1;
#pragma omp parallel for simd schedule(static) reduction(& : ok)
  for (int64_t k = 0; k < len; ++k) {
    const double v = double(g[k]) * kFixedScale;
    const bool in_range = std::fabs(v) < limit;
    ok &= int(in_range);
    acc[k] += in_range ? int64_t(std::rint(v)) : 0;
    g[k] = 0.0f;
  }
  if (!ok)
    return Status::Internal(fmt::format(
        "parallel.reproducible: a gradient element in {}..{} is outside the fixed-point range "
        "(|g| < {} with {} micro-batches per step, or not finite); the run diverged or needs "
        "parallel.reproducible = false",
        begin, end, limit * kFixedUnscale, micro_batches_));
  return Status::Ok();
}

Status GradientReducer::Add(float* grads) {
  if (!sharded()) return AddRange(grads, 0, n_, acc_.data());
  // The accumulator is padded per bucket: one pass per bucket.
  Status first;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Status s = AddRange(grads, buckets_[i].begin, buckets_[i].end, acc_.data() + splits_[i].acc);
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

void GradientReducer::ConvertFixed(float* grads) const {
  const int64_t n = int64_t(n_);
  const int64_t* acc = acc_.data();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) grads[i] = float(double(acc[i]) * kFixedUnscale);
}

Status GradientReducer::Finish(float* grads) {
  const double t0 = NowSeconds();
  for (size_t i = 0; i < buckets_.size(); ++i)
    if (!started_[i]) Launch(i, grads);
  Status first = hook_status_;
  bool waited = true;  // every reduction completed (a failed hook is this rank's alone)
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Status s = handles_[i].Wait();
    waited &= s.ok();
    if (!s.ok() && first.ok())
      first = s.WithContext(fmt::format("data-parallel gradient bucket {} (elements {}..{})", i,
                                        buckets_[i].begin, buckets_[i].end));
  }
  if (!sharded()) {
    shard_grads_ = grads;
    if (first.ok() && reproducible_) ConvertFixed(grads);
  } else if (first.ok()) {
    // The owned pieces into shard_: converted from int64, or copied where received short.
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const OwnedRange& own = Owned(i);
      const Split& sp = splits_[i];
      float* out = shard_.data() + own.shard_begin;
      if (reproducible_) {
        const int64_t len = int64_t(own.length);
        const int64_t* in = recv64_.data() + sp.small;
#pragma omp parallel for schedule(static)
        for (int64_t k = 0; k < len; ++k) out[k] = float(double(in[k]) * kFixedUnscale);
      } else if (own.length != sp.piece) {
        std::memcpy(out, small_.data() + sp.small, own.length * sizeof(float));
      }
    }
  }
  // Every replica takes part in the records' reduction unless the group itself failed.
  if (waited && checksum_ != nullptr) {
    Status s = checksum_->Reduce(comm_);
    if (first.ok()) first = s;
  }
  last_wait_s_ = NowSeconds() - t0;
  return first;
}

Status GradientReducer::Gather(float* local, const float* shard) {
  const double t0 = NowSeconds();
  if (!sharded()) {
    // Every piece is this rank's: shard coordinates are local coordinates.
    if (shard != nullptr && shard != local) std::memcpy(local, shard, n_ * sizeof(float));
    last_gather_s_ = NowSeconds() - t0;
    return Status::Ok();
  }
  std::vector<CommHandle> handles(buckets_.size());
  for (size_t i = 0; i < buckets_.size(); ++i) {
    const GradBucket& b = buckets_[i];
    const OwnedRange& own = Owned(i);
    const Split& sp = splits_[i];
    if (sp.piece == 0) continue;
    const float* mine = shard != nullptr ? shard + own.shard_begin : local + own.local_begin;
    const float* send = mine;
    if (shard == nullptr || own.length != sp.piece) {
      // In place (the send may not overlap the receive) or short: a zero-padded copy.
      float* sm = small_.data() + sp.small;
      std::memcpy(sm, mine, own.length * sizeof(float));
      std::fill(sm + own.length, sm + sp.piece, 0.0f);
      send = sm;
    }
    float* recv = sp.padded ? stage_.data() + sp.stage : local + b.begin;
    handles[i] = comm_->IAllGather(send, recv, sp.piece, DType::kFloat32);
  }
  Status first;
  for (size_t i = 0; i < buckets_.size(); ++i) {
    Status s = handles[i].Wait();
    if (!s.ok() && first.ok())
      first = s.WithContext(fmt::format("ZeRO all-gather, bucket {} (elements {}..{})", i,
                                        buckets_[i].begin, buckets_[i].end));
  }
  if (first.ok()) {
    for (size_t i = 0; i < buckets_.size(); ++i) {
      const GradBucket& b = buckets_[i];
      if (splits_[i].padded)
        std::memcpy(local + b.begin, stage_.data() + splits_[i].stage,
                    (b.end - b.begin) * sizeof(float));
    }
  }
  last_gather_s_ = NowSeconds() - t0;
  return first;
}

Status GradientReducer::AllGather(float* local, const float* shard) { return Gather(local, shard); }

Status GradientReducer::AllGatherInPlace(float* local) { return Gather(local, nullptr); }

}  // namespace atl
