// Data parallel gradient reduction over the flat gradient buffer.
//
// Every replica computes the gradient of its share of the global batch, scaled by 1 / (number of
// micro-batches in the GLOBAL batch), so the SUM over replicas is the single-process gradient of
// the mean loss. GradientReducer forms that sum on every replica.
//
// Normal mode: the buffer is cut into buckets of whole transformer blocks (about bucket_mb MiB
// each), counted from the end because backward produces the last blocks' gradients first: the
// first bucket is [block L-1 .. ln_f], and the last one always holds wte and wpe (the tied wte is
// final only when Backward returns). Hook() gives a GPT backward hook that starts each bucket's
// non-blocking all-reduce as soon as its lowest block's backward is done; Finish() starts what is
// left and waits for every bucket. The sums are float sums in the backend's order: the result
// matches the single-process gradient to rounding, not bit for bit.
//
// Reproducible mode: each micro-batch's gradient (computed alone, from zeroed gradients) is
// rounded to fixed point, int64 units of 2^-40, and added into an int64 accumulator; the
// accumulators are all-reduced as int64 sums. Integer addition is associative, so the result does
// not depend on which replica held which micro-batch, nor on the reduction order: the parameters
// are bitwise identical for any dp (with the same global batch and micro_batch_size). Costs: one
// pass over the buffer per micro-batch (ZeroGrad + conversion), and twice the bytes on the wire.
// Range: |per-micro-batch gradient| < 2^22 / (micro-batches per step); beyond it (or NaN) Add()
// fails. Resolution 2^-40 (~9e-13) absolute: smaller gradient components are rounded.
//
// Thread-safety: one thread (the rank's), like its Communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/config.h"

namespace atl {

struct GradBucket {
  size_t begin = 0, end = 0;  // float offsets into the gradient buffer
  int ready_after = -1;       // the block whose backward completes it; -1: after Backward returns
};

// Buckets of whole blocks from the end, each at least bucket_bytes (4-byte elements) unless it is
// the last; the final bucket starts at 0 (wte, wpe, the lowest blocks). Covers [0, n) exactly.
std::vector<GradBucket> MakeGradBuckets(const GPTConfig& cfg, double bucket_bytes,
                                        size_t elem_bytes = sizeof(float));

class GradientReducer {
 public:
  // comm: the data-parallel group (nullptr: one replica; Finish only converts in reproducible
  // mode). micro_batches: per optimizer step over the global batch (for the fixed-point range).
  GradientReducer(Communicator* comm, const GPTConfig& cfg, double bucket_mb, bool reproducible,
                  int64_t micro_batches);

  bool reproducible() const { return reproducible_; }
  const std::vector<GradBucket>& buckets() const { return buckets_; }

  // Normal mode: starts a step (no bucket in flight).
  void Begin();
  // A GPT backward hook that starts the buckets completed by block l (reproducible mode: after
  // adding them into the accumulator). Install it for the last micro-batch's Backward only.
  std::function<void(int)> Hook(float* grads);

  // Reproducible mode: zeroes the accumulator (call once per step before the first Add, with
  // zeroed gradients).
  void BeginFixedPoint();
  // Reproducible mode: adds one micro-batch's gradient (alone in `grads`) into the accumulator
  // and zeroes `grads` for the next micro-batch (one pass). For the last micro-batch install
  // Hook(grads) instead and let Finish add what is left: each bucket is converted and its int64
  // all-reduce started as soon as its blocks' backward is done.
  Status Add(float* grads);

  // Starts the buckets not yet started, waits for all; reproducible mode: all-reduces the
  // accumulator and writes the sum into grads as float. Errors name the bucket.
  Status Finish(float* grads);

  // Seconds Finish spent waiting (communication not hidden behind backward), last step.
  double last_wait_s() const { return last_wait_s_; }

 private:
  void Launch(size_t i, float* grads);
  Status AddRange(float* grads, size_t begin, size_t end);

  Communicator* comm_;
  bool reproducible_;
  int64_t micro_batches_;
  size_t n_;
  std::vector<GradBucket> buckets_;
  std::vector<CommHandle> handles_;
  std::vector<bool> started_;
  std::vector<int64_t> acc_;
  Status hook_status_;
  double last_wait_s_ = 0;
};

}  // namespace atl
