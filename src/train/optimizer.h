// AdamW with decoupled weight decay, and global-norm gradient clipping, over the flat buffers.
//
// The update per element (Loshchilov & Hutter; the arithmetic of PyTorch's torch.optim.AdamW):
//   g  = grad * clip_scale
//   p  = p * (1 - lr * wd)                   only for tensors that decay (below)
//   m  = b1 * m + (1 - b1) * g
//   v  = b2 * v + (1 - b2) * g * g
//   p  = p - (lr / (1 - b1^t)) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)
// with t the 1-based update count. Scalars are computed in double and rounded to float once; the
// element loop runs in float.
//
// Weight decay applies to the 2-D tensors: every Linear (Conv1D) weight and, as in GPT-2 and
// nanoGPT (which decay every parameter with dim >= 2), the token and position embeddings
// (wte is also the tied LM head). Biases and LayerNorm gains/biases never decay.
//
// Determinism: every element is updated independently by the same code, and the loop is split
// into fixed chunks whose boundaries do not depend on the thread count, so any number of OpenMP
// threads gives the same bits. GradNorm sums squares in double over fixed chunks and then adds
// the chunk sums in order: also independent of the thread count.
//
// Thread-safety: an AdamW is used by one thread at a time (it uses OpenMP inside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/config.h"

namespace atl {

// Whether weight decay applies to a tensor: it is 2-D (Linear weights, wte, wpe).
bool DecaysWeight(const ParamTensor& t);

// sqrt(sum g_i^2), summed in double in fixed chunks, chunk sums added in order.
double GradNorm(const float* grads, size_t n);

// The factor that brings a gradient of norm `norm` to norm at most `max_norm` (torch's
// clip_grad_norm_: max_norm / (norm + 1e-6), capped at 1). max_norm <= 0 disables: 1.
float ClipScale(double norm, double max_norm);

class AdamW {
 public:
  struct Hyper {
    double beta1 = 0.9;
    double beta2 = 0.95;
    double eps = 1e-8;
    double weight_decay = 0.1;
  };

  // Moments start at zero, the update count at 0. `layout` decides which ranges decay.
  AdamW(const std::vector<ParamTensor>& layout, Hyper hyper);

  // One update of params from grads (read, not modified) at learning rate lr; grads are
  // multiplied by grad_scale first (the clipping factor).
  void Step(float* params, const float* grads, double lr, float grad_scale);

  size_t size() const { return m_.size(); }
  int64_t step_count() const { return t_; }
  // For checkpoint load: the moments and the count of updates they have seen.
  void set_step_count(int64_t t) { t_ = t; }
  float* m() { return m_.data(); }
  float* v() { return v_.data(); }
  const float* m() const { return m_.data(); }
  const float* v() const { return v_.data(); }

 private:
  struct Range {
    size_t begin, end;
    bool decay;
  };
  Hyper hyper_;
  std::vector<Range> ranges_;  // the tensors, merged where neighbours agree on decay
  std::vector<float> m_, v_;
  int64_t t_ = 0;
};

}  // namespace atl
