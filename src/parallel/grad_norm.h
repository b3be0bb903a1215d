// The global gradient norm of a sharded model: which elements each rank counts, and an exact
// (order-independent) sum of squares for the reproducible mode.
//
// Under tensor parallelism replicated tensors (LayerNorms, embeddings, row-parallel biases) have
// the same gradient on every tp rank, and under pipeline parallelism the first and the last stage
// both hold wte; the norm must count every element of the whole model once.
//
// Thread-safety: pure functions; ExactSquareSum is a value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/config.h"

namespace atl {

// [begin, end) ranges of the shard's buffer (layout = ShardLayout(cfg, shard)) that this rank
// counts toward the norm: tensor-parallel split tensors always, replicated tensors on tp rank 0,
// wte (split by vocabulary) on the first stage only. Adjacent ranges are merged; the whole model
// gives one range.
std::vector<std::pair<size_t, size_t>> NormRanges(const GPTConfig& cfg, const ModelShard& shard);

// The intersection of two sorted lists of disjoint ranges.
std::vector<std::pair<size_t, size_t>> IntersectRanges(
    const std::vector<std::pair<size_t, size_t>>& a,
    const std::vector<std::pair<size_t, size_t>>& b);

// sum g_i^2 in integers: each square (exact in double for a float g: 48 significant bits) is cut
// exactly into three int64 parts, units of 2^20, of 2^-20 and of 2^-64, each summed as int64 (the
// lower parts carried into the higher every chunk). Integer sums are associative, so the total
// does not depend on how the elements are split among threads or ranks: add every rank's parts
// (All-reduce parts() as int64) and the value is the same for any layout. Squares below 2^-64
// are dropped; |g| must be below 2^21 (a gradient element of two million: beyond it, or for NaN,
// the value is NaN and the trainer reports divergence); the total must stay below 2^80.
class ExactSquareSum {
 public:
  void Add(const float* g, size_t n);
  // {units of 2^20, units of 2^-20, units of 2^-64, ok ? 1 : 0}.
  std::vector<int64_t> parts() const { return {high_, mid_, low_, ok_ ? 1 : 0}; }
  // The value of parts summed over ranks (parts[3] == number of ranks when all were ok); NaN when
  // some rank was not ok.
  static double Value(const std::vector<int64_t>& summed_parts, int ranks);

 private:
  int64_t high_ = 0, mid_ = 0, low_ = 0;
  bool ok_ = true;
};

}  // namespace atl
