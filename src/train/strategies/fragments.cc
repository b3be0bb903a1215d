#include "train/strategies/fragments.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace atl {

namespace {

// Appends [b, e) to f, merging it with the last range when they touch.
void Add(Fragment& f, size_t b, size_t e) {
  if (b >= e) return;
  if (!f.ranges.empty() && f.ranges.back().end == b)
    f.ranges.back().end = e;
  else
    f.ranges.push_back({b, e});
}

}  // namespace

size_t Fragment::size() const {
  size_t n = 0;
  for (const Range& r : ranges) n += r.size();
  return n;
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

std::vector<Fragment> WholeBuffer(size_t n) {
  Fragment f;
  Add(f, 0, n);
  return {f};
}

std::vector<Fragment> StreamingFragments(const GPTConfig& cfg, int parts) {
  const size_t total = NumParameters(cfg);
  if (parts <= 1) return WholeBuffer(total);
  // Each block's range, and the ranges outside the blocks (wte + wpe at the start, ln_f at the
  // end), from the layout.
  const int L = cfg.n_layer;
  std::vector<Range> blocks(static_cast<size_t>(L), Range{total, 0});
  std::vector<Range> outside;
  for (const ParamTensor& t : ParameterLayout(cfg)) {
    if (t.layer >= 0) {
      Range& r = blocks[size_t(t.layer)];
      r.begin = std::min(r.begin, t.offset);
      r.end = std::max(r.end, t.offset + t.numel);
    } else if (!outside.empty() && outside.back().end == t.offset) {
      outside.back().end = t.offset + t.numel;
    } else {
      outside.push_back({t.offset, t.offset + t.numel});
    }
  }
  size_t outside_n = 0;
  for (const Range& r : outside) outside_n += r.size();
  const double share = double(outside_n) / double(total);
  int e = std::clamp(int(std::lround(parts * share)), 1, parts - 1);
  int b = parts - e;
  if (b > L) {
    b = L;
    e = parts - b;
  }
  std::vector<Fragment> out(static_cast<size_t>(parts));
  for (int l = 0; l < L; ++l)
    Add(out[size_t(l % b)], blocks[size_t(l)].begin, blocks[size_t(l)].end);
  // The embedding pieces: the outside ranges as one sequence, cut into e even pieces.
  const std::vector<Range> pieces = SplitEvenly(outside_n, e);
  for (int k = 0; k < e; ++k) {
    Fragment& f = out[size_t(b + k)];
    size_t seen = 0;  // position in the sequence of outside elements
    for (const Range& r : outside) {
      const size_t lo = std::max(pieces[size_t(k)].begin, seen);
      const size_t hi = std::min(pieces[size_t(k)].end, seen + r.size());
      if (lo < hi) Add(f, r.begin + (lo - seen), r.begin + (hi - seen));
      seen += r.size();
    }
  }
  return out;
}

void Gather(const Fragment& f, const float* flat, float* packed) {
  for (const Range& r : f.ranges) {
    std::memcpy(packed, flat + r.begin, r.size() * sizeof(float));
    packed += r.size();
  }
}

void Scatter(const Fragment& f, const float* packed, float* flat) {
  for (const Range& r : f.ranges) {
    std::memcpy(flat + r.begin, packed, r.size() * sizeof(float));
    packed += r.size();
  }
}

}  // namespace atl
