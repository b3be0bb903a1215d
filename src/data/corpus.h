// From text files to token files: what `atoll data prepare` and `atoll data encode` do.
//
// A corpus is a list of documents (one text file each). prepare encodes them in parallel, joins
// them with <|endoftext|> before each document, sends every Nth document to the validation split
// and writes train.bin, val.bin and meta.json. The output depends only on the inputs, the
// tokenizer files and N: not on the number of threads.
//
// Thread-safety: functions are thread-safe for distinct output paths.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "data/tokenizer.h"

namespace atl {

// Expands inputs into document paths: a file is itself; a directory contributes its *.txt files
// (not recursively) sorted by name, or with any_files every regular file under it (recursively;
// names starting with '.' skipped, as are such directories) sorted by path. NotFound for a
// missing input, InvalidArgument when nothing is left.
StatusOr<std::vector<std::string>> ListDocuments(const std::vector<std::string>& inputs,
                                                 bool any_files = false);

// Called after each document is encoded, from the encoding threads but never by two at once:
// documents done, documents in all, bytes read so far.
using EncodeProgress = std::function<void(size_t done, size_t total, uint64_t bytes)>;

// Reads and encodes each file with `threads` threads (0: one per core); ids in file order. With
// strict_utf8 a file that is not well-formed UTF-8 is InvalidArgument naming it and the offset
// (without, invalid bytes decode as the reference encoder's runtime decodes them: utf8.h).
StatusOr<std::vector<std::vector<int>>> EncodeFiles(const Tokenizer& tokenizer,
                                                    const std::vector<std::string>& files,
                                                    int threads,
                                                    const EncodeProgress& progress = nullptr,
                                                    bool strict_utf8 = false);

struct PrepareOptions {
  std::vector<std::string> inputs;  // files or directories
  std::string out_dir;
  int val_every = 20;  // document k (1-based, in order) goes to val iff k % val_every == 0
  std::string encoder_dir;
  int threads = 0;       // 0: one per core
  bool progress = true;  // progress lines on stderr
  // `atoll data import --format text`: directories give every file under them, and each must be
  // well-formed UTF-8 (ListDocuments, EncodeFiles).
  bool any_files = false;
};

struct PrepareResult {
  size_t documents = 0;
  size_t train_documents = 0;
  size_t val_documents = 0;
  uint64_t train_tokens = 0;
  uint64_t val_tokens = 0;
  uint64_t bytes = 0;
  double seconds = 0;
};

// Writes <out_dir>/train.bin, val.bin and meta.json (each atomically; meta.json last).
StatusOr<PrepareResult> PrepareDataset(const PrepareOptions& options);

}  // namespace atl
