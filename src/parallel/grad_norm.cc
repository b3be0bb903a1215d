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
constexpr double kUnitScale = 0x1p20;  // squares in units of 2^-20 ...
constexpr double kRemScale = 0x1p44;   // ... and the rest in units of 2^-64
constexpr double kLimit = 0x1p42;      // g^2 * 2^20 < 2^62
constexpr int64_t kChunk = 1 << 16;    // remainders of a chunk sum below 2^60
}  // namespace

void ExactSquareSum::Add(const float* g, size_t n) {
  const int64_t chunks = (int64_t(n) + kChunk - 1) / kChunk;
  int64_t units = 0, rem = 0;
  int ok = 1;
#pragma omp parallel for schedule(static) reduction(+ : units, rem) reduction(& : ok)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t b = c * kChunk, e = std::min<int64_t>(int64_t(n), b + kChunk);
    int64_t cu = 0, cr = 0;
    int cok = 1;
#pragma omp simd reduction(+ : cu, cr) reduction(& : cok)
    for (int64_t i = b; i < e; ++i) {
      const double x = double(g[i]);
      const double s = x * x * kUnitScale;  // exact: 48 significant bits
      const bool in = s < kLimit;           // false for NaN too
      cok &= int(in);
      const double whole = in ? std::floor(s) : 0.0;
      cu += int64_t(whole);
      cr += int64_t((in ? s - whole : 0.0) * kRemScale);
    }
    units += cu + (cr >> 44);
    rem += cr & ((int64_t{1} << 44) - 1);
    ok &= cok;
  }
  units_ += units + (rem >> 44);
  rem_ += rem & ((int64_t{1} << 44) - 1);
  ok_ = ok_ && ok != 0;
}

double ExactSquareSum::Value(const std::vector<int64_t>& parts, int ranks) {
  if (parts.size() != 3 || parts[2] != ranks) return std::numeric_limits<double>::quiet_NaN();
  return double(parts[0]) / kUnitScale + double(parts[1]) / (kUnitScale * kRemScale);
}

}  // namespace atl
