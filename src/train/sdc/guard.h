// The step guard: is this step's loss, gradient norm, update size or activation size out of line
// with the recent clean steps? A silent-data-corruption detector that needs no replica and no
// replay (train/sdc/faults.h injects what it should catch).
//
// Signals are positive magnitudes (a loss, a norm, an RMS, a max |x|), judged on a log scale, so
// a value ten times too large and one ten times too small are equally far. Each named signal keeps
// the logs of its values over the last `window` steps that passed. A new value is an outlier when
// it is not finite, or when
//     |log x - median| > threshold * max(1.4826 * MAD, log_floor)
// (MAD: the median absolute deviation from the median; 1.4826 * MAD estimates the standard
// deviation of normal noise; the floor keeps a nearly flat history, whose MAD is ~0, from calling
// every small drift an outlier: at the defaults nothing within a factor of 2 of the median is one,
// and the guard is for the changes of magnitude that exponent flips make). A value <= 0 counts as
// 1e-300. Until a signal has `warmup` values only non-finite values are outliers (warmup is at
// most the window). An outlier is not added to its signal's history (a corrupted step must not
// teach the guard that corruption is normal; the step's other signals are added); Accept adds
// values of a step found clean. A signal that is an outlier `shift_after` times in a row has moved
// to a new level: its history restarts from those values (and warms up again), so a genuine shift
// raises a few alarms, not one every step after.
//
// Thread-safety: a StepGuard belongs to one thread.
#pragma once

#include <cstddef>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace atl {

class StepGuard {
 public:
  struct Options {
    size_t window = 32;
    size_t warmup = 8;
    double threshold = 10;      // in robust standard deviations
    double log_floor = 0.0693;  // ln 2 / 10: at threshold 10, nothing within 2x is an outlier
    size_t shift_after = 3;     // outliers in a row that make a signal's new level
  };
  struct Signal {
    std::string name;
    double value;
  };
  struct Outlier {
    std::string name;
    double value;       // as given
    double median;      // of the history (0 when value is not finite)
    double deviations;  // |log value - log median| / the robust scale (0 when not finite)
  };

  StepGuard() : StepGuard(Options{}) {}
  explicit StepGuard(Options o) : o_(o) {}

  // The outliers among this step's signals (empty: nothing suspicious). The other values are
  // added to their histories.
  std::vector<Outlier> Check(const std::vector<Signal>& step);
  // Adds these values to their signals' histories (the flagged signals of a step found clean
  // after an alarm).
  void Accept(const std::vector<Signal>& step);

  // The median of v (a copy is partially sorted); NaN when empty.
  static double Median(std::vector<double> v);

 private:
  struct History {
    std::deque<double> values;
    std::vector<double> outliers;  // in a row, not (yet) in values
  };
  void Add(History& h, double v) const;

  Options o_;
  std::map<std::string, History> history_;
};

}  // namespace atl
