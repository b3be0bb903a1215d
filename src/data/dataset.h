// Token files and the deterministic sampler.
//
// A token file holds uint16 token ids behind a small header:
//   bytes 0..7   magic "ATOLTOK1"
//   bytes 8..15  uint64 little-endian token count n
//   bytes 16..23 uint64 XXH3-64 of the token bytes
//   bytes 24..   n uint16 little-endian tokens
// `atoll data prepare` writes DIR/train.bin and DIR/val.bin (documents separated by
// <|endoftext|>) and DIR/meta.json (sources, token counts, split rule).
//
// Thread-safety: TokenFile and Sampler are immutable after construction.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/status.h"

namespace atl {

// A memory-mapped token file, verified (magic, size, checksum) on open. A truncated or corrupted
// file is refused with kCorruption naming the file and what was wrong.
class TokenFile {
 public:
  static StatusOr<TokenFile> Open(const std::string& path);
  std::span<const uint16_t> tokens() const { return tokens_; }
  size_t size() const { return tokens_.size(); }
  uint64_t checksum() const { return checksum_; }
  const std::string& path() const { return file_.path(); }

 private:
  MappedFile file_;
  std::span<const uint16_t> tokens_;
  uint64_t checksum_ = 0;
};

// TokenFile::Open's check of a token file's bytes (`path` names it in messages): the tokens, in
// place, and *checksum their XXH3-64. REQUIRES: bytes.data() is 2-byte aligned.
StatusOr<std::span<const uint16_t>> ParseTokenFile(std::span<const uint8_t> bytes,
                                                   const std::string& path, uint64_t* checksum);

// Writes a token file atomically.
Status WriteTokenFile(const std::string& path, std::span<const uint16_t> tokens);

// Picks training windows of seq_len + 1 consecutive tokens. The window for the sequence at
// global position `position` of the batch of optimizer step `step` starts at
// RandomBelow(seed, step, kDataSample, position, n - seq_len): a pure function of
// (seed, step, position), never of how many ranks or micro-batches read it.
class Sampler {
 public:
  // REQUIRES: tokens.size() > seq_len.
  Sampler(std::span<const uint16_t> tokens, uint64_t seed, int seq_len);

  // Fills inputs[0..seq_len) and targets[0..seq_len) (targets are inputs shifted by one).
  void Window(uint64_t step, uint64_t position, int32_t* inputs, int32_t* targets) const;
  uint64_t WindowStart(uint64_t step, uint64_t position) const;

  // Evaluation windows, as `atoll eval` defines its loss: window i is tokens
  // [i * (seq_len + 1), (i + 1) * (seq_len + 1)): consecutive and non-overlapping.
  size_t NumEvalWindows() const;
  void EvalWindow(size_t i, int32_t* inputs, int32_t* targets) const;

  int seq_len() const { return seq_len_; }

 private:
  std::span<const uint16_t> tokens_;
  uint64_t seed_;
  int seq_len_;
};

}  // namespace atl
