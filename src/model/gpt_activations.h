// GPT's activation buffers (private to model/: gpt.cc's forward and backward use them): one
// slot per micro-batch in flight, and the buffers one backward reuses. They live on the model's
// device; the host vectors beside them are the host's side of what crosses devices or ranks.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"
#include "model/gpt.h"

namespace atl {

// One micro-batch's forward activations for every block of the stage (backward needs them).
// Sizes are per tensor-parallel rank: Cl = n_embd / tp columns of attention, Fl = 4 n_embd / tp of
// the MLP, NHl heads. The last stage also keeps ln_f and the logits.
template <class T>
struct GPT<T>::Slot {
  Slot(const GPTConfig& c, int max_batch, int layers, int tp, bool last, int vocab, Device d) {
    const size_t N = size_t(max_batch) * c.seq_len, C = c.n_embd, L = size_t(layers);
    const size_t Cl = C / size_t(tp), Fl = 4 * C / size_t(tp), NHl = size_t(c.n_head / tp);
    // The bf16 copies' layer strides: every layer's copy 256-byte aligned.
    auto aligned = [](size_t n) { return (n + 127) / 128 * 128; };
    copy_c = aligned(N * C), copy_cl = aligned(N * Cl), copy_fl = aligned(N * Fl);
    copy_layers = L;
    attention_shape = {max_batch, c.seq_len, int(Cl), int(NHl)};
    // The probabilities on the CPU; the GPU's flash-style attention keeps each row's lse.
    att_per_layer = size_t(max_batch) * NHl * c.seq_len * (d == Device::kCpu ? c.seq_len : 1);
    inputs.Allocate(d, N);
    targets.Allocate(d, N);
    host_inputs.resize(N);
    host_targets.resize(N);
    encoded.Allocate(d, N * C);
    ln1.Allocate(d, L * N * C);
    ln1_mean.Allocate(d, L * N);
    ln1_rstd.Allocate(d, L * N);
    qkv.Allocate(d, L * N * 3 * Cl);
    atty.Allocate(d, L * N * Cl);
    att.Allocate(d, L * att_per_layer);
    residual2.Allocate(d, L * N * C);
    ln2.Allocate(d, L * N * C);
    ln2_mean.Allocate(d, L * N);
    ln2_rstd.Allocate(d, L * N);
    fch.Allocate(d, L * N * Fl);
    fch_gelu.Allocate(d, L * N * Fl);
    residual3.Allocate(d, L * N * C);
    if (last) {
      lnf.Allocate(d, N * C);
      lnf_mean.Allocate(d, N);
      lnf_rstd.Allocate(d, N);
      logits_count = N * size_t(vocab);
      logits_b_count = N * size_t(kernels::LogitsRowStride(vocab));
      if (d == Device::kCpu) logits.Allocate(d, logits_count);  // the GPU's: UseLogits
      lse.Allocate(d, N);
      losses.Allocate(d, N);
    }
  }

  size_t att_per_layer;
  Buffer<int32_t> inputs, targets;    // [N] on the device
  std::vector<int32_t> host_inputs;   // [N] the same ids on the host
  std::vector<int32_t> host_targets;  // [N] the same targets on the host
  std::vector<T> host_output;         // stage_output() on the GPU
  Buffer<T> encoded;                  // [N, C] the stage's input (embeddings on the first)
  Buffer<T> ln1, ln1_mean, ln1_rstd;  // [L, N, C], [L, N], [L, N]
  Buffer<T> qkv;                      // [L, N, 3Cl]
  Buffer<T> atty;                     // [L, N, Cl]
  Buffer<T> att;                      // [L, B, NHl, T, T] probabilities; [L, B, NHl, T] lse (GPU)
  Buffer<T> residual2;                // [L, N, C]  residual + attn.c_proj
  Buffer<T> ln2, ln2_mean, ln2_rstd;  // [L, N, C], [L, N], [L, N]
  Buffer<T> fch, fch_gelu;            // [L, N, Fl]
  Buffer<T> residual3;                // [L, N, C]  residual2 + mlp.c_proj
  Buffer<T> lnf, lnf_mean, lnf_rstd;  // [N, C], [N], [N]   (last stage)
  Buffer<T> logits;                   // [N, Vl]  this rank's vocabulary share (last stage)
  Buffer<uint16_t>
      logits_b;           // [N, LogitsRowStride(Vl)] the same in bf16 alone (GPU, bf16 products)
  Buffer<T> lse, losses;  // [N]      lse over the whole vocabulary (last stage)
  int B = 0, T_len = 0;
  bool had_targets = false;

  // bf16 copies of the products' inputs (kernels/cuda/ops.h), on the GPU under bf16 products:
  // ln1, atty, ln2, fch_gelu per layer (strides copy_c, copy_cl, copy_c, copy_fl) and lnf.
  // Allocated by the first forward that wants them (UseBf16Copies); empty otherwise.
  Buffer<uint16_t> ln1_b, atty_b, ln2_b, gelu_b, lnf_b;
  size_t copy_c = 0, copy_cl = 0, copy_fl = 0, copy_layers = 0;
  // And the bf16 Q, K, V the attention forward keeps for its backward, per layer (stride
  // copy_kept; none when the attention is not on the tensor cores: AttentionKeptElements).
  Buffer<uint16_t> kept_b;
  size_t copy_kept = 0;
  struct AttentionShape {
    int batch, seq, width, heads;  // the largest micro-batch's, per tensor-parallel rank
  } attention_shape{};
  // Whether this forward writes and reads the copies: on the GPU under bf16 products (allocating
  // them the first time).
  bool UseBf16Copies(Device d) {
    if (d != Device::kCuda || !Bf16Matmul()) return false;
    if (ln1_b.size() == 0) {
      ln1_b.Allocate(d, copy_layers * copy_c);
      atty_b.Allocate(d, copy_layers * copy_cl);
      ln2_b.Allocate(d, copy_layers * copy_c);
      gelu_b.Allocate(d, copy_layers * copy_fl);
      if (lnf.size() != 0) lnf_b.Allocate(d, copy_c);  // the last stage
      const auto& a = attention_shape;
      copy_kept = (AttentionKeptElements(a.batch, a.seq, a.width, a.heads) + 127) / 128 * 128;
      if (copy_kept != 0) kept_b.Allocate(d, copy_layers * copy_kept);
    }
    return true;
  }
  // Layer i's copy in `copies` of layer stride `stride`, or null when the copies are not in use.
  static uint16_t* At(Buffer<uint16_t>& copies, bool use, size_t i, size_t stride) {
    return use ? copies.data() + i * stride : nullptr;
  }
  // Whether the last forward wrote the copies (its backward reads them), and whether it wrote
  // ln1, ln2, fch_gelu and lnf in bf16 alone (their floats stale).
  bool copies_written = false, bf16_only = false;

  // The last stage's logits: on the GPU under bf16 products in bf16 alone, as PyTorch's autocast
  // keeps them (kernels/cuda/ops.h ClassifierForward), whether or not the copies above are in
  // use, so that they change no bit; float otherwise. On the GPU each is allocated by the first
  // forward that writes it ([N, V] floats are the largest activation; a process that switches
  // bf16 products on and off keeps both). Returns the bf16 room, or null for float logits.
  size_t logits_count = 0, logits_b_count = 0;
  bool logits_in_bf16 = false;
  uint16_t* UseLogits(Device d) {
    logits_in_bf16 = d == Device::kCuda && Bf16Matmul();
    if (logits_in_bf16 && logits_b.size() == 0) logits_b.Allocate(d, logits_b_count);
    if (!logits_in_bf16 && logits.size() == 0) logits.Allocate(d, logits_count);
    return logits_in_bf16 ? logits_b.data() : nullptr;
  }
};

// The slots, and one block's worth of gradient buffers that backward reuses from the top block
// down (one backward runs at a time). All sized for (max_batch, seq_len) once.
template <class T>
struct GPT<T>::Activations {
  Activations(const GPTConfig& c, int max_batch, int layers, int tp, bool last, int num_slots,
              int vocab, Device d) {
    const size_t N = size_t(max_batch) * c.seq_len, C = c.n_embd;
    const size_t Cl = C / size_t(tp), Fl = 4 * C / size_t(tp);
    rows = N;
    for (int i = 0; i < num_slots; ++i)
      slots.emplace_back(c, max_batch, layers, tp, last, vocab, d);
    dresidual.Allocate(d, N * C);
    dln.Allocate(d, N * C);
    dln1.Allocate(d, N * C);
    datty.Allocate(d, N * Cl);
    dqkv.Allocate(d, N * 3 * Cl);
    // The CPU's scratch (the GPU backend keeps its own).
    if (d == Device::kCpu) datt_scratch.resize(slots[0].att_per_layer);
    dfch_gelu.Allocate(d, N * Fl);
    dfch.Allocate(d, N * Fl);
    if (last) {
      if (d == Device::kCpu)
        classifier_scratch.resize(
            std::max(kernels::ClassifierForwardScratch(int(N), vocab),
                     kernels::ClassifierBackwardScratch(int(N), c.n_embd, vocab)));
      if (tp > 1) {
        vocab_targets.Allocate(d, N);
        host_vocab_targets.resize(N);
        vocab_stats.resize(N * size_t(tp + 1));
      }
    }
  }

  size_t rows;
  std::vector<Slot> slots;
  Buffer<T> dresidual;  // [N, C] gradient of the residual stream, carried down the layers
  Buffer<T> dln, dln1;  // [N, C] gradients of LayerNorm outputs (ln_f / ln_2, ln_1)
  Buffer<T> datty;      // [N, Cl]
  Buffer<T> dqkv;       // [N, 3Cl]
  std::vector<T> datt_scratch;
  Buffer<T> dfch_gelu, dfch;  // [N, Fl]
  std::vector<T> classifier_scratch;
  Buffer<int32_t> vocab_targets;            // [N] targets in this rank's vocabulary share (tp > 1)
  std::vector<int32_t> host_vocab_targets;  // the same, formed on the host
  std::vector<T> vocab_stats;      // [tp + 1, N] every rank's lse, then the target logits (host)
  std::vector<T> staging[2];       // GPU only: host copies for all-reduces and the vocabulary loss
  std::vector<T> host_input_grad;  // input_grad() on the GPU
  int last_backward_slot = 0;
  // bf16 copies of dresidual, dqkv and dfch (kernels/cuda/ops.h), for a backward whose forward
  // wrote the Slot's copies; allocated by the first such backward.
  Buffer<uint16_t> dresidual_b, dqkv_b, dfch_b;
  void AllocateBf16GradCopies(Device d) {
    if (dresidual_b.size() != 0) return;
    dresidual_b.Allocate(d, dresidual.size());
    dqkv_b.Allocate(d, dqkv.size());
    dfch_b.Allocate(d, dfch.size());
  }

  bool profiling = false;
  std::vector<OpTime> times;
};

}  // namespace atl
