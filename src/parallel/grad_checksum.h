// Checksums carried through the data-parallel gradient reduction (sdc.checksums; the detector is
// train/sdc/monitor.h's): algorithm-based fault tolerance for the sum the replicas form, and for
// the reduced gradient up to the moment the optimizer reads it.
//
// The local gradient buffer [0, n) is cut into segments of `chunk` elements, and at `cuts` (the
// buckets' edges, and with ZeRO every replica's owned pieces' edges, so that each piece is whole
// segments). Before a bucket's reduction starts, each replica records per segment the sum and the
// sum of magnitudes of its own contribution (Predict, in double; in the reproducible mode
// PredictFixed reads the int64 accumulator, exactly). Reduce sums those records over the
// replicas: 16 bytes a segment, 1/256 of the gradient's bytes at 1024 elements. Check then reads
// the reduced gradient where the optimizer will read it and compares each segment's sum with the
// prediction:
//     |Σ_i x_i - P| <= 2·(max(D - 1, 1)·u + 2⁻⁴⁵)·A + n·D·2⁻¹²⁶
// with P and A the predicted sum and magnitude sum, D the replicas and u = 2⁻²⁴: a float sum of
// D terms is within (D - 1)·u·Σ|terms| of the exact one in any order, a fixed-point conversion
// within u·|x|, and the double sums' own error is far below the 2⁻⁴⁵ term (the last term covers
// flushed subnormals; the factor 2 is margin). What it sees: a replica's reduction arithmetic
// gone wrong, a corrupted transfer, and any change of the reduced gradient in memory before the
// update (in one process, with nothing to reduce, the last alone). What it cannot see: a fault
// before the prediction (the backward's weight-gradient GEMMs, whose result every replica sums
// in alike; the replay's to find), or a flip smaller than the bound: an element far below its
// segment's typical magnitude, or a low mantissa bit.
//
// Thread-safety: one thread (the rank's), like the GradientReducer that feeds it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace atl {

// Elements per segment, as the trainer cuts them.
inline constexpr size_t kGradChecksumChunk = 1024;

class GradChecksum {
 public:
  // n: the local buffer's length; cuts: segment edges besides the multiples of chunk (any order,
  // values beyond n ignored). Every replica must pass the same (the records are summed by index).
  GradChecksum(size_t n, size_t chunk, std::vector<size_t> cuts);

  size_t size() const { return n_; }
  size_t segments() const { return bounds_.size() - 1; }

  // A step starts: no contribution recorded.
  void Begin();
  // This replica's contribution to [begin, end) (segment edges; g[0] is element 0).
  void Predict(const float* g, size_t begin, size_t end);
  // The same from a fixed-point accumulator: acc[0] is element `begin`, a unit is `unit`.
  void PredictFixed(const int64_t* acc, size_t begin, size_t end, double unit);
  // Sums the records over the data-parallel group (null or size 1: nothing). Collective.
  Status Reduce(Communicator* dp);
  // The records themselves (per segment: sum, magnitude sum), for a caller that sums them over
  // more replicas with the gradient (sync sites over the WAN).
  std::span<double> records() { return records_; }

  struct Mismatch {
    size_t begin = 0, end = 0;  // the first failing segment (local offsets)
    double got = 0, expected = 0, bound = 0;
    int64_t count = 0;  // failing segments; 0: none
  };
  // Compares the reduced gradient of [begin, end) (segment edges; x[0] is element `begin`), a sum
  // over `replicas`, with the records; failures are added to *out (the first one kept).
  void Check(const float* x, size_t begin, size_t end, int replicas, Mismatch* out) const;

  // Seconds spent in Predict, PredictFixed and Check so far (the detector's cost).
  double seconds() const { return seconds_; }

 private:
  // The segment that starts at `offset` (an edge).
  size_t SegmentAt(size_t offset) const;
  // Adds value(i) for i in [begin, end) (segment edges) to the segments' records.
  template <typename Value>
  void Record(size_t begin, size_t end, Value value);
  size_t n_;
  std::vector<size_t> bounds_;   // segment edges, 0 ... n
  std::vector<double> records_;  // per segment: sum, magnitude sum
  mutable double seconds_ = 0;
};

}  // namespace atl
