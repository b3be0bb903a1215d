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
// Sharding (ZeRO-1): an AdamW may own only part of the parameters. Its moments then live in
// "state coordinates": the owned ranges of the local parameter buffer, concatenated in the order
// given (parallel/data_parallel.h's GradientReducer::owned() lists them in that order, and its
// shard_grads() holds the gradients in the same coordinates). Step reads grads in state
// coordinates and updates the owned parameters in place, in local coordinates; the others are not
// touched. Whether an element decays is decided by the layout tensor its LOCAL offset falls in, so
// an owned range may cut tensors anywhere. The unsharded AdamW is the identity mapping (state
// coordinates == local coordinates).
//
// Determinism: every element is updated independently by the same code, and the loop is split
// into fixed chunks of state coordinates whose boundaries do not depend on the thread count, so
// any number of OpenMP threads gives the same bits, and a sharded AdamW gives each element bitwise
// the update the unsharded one gives it. GradSquaredSum sums squares in double over fixed chunks
// and then adds the chunk sums in order: also independent of the thread count.
//
// On the GPU (PlaceOnDevice, the whole local buffer only): the moments live in GPU memory and
// StepOnDevice updates GPU parameters from GPU gradients with the same arithmetic
// (kernels/cuda/ops.h AdamWStep: equal within rounding, as either compiler may fuse a multiply
// and an add). m() and v() stay host copies, kept in step lazily as GPT's params() are: they
// download the GPU's newer moments first; the non-const ones then mark the host's newer, and the
// next StepOnDevice uploads them. update_squares() comes from the GPU too: each parameter's move
// rounded to float, its squares summed in double per segment and the segments in order, so
// within rounding of the CPU's.
//
// Thread-safety: an AdamW is used by one thread at a time (it uses OpenMP inside).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "model/backend.h"
#include "model/config.h"

namespace atl {

// Whether weight decay applies to a tensor: it is 2-D (Linear weights, wte, wpe).
bool DecaysWeight(const ParamTensor& t);

// sum g_i^2, summed in double in fixed chunks (from grads[0]), chunk sums added in order. A
// sharded run sums its shard with this and all-reduces the partial sums.
double GradSquaredSum(const float* grads, size_t n);

// GradSquaredSum of GPU memory, on the GPU (kernels/cuda/ops.h; its own fixed order, so equal
// within rounding). Throws std::runtime_error in an atoll built without CUDA.
double DeviceGradSquaredSum(const float* device_grads, size_t n);

// sqrt(GradSquaredSum(grads, n)), bitwise.
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

  // (local_begin, length): a range of the local parameter buffer that this optimizer owns.
  using OwnedRange = std::pair<size_t, size_t>;

  // Moments start at zero, the update count at 0. `layout` (offsets into the local buffer)
  // decides which elements decay. Owns the whole local buffer, [0, the end of the last tensor):
  // state coordinates are local coordinates.
  AdamW(const std::vector<ParamTensor>& layout, Hyper hyper);

  // Owns only the ranges `owned`, in state order: state element k of owned range j is local
  // element owned[j].first + (k - sum of the earlier lengths). REQUIRES: the ranges do not
  // overlap. Empty ranges are allowed; elements outside every tensor have a state slot but are
  // never updated.
  AdamW(const std::vector<ParamTensor>& layout, Hyper hyper, const std::vector<OwnedRange>& owned);
  AdamW(const AdamW&) = delete;
  AdamW& operator=(const AdamW&) = delete;

  // One update of the owned params (local coordinates) from grads (state coordinates, size()
  // elements; read, not modified) at learning rate lr; grads are multiplied by grad_scale first
  // (the clipping factor).
  void Step(float* params, const float* grads, double lr, float grad_scale);

  // Moves the moments to the process's GPU (see the top). Throws std::logic_error where state and
  // local coordinates differ (a ZeRO shard), std::runtime_error without CUDA or a GPU.
  void PlaceOnDevice();
  bool on_device() const { return device_ != nullptr; }
  // Step on the GPU: params and grads are device pointers (GPT::device_params, device_grads).
  // REQUIRES: on_device().
  void StepOnDevice(float* params, const float* grads, double lr, float grad_scale);
  // Whether StepOnDevice computes update_squares() (what each parameter moved, summed per tensor:
  // a GPU buffer as large as the parameters, another pass over it and a copy to the host per
  // step); off, it leaves them zero. On by default; the CPU's Step always computes them, in its
  // own pass.
  void set_update_squares(bool on) { update_squares_on_ = on; }
  // Bytes of moments moved between the host and the GPU so far (0 on the CPU).
  uint64_t transfers() const { return transfer_bytes_; }

  // What the last Step moved, for the step guard (train/sdc/guard.h): per tensor of the layout,
  // the sum of (p_after - p_before)² over the elements this optimizer owns (0 for a tensor it
  // owns none of), summed in a fixed order (the same bits for any thread count), and how many
  // elements of it it owns. Computed inside the update's own pass: no copy of the parameters.
  const std::vector<double>& update_squares() const { return update_sq_; }
  const std::vector<size_t>& owned_numel() const { return owned_numel_; }

  // The number of owned elements: the length of m, v and of Step's grads.
  size_t size() const { return m_.size(); }
  int64_t step_count() const { return t_; }
  // For checkpoint save and load: the moments (state coordinates) and the count of updates they
  // have seen.
  void set_step_count(int64_t t) { t_ = t; }
  // On the GPU: current host copies (see the top); the non-const ones mark them newer.
  float* m() {
    HostMoment(m_, m_at_);
    m_at_ = Newer::kHost;
    return m_.data();
  }
  float* v() {
    HostMoment(v_, v_at_);
    v_at_ = Newer::kHost;
    return v_.data();
  }
  const float* m() const {
    HostMoment(m_, m_at_);
    return m_.data();
  }
  const float* v() const {
    HostMoment(v_, v_at_);
    return v_.data();
  }
  // The moments where the update reads them, current, for reading only: on the GPU its buffers
  // (the host's newer copies uploaded first), then marked newer (as GPT::resident_params); the
  // corruption checks hash them there (train/sdc/). On the CPU m() and v().
  const float* resident_m() const { return ResidentMoment(m_, m_at_); }
  const float* resident_v() const { return ResidentMoment(v_, v_at_); }

 private:
  // State elements [begin, end) are the local elements [begin + shift, end + shift).
  struct Segment {
    size_t begin, end;
    size_t shift;  // modulo 2^64: local coordinates may be below state coordinates
    bool decay;
    size_t tensor;  // its index in the layout
  };
  // Appends a segment, merged with the last one where both coordinates continue it in the same
  // tensor.
  void AddSegment(size_t begin, size_t end, size_t shift, bool decay, size_t tensor);
  // The update's scalars at the current update count t_ (shared by Step and StepOnDevice).
  struct Scalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2;
    float step_size, inv_bc2_sqrt, eps, decay_factor;
  };
  Scalars ScalarsAt(double lr) const;
  // On the GPU: downloads the GPU's copy of moment m_ or v_ (`host`) when `at` says it is newer
  // (backend.h's HostCurrent). On the CPU the flags never say so.
  void HostMoment(std::vector<float>& host, Newer& at) const;
  // The GPU's copy of moment m_ or v_, current (uploaded when `host` is newer), then marked newer;
  // on the CPU `host` itself.
  const float* ResidentMoment(const std::vector<float>& host, Newer& at) const;
  struct DeviceState;
  struct DeleteDeviceState {
    void operator()(DeviceState* d) const;  // where DeviceState is complete
  };

  Hyper hyper_;
  std::vector<Segment> segments_;     // in state order: the owned elements that lie in a tensor
  mutable std::vector<float> m_, v_;  // mutable: a const m() may download the GPU's
  int64_t t_ = 0;
  std::unique_ptr<DeviceState, DeleteDeviceState> device_;   // null on the CPU
  mutable Newer m_at_ = Newer::kBoth, v_at_ = Newer::kBoth;  // which copy of each is newer
  mutable uint64_t transfer_bytes_ = 0;
  bool update_squares_on_ = true;
  // The update's squares: chunk c's pieces of segments (in order from chunk_first_[c]) have the
  // slots slot_begin_[c] ... slot_begin_[c + 1] - 1.
  std::vector<size_t> chunk_first_, slot_begin_;
  std::vector<double> slots_, update_sq_;
  std::vector<size_t> owned_numel_;
};

}  // namespace atl
