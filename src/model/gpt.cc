// GPT-2 forward and backward over the kernels of kernels/ops.h (see gpt.h).
#include "model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/rng.h"
#include "kernels/ops.h"
#include "model/gpt_activations.h"

namespace atl {

namespace k = kernels;
// The backwards write the activation gradients they make over buffers they alone fill (no
// zeroing pass, no read of zeros on the GPU; kernels/grad_into.h).
constexpr kernels::GradInto kWrite = kernels::GradInto::kWrite;

namespace {

// Runs f; when profiling, adds its wall time to times' entry for op (entries in first-use order).
template <class Times, class F>
void Timed(bool profiling, Times& times, const char* op, F&& f) {
  if (!profiling) {
    f();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& e : times) {
    if (std::strcmp(e.op, op) == 0) {
      e.seconds += dt;
      ++e.calls;
      return;
    }
  }
  times.push_back({op, dt, 1});
}

}  // namespace

// One kernel call, timed under `op` when profiling is on (on the GPU, waiting for it to finish).
#define ATL_OP(op, ...)                 \
  Timed(a.profiling, a.times, op, [&] { \
    __VA_ARGS__;                        \
    if (a.profiling) ops_.Sync();       \
  })

namespace {
constexpr size_t kKinds = size_t(ParamKind::kLnfB) + 1;
constexpr size_t kAbsent = ~size_t{0};

// GPT-2's initialization of the whole model's flat buffer (see GPT::InitParameters).
template <class T>
void InitWholeModel(const GPTConfig& cfg, uint64_t seed, T* params) {
  const double proj_std = 0.02 / std::sqrt(2.0 * cfg.n_layer);
  for (const ParamTensor& t : ParameterLayout(cfg)) {
    double std_dev = 0;  // 0: constant
    T constant = T(0);
    switch (t.kind) {
      case ParamKind::kWte:
      case ParamKind::kAttnW:
      case ParamKind::kFcW:
        std_dev = 0.02;
        break;
      case ParamKind::kAttnProjW:
      case ParamKind::kFcProjW:
        std_dev = proj_std;
        break;
      case ParamKind::kWpe:
        std_dev = 0.01;
        break;
      case ParamKind::kLn1W:
      case ParamKind::kLn2W:
      case ParamKind::kLnfW:
        constant = T(1);
        break;
      default:
        break;  // biases
    }
    T* p = params + t.offset;
    const int64_t n = int64_t(t.numel);
    if (std_dev == 0) {
      std::fill(p, p + n, constant);
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t index = t.offset + uint64_t(i);
      p[i] = T(std_dev * double(RandomNormal(seed, 0, RngPurpose::kInit, index)));
    }
  }
}
}  // namespace

template <class T>
GPT<T>::GPT(const GPTConfig& cfg, int max_batch, const ModelShard& shard, int slots, Device device)
    : cfg_(cfg), shard_(shard), max_batch_(max_batch), device_(device) {
  const std::string err = ValidateConfig(cfg);
  if (!err.empty()) throw std::invalid_argument("GPT: " + err);
  const std::string shard_err = ValidateShard(cfg, shard);
  if (!shard_err.empty()) throw std::invalid_argument("GPT: " + shard_err);
  if (max_batch <= 0)
    throw std::invalid_argument(fmt::format("GPT: max_batch must be positive, got {}", max_batch));
  if (slots <= 0)
    throw std::invalid_argument(fmt::format("GPT: slots must be positive, got {}", slots));
  if (cuda()) {
    if (!std::is_same_v<T, float>) throw std::invalid_argument("GPT: the GPU runs float models");
    if (cfg.n_embd / cfg.n_head > 128)
      throw std::invalid_argument(fmt::format(
          "GPT: the GPU's attention takes head sizes up to 128, got {}", cfg.n_embd / cfg.n_head));
    std::string why;
    if (!DeviceUsable(device, &why)) throw std::runtime_error("GPT: no GPU: " + why);
    ops_.cuda = true;
  }
  layer_begin_ = shard.layer_begin;
  layer_end_ = shard.end(cfg);
  layout_ = ShardLayout(cfg, shard);
  num_params_ = layout_.empty() ? 0 : layout_.back().offset + layout_.back().numel;
  offsets_.assign(size_t(layer_end_ - layer_begin_ + 1) * kKinds, kAbsent);
  for (const ParamTensor& t : layout_)
    offsets_[size_t(t.layer < 0 ? 0 : t.layer - layer_begin_ + 1) * kKinds + size_t(t.kind)] =
        t.offset;
  k::InitBackend();
  params_.assign(num_params_, T(0));
  grads_.assign(num_params_, T(0));
  if (cuda()) {
    dparams_.Allocate(device, num_params_);
    dgrads_.Allocate(device, num_params_);
  }
  const VocabRange vocab = ShardVocab(cfg, shard);
  vocab_begin_ = vocab.begin;
  vocab_end_ = vocab.end;
  acts_ =
      std::make_unique<Activations>(cfg, max_batch, layer_end_ - layer_begin_, shard.tp_size,
                                    shard.last_stage(cfg), slots, vocab.end - vocab.begin, device);
}

template <class T>
GPT<T>::~GPT() = default;

template <class T>
size_t GPT<T>::Off(ParamKind kind, int layer) const {
  const bool global = kind == ParamKind::kWte || kind == ParamKind::kWpe ||
                      kind == ParamKind::kLnfW || kind == ParamKind::kLnfB;
  const size_t off =
      offsets_[size_t(global ? 0 : layer - layer_begin_ + 1) * kKinds + size_t(kind)];
  if (off == kAbsent) throw std::logic_error("GPT: a tensor this shard does not hold was used");
  return off;
}

template <class T>
void GPT<T>::InitParameters(uint64_t seed) {
  params_at_ = Newer::kHost;  // every element is written below
  if (shard_.whole(cfg_)) {
    InitWholeModel(cfg_, seed, params_.data());
    return;
  }
  std::vector<T> whole(NumParameters(cfg_));
  InitWholeModel(cfg_, seed, whole.data());
  CopyShard(cfg_, shard_, whole.data(), params_.data(), /*to_shard=*/true);
}

template <class T>
void GPT<T>::TensorAllReduce(T* data, size_t n, bool on_host) {
  if (shard_.tp_size == 1) return;
  if (!tp_all_reduce_)
    throw std::logic_error("GPT: tensor parallel shard without set_tensor_parallel");
  if (!cuda() || on_host) return tp_all_reduce_(data, n);
  if (tp_device_all_reduce_) return tp_device_all_reduce_(data, n);
  // The GPU's tensor through host memory: the Communicator reduces host buffers.
  std::vector<T>& host = acts_->staging[0];
  HostView(data, n, host);
  tp_all_reduce_(host.data(), n);
  CopyIn(device_, data, host.data(), n);
}

template <class T>
T GPT<T>::Forward(const int32_t* inputs, const int32_t* targets, int B, int T_len) {
  if (!shard_.first_stage() || !shard_.last_stage(cfg_))
    throw std::logic_error("GPT::Forward: a pipeline stage needs ForwardStage");
  return ForwardStage(0, inputs, nullptr, targets, B, T_len);
}

template <class T>
void GPT<T>::Backward(T loss_scale) {
  BackwardStage(0, nullptr, loss_scale);
}

template <class T>
T GPT<T>::ForwardStage(int slot, const int32_t* inputs, const T* input_acts, const int32_t* targets,
                       int B, int T_len) {
  if (B <= 0 || B > max_batch_ || T_len <= 0 || T_len > cfg_.seq_len) {
    throw std::invalid_argument(
        fmt::format("GPT::Forward: batch {}x{} outside the allocated (max_batch {}, seq_len {})", B,
                    T_len, max_batch_, cfg_.seq_len));
  }
  Activations& a = *acts_;
  if (slot < 0 || slot >= int(a.slots.size()))
    throw std::invalid_argument(fmt::format("GPT::Forward: slot {} of {}", slot, a.slots.size()));
  if (cuda()) DeviceCurrent(params_, dparams_, params_at_);
  const bool first = shard_.first_stage(), last = shard_.last_stage(cfg_);
  const int C = cfg_.n_embd, V = cfg_.vocab_size;
  const int tp = shard_.tp_size, Cl = C / tp, Fl = 4 * C / tp, NHl = cfg_.n_head / tp;
  const int N = B * T_len;
  Slot& S = a.slots[size_t(slot)];
  if (first) {
    for (int i = 0; i < N; ++i)
      if (inputs[i] < 0 || inputs[i] >= V)
        throw std::invalid_argument(fmt::format(
            "GPT::Forward: input token at position {} out of range [0, {}): {}", i, V, inputs[i]));
    std::copy(inputs, inputs + N, S.host_inputs.begin());
    CopyIn(device_, S.inputs.data(), inputs, size_t(N));
  }
  if (last && targets != nullptr) {
    for (int i = 0; i < N; ++i)
      if (targets[i] < 0 || targets[i] >= V)
        throw std::invalid_argument(
            fmt::format("GPT::Forward: target token at position {} out of range [0, {}): {}", i, V,
                        targets[i]));
    std::copy(targets, targets + N, S.host_targets.begin());
    CopyIn(device_, S.targets.data(), targets, size_t(N));
  }

  const size_t NC = size_t(N) * C, NR = a.rows;  // layer strides use the allocated rows
  // Row-parallel outputs are partial sums: only tensor-parallel rank 0 adds the bias.
  const bool add_row_bias = shard_.tp_rank == 0;
  if (first && tp == 1) {
    ATL_OP("encoder fwd", ops_.EncoderForward(S.encoded.data(), S.inputs.data(), W(ParamKind::kWte),
                                              W(ParamKind::kWpe), B, T_len, C, 0, -1));
  } else if (first) {
    // Vocabulary-parallel embedding: each rank its rows (tp rank 0 adds wpe), summed over tp.
    ATL_OP("encoder fwd", ops_.EncoderForward(S.encoded.data(), S.inputs.data(), W(ParamKind::kWte),
                                              add_row_bias ? W(ParamKind::kWpe) : nullptr, B, T_len,
                                              C, vocab_begin_, vocab_end_));
    ATL_OP("tp all-reduce", TensorAllReduce(S.encoded.data(), NC));
  } else {
    CopyIn(device_, S.encoded.data(), input_acts, NC);
  }
  const T* residual = S.encoded.data();
  // bf16 copies of the products' inputs and of the parameters (set_bf16_copies).
  const bool copies = bf16_copies_ && S.UseBf16Copies(device_);
  S.copies_written = copies;
  // With the copies, the outputs that only products read (ln1, ln2, fch_gelu, lnf) are written
  // in bf16 alone (F: no float), unless an op hook reads host copies of the floats (a device
  // reader gets a null operand for them).
  const bool bf16_only = copies && (!op_hook_ || op_hook_on_device_);
  S.bf16_only = bf16_only;
  auto F = [bf16_only](T* p) { return bf16_only ? nullptr : p; };
  if (copies && !params_b_current_) {
    if (dparams_b_.size() == 0) dparams_b_.Allocate(device_, num_params_);
    ATL_OP("bf16 weights", ops_.RoundToBf16(dparams_b_.data(), dparams_.data(), num_params_));
    params_b_current_ = true;
  }
  // The residual add that ends a block (residual3 = residual2 + mlp) is left to the LayerNorm that
  // reads the sum, the next block's ln_1 or ln_f: one kernel reads the two addends, writes the sum
  // and normalizes it (ResidualLayerNormForward). block_end: the block whose add is pending. Not
  // under an op hook that may change the block's output (all but a device reader): what it
  // changes must reach that LayerNorm.
  const bool defer_adds = !op_hook_ || op_hook_on_device_;
  int block_end = -1;
  auto res3_of = [&](int l) { return S.residual3.data() + size_t(l - layer_begin_) * NR * C; };
  auto res2_of = [&](int l) { return S.residual2.data() + size_t(l - layer_begin_) * NR * C; };
  auto end_block = [&] {  // the pending add done: the block's activation event
    Op(OpKind::kActivation, block_end, -1, res3_of(block_end), N, C,
       res2_of(block_end));  // a: what mlp.c_proj was added to
    block_end = -1;
  };
  auto add_alone = [&] {  // the pending add, when no LayerNorm reads the sum first
    if (block_end < 0) return;
    T* res3 = res3_of(block_end);
    ATL_OP("residual fwd", ops_.ResidualForward(res3, res2_of(block_end), res3, NC));
    end_block();
  };
  // ln = LayerNorm(residual), after the pending add (residual is then that block's residual3).
  auto layer_norm = [&](T* out, T* mean, T* rstd, const T* w, const T* b, uint16_t* out_b) {
    if (block_end < 0) {
      ATL_OP("layernorm fwd", ops_.LayerNormForward(out, mean, rstd, residual, w, b, N, C, out_b));
      return;
    }
    T* res3 = res3_of(block_end);
    ATL_OP("residual+layernorm fwd",
           ops_.ResidualLayerNormForward(res3, res2_of(block_end), res3, out, mean, rstd, w, b, N,
                                         C, out_b));
    end_block();
  };
  for (int l = layer_begin_; l < layer_end_; ++l) {
    const size_t i = size_t(l - layer_begin_);
    uint16_t* ln1_b = Slot::At(S.ln1_b, copies, i, S.copy_c);
    uint16_t* atty_b = Slot::At(S.atty_b, copies, i, S.copy_cl);
    uint16_t* ln2_b = Slot::At(S.ln2_b, copies, i, S.copy_c);
    uint16_t* gelu_b = Slot::At(S.gelu_b, copies, i, S.copy_fl);
    uint16_t* kept_b = Slot::At(S.kept_b, copies && S.copy_kept != 0, i, S.copy_kept);
    T* ln1 = S.ln1.data() + i * NR * C;
    T* ln1_mean = S.ln1_mean.data() + i * NR;
    T* ln1_rstd = S.ln1_rstd.data() + i * NR;
    T* qkv = S.qkv.data() + i * NR * 3 * Cl;
    T* atty = S.atty.data() + i * NR * Cl;
    T* att = S.att.data() + i * S.att_per_layer;
    T* res2 = S.residual2.data() + i * NR * C;
    T* ln2 = S.ln2.data() + i * NR * C;
    T* ln2_mean = S.ln2_mean.data() + i * NR;
    T* ln2_rstd = S.ln2_rstd.data() + i * NR;
    T* fch = S.fch.data() + i * NR * Fl;
    T* fch_gelu = S.fch_gelu.data() + i * NR * Fl;
    T* res3 = S.residual3.data() + i * NR * C;

    layer_norm(F(ln1), ln1_mean, ln1_rstd, W(ParamKind::kLn1W, l), W(ParamKind::kLn1B, l), ln1_b);
    ATL_OP("matmul fwd",
           ops_.MatmulForward(qkv, ln1, W(ParamKind::kAttnW, l), W(ParamKind::kAttnB, l), N, C,
                              3 * Cl, ln1_b, Wb(copies, ParamKind::kAttnW, l)));
    Op(OpKind::kGemmForward, l, 0, qkv, N, 3 * Cl, F(ln1), W(ParamKind::kAttnW, l),
       W(ParamKind::kAttnB, l), C);
    ATL_OP("attention fwd",
           ops_.AttentionForward(atty, att, qkv, B, T_len, Cl, NHl, atty_b, kept_b));
    // residual2 = residual + atty · W_proj + b_proj (the projection lands in residual2 first).
    ATL_OP("matmul fwd", ops_.MatmulForward(res2, atty, W(ParamKind::kAttnProjW, l),
                                            add_row_bias ? W(ParamKind::kAttnProjB, l) : nullptr, N,
                                            Cl, C, atty_b, Wb(copies, ParamKind::kAttnProjW, l)));
    Op(OpKind::kGemmForward, l, 1, res2, N, C, atty, W(ParamKind::kAttnProjW, l),
       add_row_bias ? W(ParamKind::kAttnProjB, l) : nullptr, Cl);
    ATL_OP("tp all-reduce", TensorAllReduce(res2, NC));
    ATL_OP(
        "residual+layernorm fwd",
        ops_.ResidualLayerNormForward(res2, residual, res2, F(ln2), ln2_mean, ln2_rstd,
                                      W(ParamKind::kLn2W, l), W(ParamKind::kLn2B, l), N, C, ln2_b));
    ATL_OP("matmul fwd", ops_.MatmulForward(fch, ln2, W(ParamKind::kFcW, l), W(ParamKind::kFcB, l),
                                            N, C, Fl, ln2_b, Wb(copies, ParamKind::kFcW, l)));
    Op(OpKind::kGemmForward, l, 2, fch, N, Fl, F(ln2), W(ParamKind::kFcW, l), W(ParamKind::kFcB, l),
       C);
    ATL_OP("gelu fwd", ops_.GeluForward(F(fch_gelu), fch, size_t(N) * Fl, gelu_b));
    ATL_OP("matmul fwd", ops_.MatmulForward(res3, fch_gelu, W(ParamKind::kFcProjW, l),
                                            add_row_bias ? W(ParamKind::kFcProjB, l) : nullptr, N,
                                            Fl, C, gelu_b, Wb(copies, ParamKind::kFcProjW, l)));
    Op(OpKind::kGemmForward, l, 3, res3, N, C, F(fch_gelu), W(ParamKind::kFcProjW, l),
       add_row_bias ? W(ParamKind::kFcProjB, l) : nullptr, Fl);
    ATL_OP("tp all-reduce", TensorAllReduce(res3, NC));
    residual = res3;
    block_end = l;  // res3 += res2: by the next LayerNorm
    if (!defer_adds) add_alone();
  }
  if (!last) add_alone();  // the stage's output: no LayerNorm of the stage reads it
  S.B = B;
  S.T_len = T_len;
  S.had_targets = last && targets != nullptr;
  if (!last) return T(0);
  layer_norm(F(S.lnf.data()), S.lnf_mean.data(), S.lnf_rstd.data(), W(ParamKind::kLnfW),
             W(ParamKind::kLnfB), Slot::At(S.lnf_b, copies, 0, 0));
  uint16_t* logits_b = S.UseLogits(device_);
  if (tp > 1) return targets != nullptr ? VocabParallelLoss(S, N, logits_b) : T(0);
  T loss = 0;
  ATL_OP("classifier fwd",
         loss = ops_.ClassifierForward(
             S.logits.data(), S.lse.data(), S.losses.data(), a.classifier_scratch.data(),
             S.lnf.data(), W(ParamKind::kWte), targets != nullptr ? S.targets.data() : nullptr, N,
             C, V, Slot::At(S.lnf_b, copies, 0, 0), Wb(copies, ParamKind::kWte), logits_b));
  return loss;
}

// Vocabulary-parallel cross-entropy (Megatron): this rank's logits [N, Vl] and their log-sum-exp,
// every rank's lse and the target logit (from the rank holding the target) exchanged in one
// all-reduce, then lse = log sum_r exp(lse_r), combined in rank order on every rank.
template <class T>
T GPT<T>::VocabParallelLoss(Slot& S, int N, uint16_t* logits_b) {
  Activations& a = *acts_;
  const int C = cfg_.n_embd, Vl = vocab_end_ - vocab_begin_, tp = shard_.tp_size;
  // Targets outside the share point at row 0 here: their losses are discarded, only lse is used.
  for (int n = 0; n < N; ++n) {
    const int t = S.host_targets[size_t(n)];
    a.host_vocab_targets[size_t(n)] = t >= vocab_begin_ && t < vocab_end_ ? t - vocab_begin_ : 0;
  }
  CopyIn(device_, a.vocab_targets.data(), a.host_vocab_targets.data(), size_t(N));
  ATL_OP("classifier fwd", ops_.ClassifierForward(S.logits.data(), S.lse.data(), S.losses.data(),
                                                  a.classifier_scratch.data(), S.lnf.data(),
                                                  W(ParamKind::kWte), a.vocab_targets.data(), N, C,
                                                  Vl, Slot::At(S.lnf_b, S.copies_written, 0, 0),
                                                  Wb(S.copies_written, ParamKind::kWte), logits_b));
  T* stats = a.vocab_stats.data();
  std::fill(stats, stats + size_t(tp + 1) * N, T(0));
  // On the GPU: lse and the losses come to the host, and a target's logit is lse - loss (its
  // row's loss against the target), not read from the logits on the device.
  const T* lse = HostView(S.lse.data(), size_t(N), a.staging[0]);
  const T* share_loss = cuda() ? HostView(S.losses.data(), size_t(N), a.staging[1]) : nullptr;
  for (int n = 0; n < N; ++n) {
    stats[size_t(shard_.tp_rank) * N + n] = lse[n];
    const int t = S.host_targets[size_t(n)];
    if (t >= vocab_begin_ && t < vocab_end_)
      stats[size_t(tp) * N + n] =
          cuda() ? lse[n] - share_loss[n] : S.logits[size_t(n) * Vl + size_t(t - vocab_begin_)];
  }
  ATL_OP("tp all-reduce", TensorAllReduce(stats, size_t(tp + 1) * N, /*on_host=*/true));
  double sum = 0;  // in row order
  for (int n = 0; n < N; ++n) {
    T mx = stats[n];
    for (int r = 1; r < tp; ++r) mx = std::max(mx, stats[size_t(r) * N + n]);
    T e = 0;
    for (int r = 0; r < tp; ++r) e += std::exp(stats[size_t(r) * N + n] - mx);
    const T row_lse = mx + std::log(e), loss = row_lse - stats[size_t(tp) * N + n];
    stats[n] = row_lse;  // row 0 of stats is spent: it now holds the lse, row 1 the losses
    stats[size_t(N) + n] = loss;
    sum += double(loss);
  }
  CopyIn(device_, S.lse.data(), stats, size_t(N));
  CopyIn(device_, S.losses.data(), stats + N, size_t(N));
  return T(sum / N);
}

template <class T>
void GPT<T>::BackwardStage(int slot, const T* output_grad, T loss_scale) {
  Activations& a = *acts_;
  if (slot < 0 || slot >= int(a.slots.size()))
    throw std::invalid_argument(fmt::format("GPT::Backward: slot {} of {}", slot, a.slots.size()));
  Slot& S = a.slots[size_t(slot)];
  a.last_backward_slot = slot;
  const bool first = shard_.first_stage(), last = shard_.last_stage(cfg_);
  if (last && !S.had_targets) {
    throw std::logic_error("GPT::Backward: the last Forward had no targets (or there was none)");
  }
  if (cuda()) DeviceCurrent(grads_, dgrads_, grads_at_);
  const int B = S.B, T_len = S.T_len;
  const int C = cfg_.n_embd;
  const int tp = shard_.tp_size, Cl = C / tp, Fl = 4 * C / tp, NHl = cfg_.n_head / tp;
  const int N = B * T_len;
  const size_t NC = size_t(N) * C, NR = a.rows;
  const int Ll = layer_end_ - layer_begin_;

  T* dres = a.dresidual.data();
  // bf16 copies (set_bf16_copies): the forward's of the products' inputs, and dres's, dfch's and
  // dqkv's, written by the LayerNorm, GELU and attention backwards for the products below them.
  // dres_b holds dres after a LayerNorm backward wrote it (not after output_grad arrives).
  const bool copies = S.copies_written;
  // The forward wrote some outputs in bf16 alone: only bf16 products may read them.
  if ((S.bf16_only || S.logits_in_bf16) && !Bf16Matmul())
    throw std::logic_error("GPT::Backward: bf16 products were switched off after the forward");
  if (copies) a.AllocateBf16GradCopies(device_);
  uint16_t* dres_b = copies ? a.dresidual_b.data() : nullptr;
  uint16_t* dfch_b = copies ? a.dfch_b.data() : nullptr;
  uint16_t* dqkv_b = copies ? a.dqkv_b.data() : nullptr;
  bool dres_copied = false;
  if (last) {
    // Loss = loss_scale * mean over N positions.
    const T dloss = loss_scale / T(N);
    const int32_t* targets = S.targets.data();
    if (tp > 1) {  // this rank's share of the softmax; targets elsewhere are out of its range
      for (int n = 0; n < N; ++n) {
        const int t = S.host_targets[size_t(n)];
        a.host_vocab_targets[size_t(n)] =
            t >= vocab_begin_ && t < vocab_end_ ? t - vocab_begin_ : -1;
      }
      CopyIn(device_, a.vocab_targets.data(), a.host_vocab_targets.data(), size_t(N));
      targets = a.vocab_targets.data();
    }
    ATL_OP("classifier bwd",
           ops_.ClassifierBackward(a.dln.data(), D(ParamKind::kWte), a.classifier_scratch.data(),
                                   S.logits.data(), S.lse.data(), S.lnf.data(), W(ParamKind::kWte),
                                   targets, dloss, N, C, vocab_end_ - vocab_begin_,
                                   Slot::At(S.lnf_b, copies, 0, 0), Wb(copies, ParamKind::kWte),
                                   kWrite, S.logits_in_bf16 ? S.logits_b.data() : nullptr));
    ATL_OP("tp all-reduce", TensorAllReduce(a.dln.data(), NC));
    const T* last_residual = S.residual3.data() + size_t(Ll - 1) * NR * C;
    ATL_OP("layernorm bwd",
           ops_.LayerNormBackward(dres, D(ParamKind::kLnfW), D(ParamKind::kLnfB), a.dln.data(),
                                  last_residual, W(ParamKind::kLnfW), S.lnf_mean.data(),
                                  S.lnf_rstd.data(), N, C, dres_b, kWrite));
    dres_copied = copies;
  } else {
    CopyIn(device_, dres, output_grad, NC);
  }
  for (int l = layer_end_ - 1; l >= layer_begin_; --l) {
    const size_t i = size_t(l - layer_begin_);
    const T* residual = i == 0 ? S.encoded.data() : S.residual3.data() + (i - 1) * NR * C;
    const T* ln1 = S.ln1.data() + i * NR * C;
    const T* ln1_mean = S.ln1_mean.data() + i * NR;
    const T* ln1_rstd = S.ln1_rstd.data() + i * NR;
    const T* qkv = S.qkv.data() + i * NR * 3 * Cl;
    const T* atty = S.atty.data() + i * NR * Cl;
    const T* att = S.att.data() + i * S.att_per_layer;
    const T* res2 = S.residual2.data() + i * NR * C;
    const T* ln2 = S.ln2.data() + i * NR * C;
    const T* ln2_mean = S.ln2_mean.data() + i * NR;
    const T* ln2_rstd = S.ln2_rstd.data() + i * NR;
    const T* fch = S.fch.data() + i * NR * Fl;
    const T* fch_gelu = S.fch_gelu.data() + i * NR * Fl;
    const uint16_t* ln1_b = Slot::At(S.ln1_b, copies, i, S.copy_c);
    const uint16_t* atty_b = Slot::At(S.atty_b, copies, i, S.copy_cl);
    const uint16_t* ln2_b = Slot::At(S.ln2_b, copies, i, S.copy_c);
    const uint16_t* gelu_b = Slot::At(S.gelu_b, copies, i, S.copy_fl);
    const uint16_t* kept_b = Slot::At(S.kept_b, copies && S.copy_kept != 0, i, S.copy_kept);

    // residual3 = residual2 + mlp(ln2(residual2)): dres flows to residual2 unchanged, and into
    // the MLP as the gradient of its output.
    ATL_OP("matmul bwd",
           ops_.MatmulBackward(a.dfch_gelu.data(), D(ParamKind::kFcProjW, l),
                               D(ParamKind::kFcProjB, l), dres, fch_gelu, W(ParamKind::kFcProjW, l),
                               N, Fl, C, gelu_b, dres_copied ? dres_b : nullptr,
                               Wb(copies, ParamKind::kFcProjW, l), kWrite));
    Op(OpKind::kGemmBackward, l, 3, a.dfch_gelu.data(), N, Fl, dres, W(ParamKind::kFcProjW, l),
       nullptr, C);
    // On the GPU, GELU's backward also adds fc's bias gradient (dfch's column sums, in the order
    // MatmulBackward sums them), so that with outputs in bf16 alone dfch is only its copy.
    T* fc_dbias = cuda() ? D(ParamKind::kFcB, l) : nullptr;
    T* dfch = S.bf16_only ? nullptr : a.dfch.data();
    ATL_OP("gelu bwd", ops_.GeluBackward(dfch, fch, a.dfch_gelu.data(), size_t(N) * Fl, dfch_b,
                                         kWrite, fc_dbias, Fl));
    ATL_OP("matmul bwd", ops_.MatmulBackward(a.dln.data(), D(ParamKind::kFcW, l),
                                             fc_dbias != nullptr ? nullptr : D(ParamKind::kFcB, l),
                                             dfch, ln2, W(ParamKind::kFcW, l), N, C, Fl, ln2_b,
                                             dfch_b, Wb(copies, ParamKind::kFcW, l), kWrite));
    Op(OpKind::kGemmBackward, l, 2, a.dln.data(), N, C, dfch, W(ParamKind::kFcW, l), nullptr, Fl);
    ATL_OP("tp all-reduce", TensorAllReduce(a.dln.data(), NC));
    ATL_OP("layernorm bwd", ops_.LayerNormBackward(
                                dres, D(ParamKind::kLn2W, l), D(ParamKind::kLn2B, l), a.dln.data(),
                                res2, W(ParamKind::kLn2W, l), ln2_mean, ln2_rstd, N, C, dres_b));
    dres_copied = copies;
    // residual2 = residual + attn(ln1(residual)), likewise.
    ATL_OP("matmul bwd",
           ops_.MatmulBackward(a.datty.data(), D(ParamKind::kAttnProjW, l),
                               D(ParamKind::kAttnProjB, l), dres, atty, W(ParamKind::kAttnProjW, l),
                               N, Cl, C, atty_b, dres_copied ? dres_b : nullptr,
                               Wb(copies, ParamKind::kAttnProjW, l), kWrite));
    Op(OpKind::kGemmBackward, l, 1, a.datty.data(), N, Cl, dres, W(ParamKind::kAttnProjW, l),
       nullptr, C);
    ATL_OP("attention bwd",
           ops_.AttentionBackward(a.dqkv.data(), a.datt_scratch.data(), a.datty.data(), atty, qkv,
                                  att, B, T_len, Cl, NHl, dqkv_b, kWrite, kept_b));
    ATL_OP("matmul bwd",
           ops_.MatmulBackward(a.dln1.data(), D(ParamKind::kAttnW, l), D(ParamKind::kAttnB, l),
                               a.dqkv.data(), ln1, W(ParamKind::kAttnW, l), N, C, 3 * Cl, ln1_b,
                               dqkv_b, Wb(copies, ParamKind::kAttnW, l), kWrite));
    Op(OpKind::kGemmBackward, l, 0, a.dln1.data(), N, C, a.dqkv.data(), W(ParamKind::kAttnW, l),
       nullptr, 3 * Cl);
    ATL_OP("tp all-reduce", TensorAllReduce(a.dln1.data(), NC));
    ATL_OP(
        "layernorm bwd",
        ops_.LayerNormBackward(dres, D(ParamKind::kLn1W, l), D(ParamKind::kLn1B, l), a.dln1.data(),
                               residual, W(ParamKind::kLn1W, l), ln1_mean, ln1_rstd, N, C, dres_b));
    if (backward_hook_ && !cuda()) backward_hook_(l);
  }
  if (first)
    ATL_OP("encoder bwd", ops_.EncoderBackward(D(ParamKind::kWte), D(ParamKind::kWpe), dres,
                                               S.inputs.data(), S.host_inputs.data(), B, T_len, C,
                                               vocab_begin_, tp > 1 ? vocab_end_ : -1));
  if (cuda()) {
    grads_at_ = Newer::kDevice;
    if (backward_hook_) {
      HostCurrent(grads_, dgrads_, grads_at_);
      for (int l = layer_end_ - 1; l >= layer_begin_; --l) backward_hook_(l);
      grads_at_ = Newer::kHost;  // the hooks may have written the host's gradients
    }
  }
}

template <class T>
void GPT<T>::ZeroGrad() {
  if (cuda()) {  // the host's copy is downloaded if it is read
    ops_.Zero(dgrads_.data(), num_params_);
    grads_at_ = Newer::kDevice;
    return;
  }
  // 44 MB for the `small` preset: worth both cores.
  T* g = grads_.data();
  const int64_t n = int64_t(grads_.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] = T(0);
}

template <class T>
void GPT<T>::set_profiling(bool on) {
  acts_->profiling = on;
}

template <class T>
std::vector<typename GPT<T>::OpTime> GPT<T>::op_times() const {
  return acts_->times;
}

template <class T>
void GPT<T>::reset_op_times() {
  acts_->times.clear();
}

#undef ATL_OP

template class GPT<float>;
template class GPT<double>;

}  // namespace atl
