#include "train/schedule.h"

#include <cmath>

namespace atl {

double LearningRate(const TrainConfig& t, int64_t step) {
  if (step < t.warmup_steps) return t.lr * double(step + 1) / double(t.warmup_steps);
  const int64_t decay_steps = t.steps - 1 - t.warmup_steps;
  if (decay_steps <= 0) return t.lr;
  const double r = std::min(1.0, double(step - t.warmup_steps) / double(decay_steps));
  return t.min_lr + (t.lr - t.min_lr) * 0.5 * (1.0 + std::cos(M_PI * r));
}

}  // namespace atl
