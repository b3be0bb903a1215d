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
  kWte, kWpe,
  kLn1W, kLn1B, kAttnW, kAttnB, kAttnProjW, kAttnProjB,
  kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB,
  kLnfW, kLnfB,
};

struct ParamTensor {
  std::string name;            // "transformer.h.3.attn.c_attn.weight"
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

}  // namespace atl
