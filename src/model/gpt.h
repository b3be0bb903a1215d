// GPT-2: forward and backward written by hand per block (llm.c style) over one flat parameter
// buffer (see model/config.h for its layout).
//
// The model is templated on the real type: GPT<float> trains; GPT<double> is the reference
// path the finite-difference tests use. Activations are allocated once for (max_batch, seq_len).
//
// Determinism: Forward and Backward give bitwise-identical results for any OpenMP thread count
// (kernels partition work in fixed chunks independent of the number of threads, and every
// reduction has a fixed order).
//
// Thread-safety: not thread-safe; one GPT per training process. Kernels use OpenMP inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/config.h"

namespace atl {

template <class T>
class GPT {
 public:
  // Allocates parameters, gradients and activations for batches of up to max_batch sequences of
  // up to cfg.seq_len tokens. Parameters are zero until InitParameters or a load.
  GPT(const GPTConfig& cfg, int max_batch);
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return cfg_; }
  size_t num_params() const { return num_params_; }
  T* params() { return params_.data(); }
  const T* params() const { return params_.data(); }
  T* grads() { return grads_.data(); }
  const T* grads() const { return grads_.data(); }

  // GPT-2 initialization from the counter-based RNG (seed, step 0, RngPurpose::kInit, element
  // index): weights N(0, 0.02); attn.c_proj and mlp.c_proj weights N(0, 0.02/sqrt(2 n_layer));
  // wpe N(0, 0.01); biases 0; LayerNorm weights 1.
  void InitParameters(uint64_t seed);

  // Forward over B sequences of T tokens (B <= max_batch, T <= seq_len). inputs, targets: B*T
  // token ids in [0, vocab). Returns the mean cross-entropy over the B*T positions. With
  // targets == nullptr computes only logits (returns 0).
  T Forward(const int32_t* inputs, const int32_t* targets, int B, int T_len);

  // Backward of the last Forward (which must have had targets): ADDS d(loss_scale * mean loss)
  // / d(params) into grads(), so micro-batches accumulate. Gradient accumulation over k
  // micro-batches uses loss_scale = 1/k.
  void Backward(T loss_scale = T(1));

  void ZeroGrad();

  // Optional hook for overlapping communication with the backward (data parallel buckets):
  // Backward calls hook(l) right after block l's backward, when the gradients of block l's
  // tensors (and, from l = n_layer - 1 on, of ln_f) are final for this Backward; wte and wpe are
  // final only when Backward returns. Unset (the default): never called. The hook must not touch
  // the gradients of blocks below l.
  void set_backward_hook(std::function<void(int layer)> hook) { backward_hook_ = std::move(hook); }

  // Logits of the last Forward: [B, T, vocab_size], row-major.
  const T* logits() const;

  // Optional per-op wall-clock profile, for benchmarks: while enabled, Forward and Backward add
  // the time of each kernel call to its op's entry ("matmul fwd", "classifier bwd", ...). Off by
  // default; when on it costs two clock reads per kernel call.
  struct OpTime {
    const char* op;
    double seconds;
    int64_t calls;
  };
  void set_profiling(bool on);
  std::vector<OpTime> op_times() const;  // in order of first use
  void reset_op_times();

 private:
  struct Activations;
  GPTConfig cfg_;
  int max_batch_;
  size_t num_params_;
  std::vector<T> params_;
  std::vector<T> grads_;
  std::unique_ptr<Activations> acts_;
  int last_B_ = 0, last_T_ = 0;
  bool last_had_targets_ = false;
  std::function<void(int)> backward_hook_;
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace atl
