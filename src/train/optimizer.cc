#include "train/optimizer.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace atl {

namespace {
// Work split: chunk boundaries are multiples of kChunk from the start of the buffer, never a
// function of the thread count.
constexpr size_t kChunk = size_t{1} << 14;
}  // namespace

bool DecaysWeight(const ParamTensor& t) { return t.shape.size() == 2; }

double GradSquaredSum(const float* g, size_t n) {
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
  return total;
}

double GradNorm(const float* g, size_t n) { return std::sqrt(GradSquaredSum(g, n)); }

float ClipScale(double norm, double max_norm) {
  if (max_norm <= 0 || !(norm > max_norm)) return 1.0f;
  return float(max_norm / (norm + 1e-6));
}

void AdamW::AddSegment(size_t begin, size_t end, size_t shift, bool decay, size_t tensor) {
  if (begin >= end) return;
  owned_numel_[tensor] += end - begin;
  if (!segments_.empty()) {
    Segment& last = segments_.back();
    if (last.end == begin && last.shift == shift && last.tensor == tensor) {
      last.end = end;
      return;
    }
  }
  segments_.push_back({begin, end, shift, decay, tensor});
}

namespace {
size_t LayoutEnd(const std::vector<ParamTensor>& layout) {
  size_t n = 0;
  for (const auto& t : layout) n = std::max(n, t.offset + t.numel);
  return n;
}
}  // namespace

AdamW::AdamW(const std::vector<ParamTensor>& layout, Hyper hyper)
    : AdamW(layout, hyper, {{0, LayoutEnd(layout)}}) {}

AdamW::AdamW(const std::vector<ParamTensor>& layout, Hyper hyper,
             const std::vector<OwnedRange>& owned)
    : hyper_(hyper) {
  // The tensors by offset, for the lookup of each owned range's first tensor.
  std::vector<const ParamTensor*> tensors;
  for (const auto& t : layout) tensors.push_back(&t);
  std::sort(tensors.begin(), tensors.end(),
            [](const ParamTensor* a, const ParamTensor* b) { return a->offset < b->offset; });
  owned_numel_.assign(layout.size(), 0);
  update_sq_.assign(layout.size(), 0.0);
  size_t state = 0;
  for (const auto& [local_begin, length] : owned) {
    const size_t local_end = local_begin + length;
    // The first tensor that ends after local_begin; then every tensor the range overlaps. Local
    // elements outside every tensor keep their state slot but are never updated.
    auto it =
        std::upper_bound(tensors.begin(), tensors.end(), local_begin,
                         [](size_t x, const ParamTensor* t) { return x < t->offset + t->numel; });
    for (; it != tensors.end() && (*it)->offset < local_end; ++it) {
      const ParamTensor& t = **it;
      const size_t b = std::max(local_begin, t.offset);
      const size_t e = std::min(local_end, t.offset + t.numel);
      const size_t shift = local_begin - state;  // local = state + shift, modulo 2^64
      AddSegment(b - shift, e - shift, shift, DecaysWeight(t) && hyper.weight_decay != 0.0,
                 size_t(&t - layout.data()));
    }
    state += length;
  }
  m_.assign(state, 0.0f);
  v_.assign(state, 0.0f);
  // Each chunk's pieces of segments, for the update's squares.
  const size_t chunks = (state + kChunk - 1) / kChunk;
  chunk_first_.assign(chunks, 0);
  slot_begin_.assign(chunks + 1, 0);
  for (size_t c = 0; c < chunks; ++c) {
    const size_t cb = c * kChunk, ce = std::min(state, cb + kChunk);
    auto seg = std::upper_bound(segments_.begin(), segments_.end(), cb,
                                [](size_t x, const Segment& s) { return x < s.end; });
    chunk_first_[c] = size_t(seg - segments_.begin());
    size_t pieces = 0;
    for (; seg != segments_.end() && seg->begin < ce; ++seg) ++pieces;
    slot_begin_[c + 1] = slot_begin_[c] + pieces;
  }
  slots_.assign(slot_begin_.back(), 0.0);
}

AdamW::Scalars AdamW::ScalarsAt(double lr) const {
  const double b1 = hyper_.beta1, b2 = hyper_.beta2;
  return Scalars{.beta1 = float(b1),
                 .one_minus_beta1 = float(1.0 - b1),
                 .beta2 = float(b2),
                 .one_minus_beta2 = float(1.0 - b2),
                 .step_size = float(lr / (1.0 - std::pow(b1, double(t_)))),
                 .inv_bc2_sqrt = float(1.0 / std::sqrt(1.0 - std::pow(b2, double(t_)))),
                 .eps = float(hyper_.eps),
                 .decay_factor = float(1.0 - lr * hyper_.weight_decay)};
}

void AdamW::Step(float* params, const float* grads, double lr, float grad_scale) {
  if (device_) throw std::logic_error("AdamW::Step on host memory after PlaceOnDevice");
  ++t_;
  const Scalars sc = ScalarsAt(lr);
  const float beta1 = sc.beta1, one_minus_beta1 = sc.one_minus_beta1;
  const float beta2 = sc.beta2, one_minus_beta2 = sc.one_minus_beta2;
  const float step_size = sc.step_size, inv_bc2_sqrt = sc.inv_bc2_sqrt, eps = sc.eps;
  const float decay_factor = sc.decay_factor;
  float* m = m_.data();
  float* v = v_.data();
  const size_t n = m_.size();
  const size_t chunks = (n + kChunk - 1) / kChunk;
  const Segment* segments = segments_.data();
  const Segment* segments_end = segments + segments_.size();
  double* slots = slots_.data();
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < chunks; ++c) {
    const size_t cb = c * kChunk, ce = std::min(n, cb + kChunk);
    // The chunk's first segment (the first that ends after cb), then each one that starts
    // before ce.
    const Segment* seg = segments + chunk_first_[c];
    double* slot = slots + slot_begin_[c];
    for (; seg != segments_end && seg->begin < ce; ++seg, ++slot) {
      const size_t b = std::max(cb, seg->begin), e = std::min(ce, seg->end);
      const float keep = seg->decay ? decay_factor : 1.0f;
      // State element b + k is parameter b + k + shift (unsigned arithmetic: shift may wrap).
      const size_t len = e - b;
      const float* gs = grads + b;
      float* ms = m + b;
      float* vs = v + b;
      float* ps = params + (b + seg->shift);
      double squares = 0;  // of the update
#pragma omp simd reduction(+ : squares)
      for (size_t k = 0; k < len; ++k) {
        const float g = gs[k] * grad_scale;
        ms[k] = beta1 * ms[k] + one_minus_beta1 * g;
        vs[k] = beta2 * vs[k] + one_minus_beta2 * (g * g);
        const float denom = std::sqrt(vs[k]) * inv_bc2_sqrt + eps;
        const float before = ps[k];
        ps[k] = before * keep - step_size * (ms[k] / denom);
        const double d = double(ps[k]) - double(before);
        squares += d * d;
      }
      *slot = squares;
    }
  }
  std::fill(update_sq_.begin(), update_sq_.end(), 0.0);
  for (size_t c = 0; c < chunks; ++c) {
    const Segment* seg = segments + chunk_first_[c];
    for (size_t j = slot_begin_[c]; j < slot_begin_[c + 1]; ++j, ++seg)
      update_sq_[seg->tensor] += slots[j];
  }
}

}  // namespace atl
