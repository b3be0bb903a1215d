// Token files people already have, read without re-tokenizing: `atoll data import`.
//
//   nanogpt  nanoGPT's prepare.py output: raw uint16 little-endian token ids, no header
//            (train.bin, val.bin).
//   llmc     llm.c's dev/data output: a header of 256 little-endian int32 (magic 20240520,
//            version 1, token count n, then zeros), then n uint16 little-endian ids
//            (e.g. fineweb_train_000001.bin, tinyshakespeare_val.bin). Version 2 files hold
//            uint32 ids (LLaMA 3's vocabulary) and are refused: atoll's token files are uint16.
//
// An import writes <out>/train.bin, <out>/val.bin (atoll token files: dataset.h) and meta.json
// (what was imported from where, with each source's XXH3-64), each atomically. Several sources
// of one split are concatenated in the order given (a directory's in name order). Every id must
// be below vocab_size (GPT-2: 50257), or the import names the file and the first bad position.
//
// Text (`atoll data import --format text`) is PrepareDataset with any_files (corpus.h): every
// file under the inputs, strict UTF-8, through the GPT-2 tokenizer.
//
// Thread-safety: pure functions (ImportTokenFiles writes only under out_dir).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl {

enum class TokenFormat { kNanoGpt, kLlmc };

// "nanogpt" or "llmc".
StatusOr<TokenFormat> ParseTokenFormat(const std::string& name);

// The ids in a file's bytes, or InvalidArgument naming `path` and what is wrong (an odd size; an
// llm.c header's magic, version or count).
StatusOr<std::vector<uint16_t>> ParseNanoGptBin(std::span<const uint8_t> bytes,
                                                const std::string& path);
StatusOr<std::vector<uint16_t>> ParseLlmcBin(std::span<const uint8_t> bytes,
                                             const std::string& path);

inline constexpr int32_t kLlmcMagic = 20240520;
inline constexpr size_t kLlmcHeaderInts = 256;

struct ImportOptions {
  TokenFormat format = TokenFormat::kNanoGpt;
  // Files of each split; or a directory in `dir`: nanogpt, its train.bin and val.bin; llmc, its
  // *train*.bin and *val*.bin files, in name order.
  std::vector<std::string> train, val;
  std::string dir;
  std::string out_dir;
  int vocab_size = 50257;
};

struct ImportResult {
  std::vector<std::string> train_files, val_files;
  uint64_t train_tokens = 0, val_tokens = 0;
};

StatusOr<ImportResult> ImportTokenFiles(const ImportOptions& options);

}  // namespace atl
