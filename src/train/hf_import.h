// Weights from a Hugging Face GPT-2 directory (what `save_pretrained` writes, or a model
// downloaded from the Hub): config.json and model.safetensors, for `atoll eval`, `atoll sample`
// and train.init_from (fine-tuning from pretrained weights).
//
//   config.json        a GPT2Config: model_type "gpt2"; n_layer, n_head, n_embd, vocab_size and
//                      n_positions give the shape; what atoll's GPT computes otherwise must hold
//                      (activation gelu_new or gelu_pytorch_tanh, n_inner null or 4 n_embd,
//                      layer_norm_epsilon 1e-5, tied embeddings, scale_attn_weights and no
//                      scale_attn_by_inverse_layer_idx), or the directory is refused, naming the
//                      key
//   model.safetensors  the tensors by GPT2LMHeadModel's names with or without the
//                      "transformer." prefix (GPT2Model's, as the Hub's gpt2 has them), F32, F16,
//                      BF16 or F64, widened to float exactly (F64 rounded); the attention's
//                      mask buffers (attn.bias, attn.masked_bias, of any dtype) are skipped; an
//                      lm_head.weight must equal wte (tied), or stands for it when wte is absent
//                      (safetensors' save_model keeps one name of tied tensors); any other
//                      tensor is refused
//
// A sharded checkpoint (model.safetensors.index.json) or PyTorch pickles alone
// (pytorch_model.bin) are refused with how to convert them. Errors: kNotFound for a missing
// directory or file, kInvalidArgument for a model atoll does not compute, kCorruption for a
// damaged file (exit 2 in the CLI).
#pragma once

#include <string>

#include "core/status.h"
#include "train/checkpoint.h"

namespace atl {

// The weights of a Hugging Face GPT-2 directory: config.model is its shape, the rest of config
// atoll's defaults; params in layout order (model/config.h ParameterLayout); no optimizer state,
// cursor at step 0.
StatusOr<Checkpoint> LoadHuggingFaceWeights(const std::string& dir);

// Weights from either kind of directory: an atoll checkpoint (manifest.json: LoadCheckpoint
// without the optimizer, every checksum verified) or a Hugging Face one (config.json and
// model.safetensors, no manifest).
StatusOr<Checkpoint> LoadWeights(const std::string& dir);

}  // namespace atl
