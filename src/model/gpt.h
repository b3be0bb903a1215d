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
// Sharding (tensor and pipeline parallel): a GPT may hold one ModelShard (model/config.h) of the
// model: a pipeline stage's blocks, and of each block the tensor-parallel rank's heads and MLP
// columns. Its buffers then follow ShardLayout. A stage that is not the first takes its input
// activations instead of token ids and a stage that is not the last gives its output activations
// and takes their gradient in backward (ForwardStage / BackwardStage). With tp_size > 1 the
// model calls the tensor-parallel all-reduce (set_tensor_parallel) twice per block in forward
// (after the row-parallel attn.c_proj and mlp.c_proj, whose bias only tp rank 0 adds) and twice
// in backward (the gradients of the LayerNorm outputs feeding the column-parallel c_attn and
// c_fc); replicated tensors then get identical gradients on every tensor-parallel rank. wte is
// split by vocabulary: the first stage all-reduces the embeddings, the last computes the
// cross-entropy from each rank's share of the logits (one small all-reduce of per-row
// log-sum-exps and target logits) and all-reduces the gradient of ln_f's output.
// A pipeline schedule keeps several micro-batches in flight: each has an activation slot.
//
// Devices: a GPT runs on the CPU (the default) or, built with CUDA, on the process's GPU
// (Device::kCuda: float, any shard). On the GPU the parameters, gradients and activations live in
// GPU memory; what crosses ranks goes through host memory (tensor-parallel all-reduces,
// stage_output() and input_grad(), which are host copies there, and input_acts / output_grad,
// which are read from the host). params() and grads() stay what the rest of atoll reads and
// writes: host copies, kept in step with the GPU's lazily. Each of the two buffers is newer on
// the host, newer on the GPU, or the same on both:
//   - params() and grads() download the GPU's copy first when it is newer; the non-const ones
//     then mark the host's newer (the caller may write), the const ones leave both the same;
//   - Forward uploads the parameters, and Backward the gradients, when the host's are newer;
//   - Backward leaves its gradients newer on the GPU, ZeroGrad zeroes the GPU's alone;
//   - device_params() and device_grads() give the GPU's buffers, current, for the optimizer on
//     the GPU (train/optimizer.h): the non-const device_params() marks the GPU's newer.
// So a step whose optimizer runs on the GPU and that reads nothing on the host moves no
// parameters or gradients (transfers() counts the bytes moved). A pointer from these accessors
// is good until the next call that changes which side is newer. With a backward hook, Backward
// downloads the gradients and then calls it for every block (no overlap yet); the op hook sees
// host copies of its operands (what it changes in *out is uploaded back), or the GPU's buffers
// when it reads them there (set_op_hook's device_reader).
//
// Thread-safety: not thread-safe; one GPT per training process. Kernels use OpenMP inside.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <utility>
#include <vector>

#include "model/backend.h"
#include "model/config.h"

namespace atl {

template <class T>
class GPT {
 public:
  // Allocates parameters, gradients and activations for batches of up to max_batch sequences of
  // up to cfg.seq_len tokens, in `slots` activation slots. Parameters are zero until
  // InitParameters or a load. Throws std::invalid_argument for an invalid config or shard.
  // On Device::kCuda throws std::invalid_argument unless T is float, and std::runtime_error when
  // no GPU is usable.
  GPT(const GPTConfig& cfg, int max_batch, const ModelShard& shard = {}, int slots = 1,
      Device device = Device::kCpu);
  ~GPT();
  GPT(const GPT&) = delete;
  GPT& operator=(const GPT&) = delete;

  const GPTConfig& config() const { return cfg_; }
  const ModelShard& shard() const { return shard_; }
  // This shard's tensors in its buffers (ShardLayout).
  const std::vector<ParamTensor>& layout() const { return layout_; }
  size_t num_params() const { return num_params_; }
  Device device() const { return device_; }
  // Host buffers (see Devices above): current; the non-const accessors mark them newer.
  T* params() {
    HostCurrent(params_, dparams_, params_at_);
    params_at_ = Newer::kHost;
    return params_.data();
  }
  const T* params() const {
    HostCurrent(params_, dparams_, params_at_);
    return params_.data();
  }
  T* grads() {
    HostCurrent(grads_, dgrads_, grads_at_);
    grads_at_ = Newer::kHost;
    return grads_.data();
  }
  const T* grads() const {
    HostCurrent(grads_, dgrads_, grads_at_);
    return grads_.data();
  }
  // The host's gradient buffer as it is, not made current (no copy): for a backward hook
  // (set_backward_hook), which reads it only once Backward has made it current. On the GPU,
  // grads() here would download the gradients and upload them again for the backward.
  T* host_grads_buffer() { return grads_.data(); }
  // The buffers the kernels use (the host's on the CPU), current; device_params() marks the
  // GPU's newer (the optimizer on the GPU writes them).
  T* device_params();
  const T* device_grads();
  // The GPU's gradients for writing (a reduction in GPU memory: NCCL), current; marks them newer.
  T* mutable_device_grads();
  // The parameters where the kernels read them, current, for reading only: on the GPU the GPU's
  // buffer (the host's newer copy uploaded first), then marked newer, so that the host's copy is
  // downloaded again before it is read; the corruption checks hash it there (train/sdc/) and
  // what they checked is what every later reader gets.
  const T* resident_params() const;
  // Bytes moved between the host's buffers and the GPU's for params() and grads() so far (0 on
  // the CPU).
  uint64_t transfers() const { return transfer_bytes_; }

  // GPT-2 initialization from the counter-based RNG (seed, step 0, RngPurpose::kInit, element
  // index): weights N(0, 0.02); attn.c_proj and mlp.c_proj weights N(0, 0.02/sqrt(2 n_layer));
  // wpe N(0, 0.01); biases 0; LayerNorm weights 1. The element index is the whole model's, so a
  // shard gets exactly its part of the whole model's initialization.
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

  // ---- Pipeline stages (Forward / Backward above are slot 0 of a whole-model stage). ----
  // Forward of one micro-batch into activation slot `slot`: the first stage reads token ids
  // `inputs` (input_acts ignored), the others input_acts [B*T, n_embd] (inputs ignored). The last
  // stage returns the mean loss (targets may be null: logits only); the others return 0 and
  // leave their output in stage_output(slot) until the slot's next Forward.
  T ForwardStage(int slot, const int32_t* inputs, const T* input_acts, const int32_t* targets,
                 int B, int T_len);
  const T* stage_output(int slot) const;
  // Backward of slot's last ForwardStage: the last stage from its loss times loss_scale
  // (output_grad ignored), the others from output_grad [B*T, n_embd]. ADDS into grads(). On a
  // stage that is not the first, input_grad() then holds the gradient of input_acts (until the
  // next BackwardStage).
  void BackwardStage(int slot, const T* output_grad, T loss_scale);
  const T* input_grad() const;

  // Tensor parallel: the all-reduce (sum, in place, identical result on every rank) over the
  // tp_size ranks of this shard's tensor-parallel group. Required when tp_size > 1; it may throw
  // (the exception leaves Forward / Backward). all_reduce takes host memory; on the GPU,
  // device_all_reduce (optional: NCCL) takes the GPU's tensors where they are, which otherwise
  // go through host memory.
  void set_tensor_parallel(std::function<void(T* data, size_t n)> all_reduce,
                           std::function<void(T* data, size_t n)> device_all_reduce = nullptr) {
    tp_all_reduce_ = std::move(all_reduce);
    tp_device_all_reduce_ = std::move(device_all_reduce);
  }

  // Optional hook for overlapping communication with the backward (data parallel buckets):
  // Backward calls hook(l) right after block l's backward, when the gradients of block l's
  // tensors (and, from l = n_layer - 1 on, of ln_f) are final for this Backward; wte and wpe are
  // final only when Backward returns. Unset (the default): never called. The hook must not touch
  // the gradients of blocks below l.
  void set_backward_hook(std::function<void(int layer)> hook) { backward_hook_ = std::move(hook); }

  // On the GPU under bf16 products (kernels/cuda/ops.h): the ops that make a product's input
  // (LayerNorm, attention, GELU, and their backwards) also write it in bf16, and the forward's
  // and the backward's products read that copy instead of each rounding the float themselves;
  // and the parameters are kept rounded to bf16 beside the floats, rounded again by the first
  // forward after they change (any write: the optimizer's through device_params(), the host's
  // through params()); a product reads its weight there when the weight's offset is a multiple
  // of 128 elements (every weight of GPT-2 124M and 350M; in general when C / tp is a multiple of
  // 128), else rounds it itself. The same bits either way, a rounding pass fewer per product
  // input and pass, and 2 bytes per element of activation memory and per parameter more. On by
  // default; off, for comparing and measuring. Takes effect at the next forward.
  void set_bf16_copies(bool on) { bf16_copies_ = on; }

  // Optional hook on intermediate results, for fault injection and checks (train/sdc/): called
  // with each block's GEMM products in forward (kGemmForward: out = inp · W (+ b), before any
  // tensor-parallel all-reduce or residual add; gemm 0..3 = attn.c_attn, attn.c_proj, mlp.c_fc,
  // mlp.c_proj), with each input-gradient product in backward (kGemmBackward: out = dinp =
  // dout · Wᵀ, for the same four GEMMs, in backward order 3, 2, 1, 0), and with each block's
  // output, the residual stream (kActivation, gemm -1). The hook may change *out; what it changes
  // flows on as if the kernel had computed it. Unset (the default): never called.
  // A GEMM's event also shows its operands (for checksums, train/sdc/checksum.h): forward,
  // out[rows, cols] = a[rows, inner] · w[inner, cols] + bias[cols] (bias may be null); backward,
  // out[rows, cols] = a[rows, inner] · wᵀ with w[cols, inner] (the layer's weight), no bias.
  // A block output's event shows in `a` the residual stream that mlp.c_proj's product (after
  // its tensor-parallel all-reduce) was added to: out = a + that product.
  enum class OpKind { kGemmForward, kGemmBackward, kActivation };
  struct OpEvent {
    OpKind kind;
    int layer;
    int gemm;
    T* out;
    size_t n;  // elements of out: rows * cols
    int rows, cols;
    const T* a = nullptr;  // GEMMs: the operands (activation events: a, the residual input)
    const T* w = nullptr;
    const T* bias = nullptr;
    int inner = 0;
    bool on_device = false;  // the pointers are GPU memory (see set_op_hook)
  };
  // On the GPU the hook gets host copies of out and the operands, and what it writes to out is
  // uploaded back; unless device_reader: then it gets the GPU's pointers (on_device), reads them
  // only through GPU functions and never writes them, and nothing is copied; a GEMM's `a` is then
  // null where the step kept that operand in bf16 alone (set_bf16_copies): the forward's ln1,
  // ln2 and fch_gelu, and the backward's dfch (fc's, gemm 2).
  void set_op_hook(std::function<void(const OpEvent&)> hook, bool device_reader = false) {
    op_hook_ = std::move(hook);
    op_hook_on_device_ = device_reader;
  }

  // Logits of the last Forward (slot 0, last stage): [B, T, vocab_size], row-major; with
  // tp_size > 1 only this rank's vocabulary share: [B, T, Vl], token ShardVocab().begin first.
  // On the GPU under bf16 products the forward keeps them in bf16: these are those, widened.
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
  struct Slot;
  struct Activations;
  // A tensor's parameters and gradients where the kernels read them (the device's buffers).
  const T* W(ParamKind kind, int layer = -1) const {
    return (cuda() ? dparams_.data() : params_.data()) + Off(kind, layer);
  }
  T* D(ParamKind kind, int layer = -1) {
    return (cuda() ? dgrads_.data() : grads_.data()) + Off(kind, layer);
  }
  bool cuda() const { return device_ == Device::kCuda; }
  // backend.h's HostCurrent and DeviceCurrent for a whole buffer (GPU only; the CPU has one copy,
  // whose flag never says the GPU's is newer), counted in transfers().
  void HostCurrent(std::vector<T>& host, const Buffer<T>& dev, Newer& at) const;
  void DeviceCurrent(const std::vector<T>& host, Buffer<T>& dev, Newer& at);
  // ... and then marked newer there; returns the GPU's buffer.
  T* DeviceNewer(const std::vector<T>& host, Buffer<T>& dev, Newer& at);
  void EmitOp(const OpEvent& e);
  size_t Off(ParamKind kind, int layer) const;
  // data on this device, or on the host (on_host); the Communicator reduces host memory.
  void TensorAllReduce(T* data, size_t n, bool on_host = false);
  // p itself on the CPU (or when null); on the GPU, a host copy of its n elements in `host`.
  const T* HostView(const T* p, size_t n, std::vector<T>& host) const;
  T VocabParallelLoss(Slot& slot, int N, uint16_t* logits_b);

  GPTConfig cfg_;
  ModelShard shard_;
  int max_batch_;
  int layer_begin_, layer_end_;
  int vocab_begin_, vocab_end_;  // wte rows held (ShardVocab)
  std::vector<ParamTensor> layout_;
  std::vector<size_t> offsets_;  // [(local layer + 1) * kKinds + kind]; row 0: wte, wpe, ln_f
  size_t num_params_;
  // The host's buffers; mutable: a const accessor may download the GPU's newer copy into them.
  mutable std::vector<T> params_;
  mutable std::vector<T> grads_;
  Device device_ = Device::kCpu;
  Ops<T> ops_;
  Buffer<T> dparams_, dgrads_;  // the GPU's copies (empty on the CPU)
  mutable Newer params_at_ = Newer::kHost, grads_at_ = Newer::kBoth;
  mutable uint64_t transfer_bytes_ = 0;
  mutable std::vector<T> host_logits_;  // logits() on the GPU
  std::unique_ptr<Activations> acts_;
  std::function<void(int)> backward_hook_;
  std::function<void(const OpEvent&)> op_hook_;
  bool op_hook_on_device_ = false;
  bool bf16_copies_ = true;
  // The parameters rounded to bf16 (set_bf16_copies; the GPU's, at their offsets), and whether
  // they are those of dparams_ now: any write to dparams_ clears it (device_params(), and every
  // upload of the host's: DeviceCurrent), the forward that uses them rounds them again.
  Buffer<uint16_t> dparams_b_;
  mutable bool params_b_current_ = false;
  // The bf16 copy of a tensor's parameters when `use`, current and 256-byte aligned, else null
  // (the product rounds the float into scratch, 256-byte aligned: cuBLASLt's plan, hence the
  // bits, depend on the operands' alignment).
  const uint16_t* Wb(bool use, ParamKind kind, int layer = -1) const {
    const size_t off = Off(kind, layer);
    return use && params_b_current_ && off % 128 == 0 ? dparams_b_.data() + off : nullptr;
  }
  void Op(OpKind kind, int layer, int gemm, T* out, int rows, int cols, const T* a = nullptr,
          const T* w = nullptr, const T* bias = nullptr, int inner = 0) {
    if (op_hook_)
      EmitOp({kind, layer, gemm, out, size_t(rows) * size_t(cols), rows, cols, a, w, bias, inner});
  }
  std::function<void(T*, size_t)> tp_all_reduce_;
  std::function<void(T*, size_t)> tp_device_all_reduce_;  // optional: GPU memory (NCCL)
};

extern template class GPT<float>;
extern template class GPT<double>;

}  // namespace atl
