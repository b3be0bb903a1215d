// The reference encoder: scripts/bpe_reference.js run by node over the npm package
// gpt-3-encoder. Used by `atoll data check-tokenizer` and the tokenizer tests to compare ids.
//
// Thread-safety: functions are thread-safe (each call runs its own node processes).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "core/status.h"

namespace atl {

// Finds scripts/bpe_reference.js: under $ATOLL_SOURCE_DIR, then the working directory, then the
// source tree atoll was built from. NotFound (saying to run from the repository) if none has it.
StatusOr<std::string> FindReferenceScript();

// Runs the reference over `files` in `processes` node processes at once and returns each file's
// ids in the order given. An id the reference could not produce (JSON null) comes back as -1.
// Fails with NotFound (saying to run scripts/setup.sh) if node or the package is missing.
StatusOr<std::vector<std::vector<int>>> RunReferenceEncoder(const std::vector<std::string>& files,
                                                            const std::string& package_dir,
                                                            int processes = 1);

// Where two id sequences first differ; index == min(size) when one is a prefix of the other.
struct TokenMismatch {
  size_t index = 0;
  int ours = -1;       // -1 past the end
  int reference = -1;  // -1 past the end (or null in the reference)
};
// Returns false if the sequences are equal, else fills *m.
bool FirstMismatch(const std::vector<int>& ours, const std::vector<int>& reference,
                   TokenMismatch* m);

}  // namespace atl
