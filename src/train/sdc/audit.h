// Audit replay: atoll is bitwise deterministic, so executing a step a second time from the same
// state is an exact oracle. Any difference between the two executions is corruption, and the
// first traced op whose output differs says where it happened.
//
// With sdc.on_alarm = "redo" (or every sdc.audit_every steps), the training loop works like this
// (train/trainer.cc):
//   1. Before the update it takes a StepSnapshot: the parameters, the AdamW moments and the step
//      count (what a step changes). While the step runs, a StepTrace records a fingerprint
//      (XXH3-64) of every op output the model's hook shows: each block's four GEMM products in
//      forward and backward and its output, with the micro-batch. At the end it records the
//      per-tensor fingerprints of the gradients that the update reads.
//   2. On an alarm from any detector of the site (or a non-finite loss or gradient norm), every
//      rank of the site rolls back to its snapshot and replays the step with a fresh trace.
//   3. Each rank compares the two traces (FirstDifference). No rank's replay differs: the step is
//      reproducible (a genuine spike in the data, or a fault that strikes the same way every
//      time). Some rank's replay differs: one of the two runs was corrupted, and a third run
//      decides which (the one it does not match, on every rank). The event names the micro-batch,
//      block and op, the micro-batch's loss, or for a gradient changed after the backward, the
//      tensor, and which run was corrupted. The run goes on with the result two runs agree on: the
//      parameters of a run without the fault, bit for bit. Three different results on a rank:
//      the run stops (a rank that keeps computing wrong results).
// Traced are the block GEMM products and outputs, each micro-batch's loss and the gradients; a
// fault elsewhere (a layer norm, attention, the head) is named at the next traced value it
// changes. A fault that lands after the reduction on one rank (a gradient) shows only there. A
// fault in a rank's backward reaches its data-parallel replicas through the gradient reduction,
// so their gradients differ too; ShareReplays keeps the ranks whose computation differed, not the
// ones that only received the difference. With tensor or pipeline parallelism the ranks that
// receive a corrupt activation (a tp all-reduce, the next stage) differ in their own ops as well
// and are named beside the one where it struck.
//
// Not caught by a replay: corruption of state at rest before the snapshot (a parameter or a
// moment flipped in memory between steps). The replay starts from the same corrupt state and
// reproduces it; the memory checks (train/sdc/memory.h) find and repair those before the step,
// and replica fingerprints see them after it. With the memory checks on, a fingerprint mismatch
// after a step is replayed too: the replicas held the same bits when it started.
//
// Thread-safety: a StepTrace and a StepSnapshot belong to their rank's training thread.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "model/config.h"
#include "train/optimizer.h"
#include "train/sdc/faults.h"
#include "train/sdc/monitor.h"

namespace atl {

class StepTrace {
 public:
  struct Op {
    int64_t micro;
    FaultKind kind;  // kGemmForward, kGemmBackward or kActivation
    int layer, gemm;
    uint64_t hash;
  };
  void Clear();
  // The micro-batch the next ops belong to (its index in the whole batch).
  void At(int64_t micro) { micro_ = micro; }
  // The model's op hook: fingerprints the op's output.
  void OnOp(FaultKind kind, int layer, int gemm, const float* out, size_t n);
  // The gradients the update reads: one fingerprint per tensor of `layout`, or, with ZeRO (where
  // this rank holds a flat shard of them), `layout` empty and one for the whole shard.
  void SetGrads(const std::vector<ParamTensor>& layout, const float* grads, size_t n);
  // The site's reduced gradients (float32, or the reproducible mode's int64 sums) just before
  // they cross the WAN (world.strategy = sync), and the sum that came back (after): a sum that
  // differs while what was sent does not came over the WAN.
  void SetWan(const void* sums, size_t bytes, bool after);
  // The losses of this rank's micro-batches (the last pipeline stage's; by local index), which
  // are micro-batches first_micro, first_micro + 1, ... of the whole batch, or `micros` (several
  // blocks: a lost site's taken over, world.balance's shares).
  void SetLosses(const std::vector<double>& losses, int64_t first_micro);
  void SetLosses(const std::vector<double>& losses, std::vector<int64_t> micros);
  // The whole batch's index of this rank's local micro-batch j.
  int64_t MicroAt(size_t j) const {
    return j < micros_.size() ? micros_[j] : first_micro_ + int64_t(j);
  }

  const std::vector<Op>& ops() const { return ops_; }
  const std::vector<uint64_t>& grads() const { return grads_; }
  const std::vector<double>& losses() const { return losses_; }
  int64_t first_micro() const { return first_micro_; }
  uint64_t sent() const { return sent_; }  // SetWan's hashes (0: none)
  uint64_t received() const { return received_; }
  // Seconds spent hashing so far (not reset by Clear).
  double seconds() const { return seconds_; }

 private:
  int64_t micro_ = -1, first_micro_ = 0;
  std::vector<int64_t> micros_;  // SetLosses's (empty: from first_micro_)
  double seconds_ = 0;
  std::vector<Op> ops_;
  std::vector<uint64_t> grads_;
  std::vector<double> losses_;
  uint64_t sent_ = 0, received_ = 0;  // 0: none
};

// Where a replay first differs from the first execution.
struct TraceDifference {
  int64_t micro = -1;  // -1: not an op (a gradient after the backward)
  int layer = -1;
  // "gemm_fwd 2", "gemm_bwd 0", "activation", "loss", "grad", or "wan" (a gradient that
  // differs after the WAN all-reduce though what the site sent did not)
  std::string op;
  std::string tensor;  // op "grad", "wan": the first tensor whose gradient differs ("shard": ZeRO)
  std::string run;     // the run the third one did not match: "first" or "replay"
};
// layout: the tensors SetGrads was given (names the differing gradient). Nothing when the two
// traces are identical.
std::optional<TraceDifference> FirstDifference(const StepTrace& first, const StepTrace& replay,
                                               const std::vector<ParamTensor>& layout);

// How many ranks of `site_world` say yes (1 without a site world). Collective over it.
StatusOr<int64_t> CountOnSite(Communicator* site_world, bool mine);

// Whether a step's events include one of the step guard's or the GEMM checksums' (what a replay
// is for; a fingerprint mismatch is state at rest, which a replay reproduces).
bool HasComputeAlarm(const std::vector<std::string>& events);
// Whether one of them is the detector's ("fingerprint", ...).
bool HasEvent(const std::vector<std::string>& events, std::string_view detector);
// Whether a memory check found state it could not repair (ZeRO moment shard, dp 1).
bool HasUnrepaired(const std::vector<std::string>& events);
// Whether every one of them is a memory check's that was repaired (the run is as if clean: not a
// reason for sdc.on_alarm = stop to end it).
bool OnlyRepaired(const std::vector<std::string>& events);

// The replay's verdict for the site, on every rank of `site_world` alike (collective over it):
// each rank's first difference (`mine`, nothing when its runs matched) as a "replay" event of
// step s (0-based), all-gathered. Where some rank's computation differed, the ranks whose only
// difference is a reduced gradient are dropped (they received it). No difference anywhere: one
// event with verdict "reproduced" (rank -1). The events as SdcEvent::ToJson writes them.
StatusOr<std::vector<std::string>> ShareReplays(Communicator* site_world, int site, int rank,
                                                int64_t s,
                                                const std::optional<TraceDifference>& mine);
// What an optimizer step changes, kept so that the step can be undone exactly.
class StepSnapshot {
 public:
  void Take(const float* params, size_t n, const AdamW& optimizer);
  void Restore(float* params, AdamW* optimizer) const;
  // Only the parameters (what a forward and backward pass reads).
  void RestoreParams(float* params) const;
  const std::vector<float>& params() const { return params_; }

 private:
  std::vector<float> params_, m_, v_;
  int64_t t_ = 0;
};

}  // namespace atl
