// Which parameters one low-communication exchange carries (world.strategy = "diloco",
// "streaming"; train/strategies/lowcomm.h): a fragment is a set of ranges of the flat parameter
// buffer (model/config.h layout: wte, wpe, the blocks in order, ln_f).
//
// DiLoCo exchanges the whole buffer (one fragment). Streaming DiLoCo (arXiv 2501.18512) cuts the
// model into P fragments exchanged in turn, by transformer blocks in the paper's strided pattern:
// block l belongs to block fragment l mod B, so every fragment spans the network's depth, and
// the parameters outside the blocks (the token and position embeddings and the final LayerNorm)
// are fragments of their own. P = B + E, with E embedding fragments (even, contiguous pieces of
// those parameters, in buffer order) sized after their share of the model:
//   E = clamp(round(P * share), 1, P - 1),  B = P - E  (at most n_layer: the rest goes to E).
// So a model whose embeddings are a small part (GPT-2 124M: 31%, P = 4) gets E = 1 and three
// block fragments of four blocks each; `small` (87% embeddings, P = 4) gets E = 3 embedding
// pieces and one fragment of all four blocks, so no exchange is much larger than another. P = 1
// is the whole model. Fragments are ordered block fragments first, then the embedding pieces.
//
// Thread-safety: functions on values.
#pragma once

#include <cstddef>
#include <vector>

#include "model/config.h"

namespace atl {

struct Range {
  size_t begin = 0, end = 0;
  size_t size() const { return end - begin; }
};

// Ranges ascending and disjoint; adjacent ranges are merged.
struct Fragment {
  std::vector<Range> ranges;
  size_t size() const;
};

// n elements cut into `parts` contiguous ranges, sizes as even as possible (the first n % parts
// one larger).
std::vector<Range> SplitEvenly(size_t n, int parts);

// One fragment: all n elements.
std::vector<Fragment> WholeBuffer(size_t n);

// Streaming DiLoCo's P fragments of `cfg`'s parameters (above). REQUIRES: parts >= 1.
std::vector<Fragment> StreamingFragments(const GPTConfig& cfg, int parts);

// Copies a fragment's elements of `flat` into `packed` (fragment.size() floats, range by range)
// and back.
void Gather(const Fragment& f, const float* flat, float* packed);
void Scatter(const Fragment& f, const float* packed, float* flat);

}  // namespace atl
