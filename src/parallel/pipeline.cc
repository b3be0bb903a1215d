#include "parallel/pipeline.h"

#include <fmt/format.h>

#include <algorithm>

namespace atl {

const char* PipeScheduleName(PipeScheduleKind k) {
  switch (k) {
    case PipeScheduleKind::kGPipe:
      return "gpipe";
    case PipeScheduleKind::k1F1B:
      return "1f1b";
  }
  return "?";
}

StatusOr<PipeScheduleKind> ParsePipeSchedule(const std::string& name) {
  for (PipeScheduleKind k : {PipeScheduleKind::kGPipe, PipeScheduleKind::k1F1B})
    if (name == PipeScheduleName(k)) return k;
  return Status::InvalidArgument(
      fmt::format("unknown pipeline schedule '{}' (choices: gpipe, 1f1b)", name));
}

namespace {

// Appends ops while assigning slots: the lowest free one at a forward, released at the backward.
class ScheduleBuilder {
 public:
  explicit ScheduleBuilder(int m) : slot_of_(size_t(m), -1) {}

  void Forward(int micro) {
    auto it = std::find(taken_.begin(), taken_.end(), false);
    const int slot = int(it - taken_.begin());
    if (it == taken_.end())
      taken_.push_back(true);
    else
      *it = true;
    slot_of_[size_t(micro)] = slot;
    ops_.push_back({PipeOp::kForward, micro, slot});
  }
  void Backward(int micro) {
    const int slot = slot_of_[size_t(micro)];
    taken_[size_t(slot)] = false;
    ops_.push_back({PipeOp::kBackward, micro, slot});
  }
  std::vector<PipeOp> Take() { return std::move(ops_); }

 private:
  std::vector<int> slot_of_;  // per micro-batch, while in flight
  std::vector<bool> taken_;   // per slot
  std::vector<PipeOp> ops_;
};

}  // namespace

std::vector<PipeOp> MakePipeSchedule(PipeScheduleKind kind, int pp, int stage, int m) {
  ScheduleBuilder b(m);
  switch (kind) {
    case PipeScheduleKind::kGPipe:
      for (int j = 0; j < m; ++j) b.Forward(j);
      // Reverse order: the last stage starts with the micro-batch whose forward it has just run,
      // and each stage above receives the gradients in that order.
      for (int j = m - 1; j >= 0; --j) b.Backward(j);
      break;
    case PipeScheduleKind::k1F1B: {
      // Warm-up fills the pipeline below this stage: the first backward reaches stage s only
      // after pp - s - 1 more forwards have gone down, so holding that many keeps the stage busy.
      const int warmup = std::min(pp - stage - 1, m);
      for (int j = 0; j < warmup; ++j) b.Forward(j);
      for (int j = 0; j + warmup < m; ++j) {
        b.Forward(j + warmup);
        b.Backward(j);
      }
      for (int j = m - warmup; j < m; ++j) b.Backward(j);
      break;
    }
  }
  return b.Take();
}

int SlotsUsed(const std::vector<PipeOp>& ops) {
  int n = 0;
  for (const PipeOp& op : ops) n = std::max(n, op.slot + 1);
  return n;
}

LayerRange StageLayers(int n_layer, int pp, int stage) {
  const int base = n_layer / pp, extra = n_layer % pp;
  const int begin = stage * base + std::min(stage, extra);
  return {begin, begin + base + (stage < extra ? 1 : 0)};
}

}  // namespace atl
