// Pipeline-parallel schedules: the order in which one stage runs the forward and backward passes
// of the micro-batches of a step.
//
// GPipe: every micro-batch's forward, then every backward in reverse order (m activations held).
// 1F1B (PipeDream-Flush, Megatron's default): stage s runs min(pp - s - 1, m) warm-up forwards,
// then alternates one forward, one backward, then drains the remaining backwards; at most
// min(pp - s, m) micro-batches' activations are held at once.
//
// Each op names an activation slot: the forward of a micro-batch stores its activations in a slot,
// which stays taken until that micro-batch's backward. Slots are the lowest free index at each
// forward, so slots used = the peak number of micro-batches in flight on the stage.
//
// Both schedules are valid for the pipeline: run on every stage with blocking receives and
// non-blocking sends (forward: receive the input from stage s - 1, send the output to s + 1;
// backward: receive the output's gradient from s + 1, send the input's gradient to s - 1), they
// complete without deadlock.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"

namespace atl {

enum class PipeScheduleKind { kGPipe, k1F1B };

// "gpipe", "1f1b".
const char* PipeScheduleName(PipeScheduleKind k);
// Parses "gpipe" / "1f1b" (case-sensitive); InvalidArgument naming the choices otherwise.
StatusOr<PipeScheduleKind> ParsePipeSchedule(const std::string& name);

struct PipeOp {
  enum Kind { kForward, kBackward };
  Kind kind;
  int micro;  // micro-batch index in [0, m), in the step's global order of this replica
  int slot;   // activation slot
  bool operator==(const PipeOp&) const = default;
};

// The ops of `stage` (0-based, < pp) for m micro-batches: every micro-batch's forward and backward
// once, a forward before its backward. REQUIRES: pp >= 1, 0 <= stage < pp, m >= 1.
std::vector<PipeOp> MakePipeSchedule(PipeScheduleKind kind, int pp, int stage, int m);

// 1 + the largest slot index in ops (0 for no ops).
int SlotsUsed(const std::vector<PipeOp>& ops);

// The transformer blocks of `stage`: [begin, end), the n_layer blocks split as evenly as
// possible, earlier stages taking one more when they do not divide. REQUIRES: n_layer >= pp.
struct LayerRange {
  int begin, end;
};
LayerRange StageLayers(int n_layer, int pp, int stage);

}  // namespace atl
