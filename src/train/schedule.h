// The learning-rate schedule: linear warmup, then cosine decay to min_lr.
//
//   step < warmup:  lr * (step + 1) / warmup          (the first step already moves; step
//                                                       warmup - 1 reaches lr)
//   step >= warmup: min_lr + (lr - min_lr) * (1 + cos(pi * r)) / 2,
//                   r = (step - warmup) / (steps - 1 - warmup)   (r = 0 when steps - 1 == warmup)
//
// so the first step after warmup runs at lr and the last step (steps - 1) runs at exactly
// min_lr. Computed in double; a pure function of the step, so a resumed run follows the same
// schedule bit for bit.
//
// Thread-safety: pure function.
#pragma once

#include <cstdint>

#include "train/config.h"

namespace atl {

// REQUIRES: 0 <= step < t.steps, t validated.
double LearningRate(const TrainConfig& t, int64_t step);

}  // namespace atl
