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
// ZeRO-1 mode (Options::zero): each bucket [b, e) is cut into D = comm->size() equal pieces of
// p = ceil((e - b) / D) elements; rank r owns [b + r p, min(e, b + (r + 1) p)) (empty when that
// starts at or beyond e). Instead of an all-reduce, each bucket gets a reduce-scatter (the bucket
// copied into a zero-padded staging buffer of D p elements first, unless D divides its length), so
// after Finish a rank holds the summed gradient of its own pieces only: shard_grads(), in "shard
// coordinates" (the owned pieces concatenated in increasing local order, owned()). The optimizer
// updates the owned parameters (train/optimizer.h's AdamW over owned()), then AllGatherInPlace
// gives every rank all the parameters. Reproducible + ZeRO: the int64 accumulator (zero-padded per
// bucket, so no staging) is reduce-scattered, and only the owned pieces are converted to float:
// the float gradient of each owned element is bitwise the one the reproducible all-reduce gives.
// In the normal mode, the in-process backend's sums are in rank order for both collectives, so
// the owned pieces equal the all-reduce result bitwise there too (MPI may sum in another order).
// Memory in ZeRO mode on D > 1 ranks, besides the caller's buffers: shard_grads (shard_size()
// floats), p floats per bucket (short pieces, all-gather sends), D p floats per bucket that D does
// not divide (staging, shared by the reduce-scatters and the all-gathers: about n), and in
// reproducible mode the int64 accumulator (D p per bucket) and p int64 per bucket to receive.
//
// The local layout: a rank's buffer holds any contiguous subset of the model (tensor / pipeline
// parallel): wte (maybe), wpe (maybe), blocks in increasing layer order (maybe none), ln_f (maybe),
// with offsets contiguous from 0 and ParamTensor::layer the GLOBAL block index (-1 for wte, wpe,
// ln_f). Every rank of the data-parallel group must pass the same layout and options: the
// collectives are matched by order, bucket by bucket.
//
// Thread-safety: one thread (the rank's), like its Communicator.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/grad_checksum.h"

namespace atl {

struct GradBucket {
  size_t begin = 0, end = 0;  // float offsets into the (local) gradient buffer
  int ready_after = -1;       // the global block whose backward completes it; -1: after Backward
};

// Buckets over a local layout (above): whole blocks counted from the top, each at least
// bucket_bytes (elem_bytes per element) unless it is the last; tensors after the blocks (ln_f) go
// with the top bucket, and ready_after is the global layer of the bucket's lowest block. The final
// bucket starts at 0 (wte and wpe if present, the lowest blocks) with ready_after -1. A layout
// without blocks gives one bucket. Covers [0, n) exactly, n = the end of the last tensor; buckets
// are listed from the top of the buffer down.
std::vector<GradBucket> MakeGradBuckets(const std::vector<ParamTensor>& layout, double bucket_bytes,
                                        size_t elem_bytes = sizeof(float));
// The same over the whole model, ParameterLayout(cfg).
std::vector<GradBucket> MakeGradBuckets(const GPTConfig& cfg, double bucket_bytes,
                                        size_t elem_bytes = sizeof(float));

// A piece of the local buffer that this rank owns in ZeRO-1 mode.
struct OwnedRange {
  size_t local_begin = 0;  // offset into the local buffers (parameters, gradients)
  size_t length = 0;       // may be 0
  size_t shard_begin = 0;  // offset into the shard buffers (shard_grads, optimizer moments)
  bool operator==(const OwnedRange&) const = default;
};

class GradientReducer {
 public:
  struct Options {
    double bucket_mb = 4.0;     // MiB per bucket (of int64 in reproducible mode)
    bool reproducible = false;  // int64 fixed-point reduction (above)
    int64_t micro_batches = 1;  // per optimizer step over the global batch (fixed-point range)
    bool zero = false;          // ZeRO-1: reduce-scatter the gradients, all-gather parameters
  };

  // comm: the data-parallel group (nullptr: one replica; Finish only converts in reproducible
  // mode). layout: this rank's local buffer (above). A communicator of device memory (NCCL:
  // Communicator::device_memory) takes the normal mode only (std::invalid_argument otherwise),
  // and then Finish takes the GPU's gradients (not Hook: GPT's backward hook on the GPU sees host
  // copies).
  GradientReducer(Communicator* comm, const std::vector<ParamTensor>& layout, Options options);
  // The whole model on every replica, without ZeRO.
  GradientReducer(Communicator* comm, const GPTConfig& cfg, double bucket_mb, bool reproducible,
                  int64_t micro_batches);

  bool reproducible() const { return reproducible_; }
  bool zero() const { return zero_; }
  // Whether the gradients it sums are device memory (its communicator's).
  bool device_memory() const { return comm_ != nullptr && comm_->device_memory(); }
  const std::vector<GradBucket>& buckets() const { return buckets_; }
  // Elements of the local buffer.
  size_t size() const { return n_; }

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
  // reduction started as soon as its blocks' backward is done.
  Status Add(float* grads);

  // Starts the buckets not yet started, waits for all. Without ZeRO (or with one rank) grads
  // then hold the sum (reproducible mode: converted from the accumulator). With ZeRO on D > 1
  // ranks shard_grads() holds the sum over the owned pieces; grads keep this rank's own gradient
  // (normal mode) or zeros (reproducible mode). Errors name the bucket.
  Status Finish(float* grads);

  // Reproducible mode without ZeRO, after Finish: the int64 sum (units of 2^-40) the gradients
  // were converted from, for a further exact sum (the sites' over the WAN); ConvertFixed converts
  // it into grads again. Changing it changes what ConvertFixed gives, nothing else.
  std::span<int64_t> fixed_sums() {
    return reproducible_ && !sharded() ? acc_ : std::span<int64_t>();
  }
  void ConvertFixed(float* grads) const;

  // Checksums carried through the reduction (parallel/grad_checksum.h; null: none): each bucket's
  // contribution is recorded just before its reduction starts, and Finish sums the records over
  // the group. The checksum's segments must have the edges Cuts() gives.
  // Not with a communicator of device memory (std::invalid_argument: the records read the
  // gradients on the host).
  void set_checksum(GradChecksum* c);
  // The edges the checksum's segments need: every bucket's, and with ZeRO every rank's pieces'.
  std::vector<size_t> Cuts() const;

  // Seconds Finish spent waiting (communication not hidden behind backward), last step.
  double last_wait_s() const { return last_wait_s_; }

  // ---- ZeRO-1. Without ZeRO, or with one rank, this rank owns everything: shard coordinates
  // are local coordinates, shard_grads() is the `grads` of the last Finish (no copy), and the
  // all-gathers copy (or do nothing). ----

  // This rank's pieces, one per bucket (possibly empty), in increasing local_begin order (the
  // reverse of buckets()); their shard_begin are consecutive from 0. The owned pieces of the D
  // ranks partition [0, size()).
  const std::vector<OwnedRange>& owned() const { return owned_; }
  // Elements of the shard buffers: the sum of owned()'s lengths.
  size_t shard_size() const { return shard_size_; }
  // After Finish: the summed gradient of the owned pieces, shard_size() elements in shard
  // coordinates. Valid until the next Finish (or until that `grads` changes, with one rank).
  // With a communicator of device memory: Finish's `grads`, GPU memory.
  float* shard_grads() { return shard_grads_; }
  const float* shard_grads() const { return shard_grads_; }

  // Collective: every rank's owned pieces into `local` (local coordinates, size() elements) on
  // every rank; this rank's pieces are read from `shard` (shard coordinates, shard_size()
  // elements; e.g. optimizer moments, for a checkpoint). REQUIRES: shard and local do not
  // overlap. All buckets' all-gathers are started, then waited for (errors name the bucket).
  Status AllGather(float* local, const float* shard);
  // The same, with this rank's pieces read from `local` itself: after the optimizer has updated
  // the owned parameters in place, gives every rank all the parameters.
  Status AllGatherInPlace(float* local);
  // Seconds the last AllGather / AllGatherInPlace took.
  double last_gather_s() const { return last_gather_s_; }

 private:
  // ZeRO bookkeeping of bucket i (D > 1).
  struct Split {
    size_t piece = 0;     // p = ceil(len / D): elements per rank
    size_t stage = 0;     // offset of the bucket's D p staging floats in stage_ (if padded)
    size_t small = 0;     // offset of p floats in small_, and of p int64 in recv64_
    size_t acc = 0;       // offset of the bucket in acc_
    bool padded = false;  // D p > len: the collectives go through stage_
  };

  void Launch(size_t i, float* grads);
  Status AddRange(float* grads, size_t begin, size_t end, int64_t* acc);
  Status Gather(float* local, const float* shard);
  // owned() entry of bucket i.
  const OwnedRange& Owned(size_t i) const { return owned_[buckets_.size() - 1 - i]; }
  bool sharded() const { return ranks_ > 1; }

  Communicator* comm_;
  GradChecksum* checksum_ = nullptr;
  bool reproducible_;
  bool zero_;
  int64_t micro_batches_;
  int ranks_ = 1;  // D: the pieces per bucket (1 without ZeRO)
  size_t n_ = 0;
  std::vector<GradBucket> buckets_;
  std::vector<CommHandle> handles_;
  std::vector<bool> started_;
  std::vector<int64_t> acc_;  // reproducible mode; with ZeRO on D > 1, D p per bucket
  Status hook_status_;
  double last_wait_s_ = 0;
  double last_gather_s_ = 0;

  std::vector<OwnedRange> owned_;
  size_t shard_size_ = 0;
  float* shard_grads_ = nullptr;
  std::vector<Split> splits_;
  std::vector<float> shard_;     // shard_grads with ZeRO on D > 1
  std::vector<float> stage_;     // padded buckets' D p elements
  std::vector<float> small_;     // p per bucket: short received pieces, all-gather sends
  std::vector<int64_t> recv64_;  // reproducible: p per bucket, the reduce-scattered int64
};

}  // namespace atl
