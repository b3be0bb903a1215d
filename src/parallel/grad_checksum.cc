#include "parallel/grad_checksum.h"

#include <algorithm>
#include <cmath>
#include <span>
#include <utility>

#include "core/log.h"

namespace atl {

GradChecksum::GradChecksum(size_t n, size_t chunk, std::vector<size_t> cuts) : n_(n) {
  chunk = std::max<size_t>(chunk, 1);
  for (size_t b = 0; b < n; b += chunk) bounds_.push_back(b);
  for (size_t c : cuts)
    if (c < n) bounds_.push_back(c);
  bounds_.push_back(n);
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  if (bounds_.size() == 1) bounds_.push_back(0);  // n = 0: one empty segment
  records_.assign(2 * segments(), 0.0);
}

void GradChecksum::Begin() { std::fill(records_.begin(), records_.end(), 0.0); }

size_t GradChecksum::SegmentAt(size_t offset) const {
  return size_t(std::lower_bound(bounds_.begin(), bounds_.end(), offset) - bounds_.begin());
}

template <typename Value>
void GradChecksum::Record(size_t begin, size_t end, Value value) {
  const double t0 = NowSeconds();
  const int64_t first = int64_t(SegmentAt(begin)), last = int64_t(SegmentAt(end));
#pragma omp parallel for schedule(static)
  for (int64_t k = first; k < last; ++k) {
    double sum = 0, mag = 0;
    const size_t b = bounds_[size_t(k)], e = bounds_[size_t(k) + 1];
#pragma omp simd reduction(+ : sum, mag)
    for (size_t i = b; i < e; ++i) {
      const double v = value(i);
      sum += v;
      mag += std::fabs(v);
    }
    records_[2 * size_t(k)] += sum;
    records_[2 * size_t(k) + 1] += mag;
  }
  seconds_ += NowSeconds() - t0;
}

void GradChecksum::Predict(const float* g, size_t begin, size_t end) {
  Record(begin, end, [g](size_t i) { return double(g[i]); });
}

void GradChecksum::PredictFixed(const int64_t* acc, size_t begin, size_t end, double unit) {
  Record(begin, end, [acc, begin, unit](size_t i) { return double(acc[i - begin]) * unit; });
}

Status GradChecksum::Reduce(Communicator* dp) {
  if (dp == nullptr || dp->size() == 1) return Status::Ok();
  return dp->AllReduce(std::span<double>(records_));
}

void GradChecksum::Check(const float* x, size_t begin, size_t end, int replicas,
                         Mismatch* out) const {
  const double t0 = NowSeconds();
  const int64_t first = int64_t(SegmentAt(begin)), last = int64_t(SegmentAt(end));
  const double k = double(std::max(replicas - 1, 1));
  const double rel = 2.0 * (k * 0x1p-24 + 0x1p-45);
  std::vector<double> got(size_t(last - first));
#pragma omp parallel for schedule(static)
  for (int64_t s = first; s < last; ++s) {
    double sum = 0;
    const size_t b = bounds_[size_t(s)], e = bounds_[size_t(s) + 1];
#pragma omp simd reduction(+ : sum)
    for (size_t i = b; i < e; ++i) sum += double(x[i - begin]);
    got[size_t(s - first)] = sum;
  }
  for (int64_t s = first; s < last; ++s) {
    const double expected = records_[2 * size_t(s)], mag = records_[2 * size_t(s) + 1];
    if (!std::isfinite(expected) || !std::isfinite(mag)) continue;  // the guard's to judge
    const double len = double(bounds_[size_t(s) + 1] - bounds_[size_t(s)]);
    const double bound = rel * mag + len * double(replicas) * 0x1p-126;
    const double g = got[size_t(s - first)];
    if (std::isfinite(g) && std::fabs(g - expected) <= bound) continue;
    if (out->count++ > 0) continue;
    out->begin = bounds_[size_t(s)];
    out->end = bounds_[size_t(s) + 1];
    out->got = g;
    out->expected = expected;
    out->bound = bound;
  }
  seconds_ += NowSeconds() - t0;
}

}  // namespace atl
