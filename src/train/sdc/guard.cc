#include "train/sdc/guard.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace atl {

double StepGuard::Median(std::vector<double> v) {
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  const size_t mid = v.size() / 2;
  std::nth_element(v.begin(), v.begin() + mid, v.end());
  const double upper = v[mid];
  if (v.size() % 2 == 1) return upper;
  const double lower = *std::max_element(v.begin(), v.begin() + mid);
  return 0.5 * (lower + upper);
}

void StepGuard::Add(History& h, double v) const {
  h.values.push_back(v);
  while (h.values.size() > o_.window) h.values.pop_front();
}

namespace {
double Log(double v) { return std::log(std::max(v, 1e-300)); }
}  // namespace

std::vector<StepGuard::Outlier> StepGuard::Check(const std::vector<Signal>& step) {
  const size_t warmup = std::min(o_.warmup, o_.window);
  std::vector<Outlier> out;
  for (const Signal& s : step) {
    History& h = history_[s.name];
    bool outlier = !std::isfinite(s.value);
    const double x = outlier ? 0 : Log(s.value);
    double median = 0, scale = 0;
    if (!outlier && h.values.size() >= warmup && !h.values.empty()) {
      const std::vector<double> v(h.values.begin(), h.values.end());
      median = Median(v);
      std::vector<double> dev(v.size());
      for (size_t i = 0; i < v.size(); ++i) dev[i] = std::abs(v[i] - median);
      scale = std::max(1.4826 * Median(dev), o_.log_floor);
      outlier = std::abs(x - median) > o_.threshold * scale;
    }
    if (!outlier) {
      h.outliers.clear();
      Add(h, x);
      continue;
    }
    if (std::isfinite(s.value))
      out.push_back({s.name, s.value, std::exp(median), std::abs(x - median) / scale});
    else
      out.push_back({s.name, s.value, 0, 0});
    if (!std::isfinite(s.value)) continue;
    h.outliers.push_back(x);
    if (h.outliers.size() >= o_.shift_after) {  // a new level: start over from it
      h.values.clear();
      for (double x : h.outliers) Add(h, x);
      h.outliers.clear();
    }
  }
  return out;
}

void StepGuard::Accept(const std::vector<Signal>& step) {
  for (const Signal& s : step) {
    if (!std::isfinite(s.value)) continue;
    History& h = history_[s.name];
    h.outliers.clear();
    Add(h, Log(s.value));
  }
}

}  // namespace atl
