// The tensor-core attention's block rows timed on this GPU at the shape a run uses
// (kernels/attention_blocks.h: every setting gives the same bits, so which one runs changes how
// fast a run goes and nothing else, and a choice made by a timing cannot make two runs differ;
// ChooseAttentionBlockRows there picks from the times); and the attention's forward and backward
// at one shape as the model calls them, which the timing and bench/kernels/attention.cc run.
//
// Plain C++ (no CUDA headers). Thread-safety: the process's GPU thread only (runtime.h).
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_blocks.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {

// One attention's arrays on the GPU at B, T, C, NH (qkv [B, T, 3C] of normal draws, dout [B, T,
// C] of 0.1 times normal draws, from `seed`: a block of up to 2^20 draws, repeated, so that large
// shapes cost no more host time; the outputs uninitialized), and its forward and backward as GPT
// runs them.
class AttentionWork {
 public:
  AttentionWork(int B, int T, int C, int NH, uint32_t seed = 7);

  // AttentionForward: out, lse and out's bf16 copy written; on the tensor cores Q, K, V kept.
  void Forward();
  // AttentionBackward of the last Forward, with the operands it kept: dqkv and its bf16 copy
  // written (GradInto::kWrite).
  void Backward();

  struct Timing {
    double forward_s = 0, backward_s = 0;  // a call
    double total() const { return forward_s + backward_s; }
    // The faster forward and the faster backward of a and b (each setting's best over rounds).
    static Timing Fastest(const Timing& a, const Timing& b) {
      return {std::min(a.forward_s, b.forward_s), std::min(a.backward_s, b.backward_s)};
    }
  };
  // `warmup` forwards and backwards, then `steps` forwards back to back and `steps` backwards,
  // the GPU waited for before and after each run of calls (host clock): a call's mean.
  Timing Time(int steps, int warmup);

  const int B, T, C, NH;
  DeviceArray<float> qkv, dout, out, lse, dqkv;
  DeviceArray<uint16_t> out16, dqkv16, kept;
};

// How TimeAttentionBlockRows times.
struct AttentionTimingOptions {
  // First, forwards and backwards until this long has passed (at least one, at most 200 calls):
  // the GPU's clocks up from idle, so that the first setting timed is not the slowest for it.
  double warmup_s = 0.05;
  // Calls a measurement: at least this many, and as many as make target_s at the warm-up's pace
  // (up to 64): host clock and waits stay a small part of what is measured.
  int min_steps = 2;
  double target_s = 0.003;
  // Rounds, each timing every setting once, starting one setting later each round (no setting
  // always first); each setting keeps its fastest forward and its fastest backward.
  int rounds = 3;
};

// What TimeAttentionBlockRows measured.
struct AttentionTimings {
  struct Candidate {
    AttentionBlockRows rows;
    AttentionWork::Timing best;
  };
  std::vector<Candidate> timed;  // in kAttentionBlockRowsAll's order; empty when none was timed
  std::string why_not;           // why none was, when none was
  // Forward + backward seconds of each, in kAttentionBlockRowsAll's order
  // (ChooseAttentionBlockRows).
  std::vector<double> Totals() const;
};

// Times a forward and a backward at this shape under each setting of kAttentionBlockRowsAll,
// with the precision and backward kind set now, and leaves the block rows as it found them.
// Where the attention at this shape would not run on the tensor cores (AttentionKeptElements 0:
// float products, heads over 64, a GPU before sm_80) the rows do not apply: nothing is timed.
// The arrays it times on are freed before it returns.
// REQUIRES: B, T, NH > 0, C a multiple of NH; options' counts >= 1.
AttentionTimings TimeAttentionBlockRows(int B, int T, int C, int NH,
                                        const AttentionTimingOptions& options = {});

}  // namespace atl::kernels::cuda
