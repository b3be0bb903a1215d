// The GPT-2 model shape and the layout of its one flat parameter buffer.
//
// Parameters live in one contiguous float buffer (and gradients and each optimizer moment in a
// buffer of the same layout), so all-reduce, checksums, checkpoints and state transfer work on
// contiguous ranges. Each tensor is a named view with its Hugging Face GPT2LMHeadModel name and
// shape. Linear weights use HF's Conv1D layout [in, out] (y = x W + b), so a view is byte-for-byte
// the tensor in model.safetensors. The LM head is tied to transformer.wte.weight.
//
// Order: wte, wpe, then layer by layer (ln_1, attn.c_attn, attn.c_proj, ln_2, mlp.c_fc,
// mlp.c_proj; weight before bias), then ln_f. Layer-major order keeps each layer's gradients
// contiguous, which data-parallel bucketing relies on.
//
// Thread-safety: values.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace atl {

struct GPTConfig {
  int vocab_size = 50257;
  int seq_len = 1024;  // n_positions: the longest context (rows of wpe)
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;

  int head_dim() const { return n_embd / n_head; }
  bool operator==(const GPTConfig&) const = default;
};

// Which tensor of a block (or of the whole model) a view is.
enum class ParamKind {
  kWte,
  kWpe,
  kLn1W,
  kLn1B,
  kAttnW,
  kAttnB,
  kAttnProjW,
  kAttnProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFcProjW,
  kFcProjB,
  kLnfW,
  kLnfB,
};

struct ParamTensor {
  std::string name;  // "transformer.h.3.attn.c_attn.weight"
  ParamKind kind;
  int layer;                   // block index, -1 for wte, wpe, ln_f
  std::vector<int64_t> shape;  // HF shape, e.g. {n_embd, 3 * n_embd}
  size_t offset;               // in floats, into the flat buffer
  size_t numel;
};

// All parameter tensors, in buffer order; offsets are contiguous from 0.
std::vector<ParamTensor> ParameterLayout(const GPTConfig& cfg);
size_t NumParameters(const GPTConfig& cfg);
// Offset of a tensor of kind k in block `layer` (layer ignored for wte, wpe, ln_f).
size_t ParamOffset(const GPTConfig& cfg, ParamKind k, int layer = -1);

// Returns an empty string if the shape is valid, else what is wrong (names the field).
std::string ValidateConfig(const GPTConfig& cfg);

// The part of the model one rank holds under tensor and pipeline parallelism.
//
// Pipeline: the blocks [layer_begin, layer_end). The first stage (layer_begin == 0) also holds
// wte and wpe (the embeddings); the last stage (layer_end == n_layer) holds ln_f and wte again
// (the tied LM head: with several stages, the first and the last stage each keep a copy and sum
// their gradients).
// Tensor parallel (Megatron): of tp ranks, rank tp_rank holds heads [tp_rank * n_head / tp, ...):
//   attn.c_attn  (column parallel) the q, k and v columns of its heads: [C, 3C/tp], bias [3C/tp];
//   attn.c_proj  (row parallel)    the rows of its heads: [C/tp, C]; bias [C] replicated;
//   mlp.c_fc     (column parallel) columns [tp_rank * 4C/tp, ...): [C, 4C/tp], bias [4C/tp];
//   mlp.c_proj   (row parallel)    the matching rows: [4C/tp, C]; bias [C] replicated;
//   wte          (vocab parallel)  rows ShardVocab(): the embedding and the tied LM head;
//   everything else (wpe, LayerNorms) replicated.
// The default is the whole model.
struct ModelShard {
  int tp_rank = 0, tp_size = 1;
  int layer_begin = 0, layer_end = -1;  // -1: n_layer

  int end(const GPTConfig& cfg) const { return layer_end < 0 ? cfg.n_layer : layer_end; }
  bool first_stage() const { return layer_begin == 0; }
  bool last_stage(const GPTConfig& cfg) const { return end(cfg) == cfg.n_layer; }
  bool whole(const GPTConfig& cfg) const {
    return tp_size == 1 && first_stage() && last_stage(cfg);
  }
  // Whether a tensor of this kind is split across the tensor-parallel ranks (else replicated).
  static bool SplitByTensorParallel(ParamKind k);
};

// The rows of wte (token ids) a shard holds: [begin, end), ceil(vocab / tp) per tensor-parallel
// rank (the last may hold fewer); all of them when tp_size == 1.
struct VocabRange {
  int begin, end;
};
VocabRange ShardVocab(const GPTConfig& cfg, const ModelShard& shard);

// Empty if the shard is valid for cfg, else what is wrong (n_head divisible by tp_size, a
// non-empty layer range inside [0, n_layer), tp_rank in range, a non-empty vocabulary share).
std::string ValidateShard(const GPTConfig& cfg, const ModelShard& shard);

// The tensors a shard holds, with their local shapes and offsets into its own flat buffer
// (contiguous from 0), in the whole model's order (wte, wpe, blocks, ln_f); names and `layer`
// are the whole model's. ShardLayout(cfg, {}) == ParameterLayout(cfg).
std::vector<ParamTensor> ShardLayout(const GPTConfig& cfg, const ModelShard& shard);

// Copies a shard's elements between the whole model's flat buffer (ParameterLayout) and the
// shard's (ShardLayout): to_shard = true reads `whole` and writes `shard_buf`; false writes the
// shard's elements into `whole` (the others untouched). For parameters, gradients or moments.
template <class T>
void CopyShard(const GPTConfig& cfg, const ModelShard& shard, T* whole, T* shard_buf,
               bool to_shard);

}  // namespace atl
