#include "parallel/grad_norm.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace atl {

std::vector<std::pair<size_t, size_t>> NormRanges(const GPTConfig& cfg, const ModelShard& shard) {
  std::vector<std::pair<size_t, size_t>> out;
  for (const ParamTensor& t : ShardLayout(cfg, shard)) {
    bool counted;
    if (t.kind == ParamKind::kWte)
      counted = shard.first_stage();  // split by vocabulary; the last stage's copy not counted
    else
      counted = ModelShard::SplitByTensorParallel(t.kind) || shard.tp_rank == 0;
    if (!counted) continue;
    if (!out.empty() && out.back().second == t.offset)
      out.back().second = t.offset + t.numel;
    else
      out.emplace_back(t.offset, t.offset + t.numel);
  }
  return out;
}

std::vector<std::pair<size_t, size_t>> IntersectRanges(
    const std::vector<std::pair<size_t, size_t>>& a,
    const std::vector<std::pair<size_t, size_t>>& b) {
  std::vector<std::pair<size_t, size_t>> out;
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const size_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) out.emplace_back(lo, hi);
    if (a[i].second < b[j].second)
      ++i;
    else
      ++j;
  }
  return out;
}

namespace {
// A square s = g^2 < 2^42 is cut exactly as s = high * 2^20 + mid * 2^-20 + low * 2^-64 (+ what
// lies below 2^-64), high < 2^22, mid < 2^40, low < 2^44: sums of 2^16 of them fit in int64.
constexpr double kLimit = 0x1p42;    // |g| < 2^21
constexpr int64_t kChunk = 1 << 16;  // a chunk's parts sum below 2^38, 2^56, 2^60
constexpr int kMidBits = 40, kLowBits = 44;
constexpr int64_t kMidMask = (int64_t{1} << kMidBits) - 1, kLowMask = (int64_t{1} << kLowBits) - 1;
}  // namespace

void ExactSquareSum::Add(const float* g, size_t n) {
  const int64_t chunks = (int64_t(n) + kChunk - 1) / kChunk;
  int64_t high = 0, mid = 0, low = 0;
  int ok = 1;
#pragma omp parallel for schedule(static) reduction(+ : high, mid, low) reduction(& : ok)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk, e = std::min<int64_t>(int64_t(n), b + kChunk);
    int64_t ch = 0, cm = 0, cl = 0;
    int cok = 1;
#pragma omp simd reduction(+ : ch, cm, cl) reduction(& : cok)
    for (int64_t i = b; i < e; ++i) {
      const double x = double(g[i]);
      const double s = x * x;      // exact: 48 significant bits
      const bool in = s < kLimit;  // false for NaN too
      cok &= int(in);
      const double v = in ? s : 0.0;
      // Every step exact: scaling by powers of two, floor, and subtracting the part taken.
      const double h = std::floor(v * 0x1p-20);
      const double m = (v - h * 0x1p20) * 0x1p20;  // in units of 2^-20, < 2^40
      const double mw = std::floor(m);
      ch += int64_t(h);
      cm += int64_t(mw);
      cl += int64_t((m - mw) * 0x1p44);
    }
    cm += cl >> kLowBits;
    high += ch + (cm >> kMidBits);
    mid += cm & kMidMask;
    low += cl & kLowMask;
    ok &= cok;
  }
  mid += low >> kLowBits;
  high_ += high + (mid >> kMidBits);
  mid_ += mid & kMidMask;
  low_ += low & kLowMask;
  ok_ = ok_ && ok != 0;
}

double ExactSquareSum::Value(const std::vector<int64_t>& parts, int ranks) {
  if (parts.size() != 4 || parts[3] != ranks) return std::numeric_limits<double>::quiet_NaN();
  return double(parts[0]) * 0x1p20 + double(parts[1]) * 0x1p-20 + double(parts[2]) * 0x1p-64;
}

}  // namespace atl
