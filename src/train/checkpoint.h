// Checkpoints: a directory a crash cannot tear and a reader verifies before trusting.
//
//   model.safetensors      parameters, F32, Hugging Face GPT2LMHeadModel names and shapes (the
//                          LM head is tied to transformer.wte.weight); metadata format=pt, so
//                          transformers' GPT2LMHeadModel.from_pretrained(DIR) loads it as is
//   config.json            the Hugging Face GPT2Config of the model
//   optimizer.safetensors  AdamW moments per tensor: "exp_avg.<name>", "exp_avg_sq.<name>" (F32)
//   manifest.json          format version, step, seed, data cursor (next step, tokens seen, the
//                          train/val files' checksums), RNG state, mesh, the effective config,
//                          the XXH3 of every tensor in both safetensors files and of config.json,
//                          and the XXH3 of the manifest itself
//
// RNG state: every random draw is a pure function of (seed, step, purpose, index) (core/rng.h),
// so the seed and the step ARE the state; nothing else is saved, and the manifest says so.
//
// Writing: everything goes into "<dir>.tmp", each file fsynced, then the directory replaces
// <dir> by rename (core/file.h ReplaceDir). Loading: the manifest's own checksum, then each
// safetensors file's structure (safetensors.h), that it holds exactly the tensors the config's
// layout names with the right dtype and shape, and every tensor's checksum. Any failure is
// kCorruption naming the file and the tensor (exit code 2); a missing file is kNotFound.
//
// Thread-safety: functions; concurrent writers to the same directory are not supported.
#pragma once

#include <cstdint>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/config.h"

namespace atl {

constexpr int kCheckpointFormatVersion = 1;

// Where the data stream stands: the next optimizer step to run (equal to the number of steps
// completed) and the token files it reads, by checksum.
struct DataCursor {
  int64_t next_step = 0;
  uint64_t tokens_seen = 0;  // next_step * batch_size * seq_len
  uint64_t train_checksum = 0;
  uint64_t val_checksum = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
};

// What a checkpoint holds once loaded.
struct Checkpoint {
  RunConfig config;
  DataCursor cursor;
  int64_t optimizer_steps = 0;  // AdamW update count t
  std::vector<float> params;    // NumParameters(config.model) floats, layout order
  std::vector<float> exp_avg;   // empty unless loaded with the optimizer
  std::vector<float> exp_avg_sq;
};

// What to write. Pointers are to NumParameters(config.model) floats each.
struct CheckpointSource {
  const RunConfig* config = nullptr;
  DataCursor cursor;
  int64_t optimizer_steps = 0;
  const float* params = nullptr;
  const float* exp_avg = nullptr;
  const float* exp_avg_sq = nullptr;
};

Status WriteCheckpoint(const std::string& dir, const CheckpointSource& src);

// Loads and verifies a checkpoint. With with_optimizer == false optimizer.safetensors is neither
// read nor verified (eval, sample).
StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, bool with_optimizer);

// LoadCheckpoint's reading of manifest.json (`text`, named `path` in messages): its checksum,
// format version, config, data cursor and optimizer step; the tensors are left empty and
// *files gets the manifest's "files" section (the files' and tensors' checksums).
StatusOr<Checkpoint> ParseManifest(std::string_view text, const std::string& path,
                                   nlohmann::ordered_json* files);

// The Hugging Face GPT2Config for a model shape (config.json).
std::string HuggingFaceConfigJson(const GPTConfig& model);

}  // namespace atl
