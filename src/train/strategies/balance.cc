#include "train/strategies/balance.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace atl {

std::vector<int64_t> BalancedCounts(std::span<const int> live, std::span<const double> seconds,
                                    int64_t total) {
  const size_t k = live.size();
  std::vector<int64_t> counts(k, total / int64_t(k));
  bool measured = true;
  std::vector<double> speed(k);
  for (size_t i = 0; i < k; ++i) {
    const int s = live[i];
    const double t = s >= 0 && size_t(s) < seconds.size() ? seconds[size_t(s)] : 0.0;
    measured = measured && t > 0 && std::isfinite(t);
    speed[i] = measured ? 1.0 / t : 0.0;
  }
  if (!measured) {
    for (size_t i = 0; i < size_t(total % int64_t(k)); ++i) ++counts[i];
    return counts;
  }
  // One each first (every live site keeps being measured), the rest by speed.
  const int64_t rest = total - int64_t(k);
  const double sum = std::accumulate(speed.begin(), speed.end(), 0.0);
  std::vector<double> fraction(k);
  int64_t given = 0;
  for (size_t i = 0; i < k; ++i) {
    const double want = double(rest) * speed[i] / sum;
    const int64_t whole = std::min<int64_t>(rest, int64_t(std::floor(want)));
    counts[i] = 1 + whole;
    fraction[i] = want - double(whole);
    given += whole;
  }
  std::vector<size_t> order(k);
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return fraction[a] > fraction[b]; });
  for (size_t j = 0; given < rest; j = (j + 1) % k, ++given) ++counts[order[j]];
  return counts;
}

std::vector<std::pair<int64_t, int64_t>> ShareOfSite(std::span<const int> live,
                                                     std::span<const int64_t> counts, int site) {
  int64_t from = 0;
  for (size_t i = 0; i < live.size() && i < counts.size(); ++i) {
    if (live[i] == site) return {{from, from + counts[i]}};
    from += counts[i];
  }
  return {};
}

}  // namespace atl
