#include "train/optimizer.h"

#include <algorithm>
#include <cmath>

namespace atl {

namespace {
// Work split: chunk boundaries are multiples of kChunk from the start of the buffer, never a
// function of the thread count.
constexpr size_t kChunk = size_t{1} << 14;
}  // namespace

bool DecaysWeight(const ParamTensor& t) { return t.shape.size() == 2; }

double GradNorm(const float* g, size_t n) {
  const size_t chunks = (n + kChunk - 1) / kChunk;
  std::vector<double> partial(chunks, 0.0);
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t b = c * kChunk, e = std::min(n, b + kChunk);
    double s = 0.0;
    for (size_t i = b; i < e; ++i) s += double(g[i]) * double(g[i]);
    partial[c] = s;
  }
  double total = 0.0;
  for (double s : partial) total += s;
  return std::sqrt(total);
}

float ClipScale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return float(max_norm / (norm + 1e-6));
}

AdamW::AdamW(const std::vector<ParamTensor>& layout, Hyper hyper) : hyper_(hyper) {
  size_t n = 0;
  for (const auto& t : layout) {
    const bool decay = DecaysWeight(t) && hyper.weight_decay != 0.0;
    if (!ranges_.empty() && ranges_.back().decay == decay && ranges_.back().end == t.offset) {
      ranges_.back().end = t.offset + t.numel;
    } else {
      ranges_.push_back({t.offset, t.offset + t.numel, decay});
    }
    n = std::max(n, t.offset + t.numel);
  }
  m_.assign(n, 0.0f);
  v_.assign(n, 0.0f);
}

void AdamW::Step(float* params, const float* grads, double lr, float grad_scale) {
  ++t_;
  const double b1 = hyper_.beta1, b2 = hyper_.beta2;
  const float beta1 = float(b1), one_minus_beta1 = float(1.0 - b1);
  const float beta2 = float(b2), one_minus_beta2 = float(1.0 - b2);
  const float step_size = float(lr / (1.0 - std::pow(b1, double(t_))));
  const float inv_bc2_sqrt = float(1.0 / std::sqrt(1.0 - std::pow(b2, double(t_))));
  const float eps = float(hyper_.eps);
  const float decay_factor = float(1.0 - lr * hyper_.weight_decay);
  float* m = m_.data();
  float* v = v_.data();
  const size_t n = m_.size();
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const Range* ranges = ranges_.data();
  const size_t num_ranges = ranges_.size();
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t cb = c * kChunk, ce = std::min(n, cb + kChunk);
    for (size_t r = 0; r < num_ranges; ++r) {
      const size_t b = std::max(cb, ranges[r].begin), e = std::min(ce, ranges[r].end);
      if (b >= e) continue;
      const float keep = ranges[r].decay ? decay_factor : 1.0f;
      for (size_t i = b; i < e; ++i) {
        const float g = grads[i] * grad_scale;
        m[i] = beta1 * m[i] + one_minus_beta1 * g;
        v[i] = beta2 * v[i] + one_minus_beta2 * (g * g);
        const float denom = std::sqrt(v[i]) * inv_bc2_sqrt + eps;
        params[i] = params[i] * keep - step_size * (m[i] / denom);
      }
    }
  }
}

}  // namespace atl
