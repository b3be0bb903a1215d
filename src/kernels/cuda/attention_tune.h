// The tensor-core attention's block rows chosen by timing them on this GPU, at the shape a run
// uses (kernels/attention_blocks.h: every setting gives the same bits, so the choice changes how
// fast a run goes and nothing else, and a choice made by a timing cannot make two runs differ);
// and the attention's forward and backward at one shape as the model calls them, which the tuner
// and bench/kernels/attention.cc time.
//
// Plain C++ (no CUDA headers). Thread-safety: the process's GPU thread only (runtime.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/attention_blocks.h"
#include "kernels/cuda/runtime.h"

namespace atl::kernels::cuda {

// One attention's arrays on the GPU at B, T, C, NH (qkv [B, T, 3C] of normal draws, dout [B, T,
// C] of 0.1 times normal draws, from `seed`; the outputs uninitialized), and its forward and
// backward as GPT runs them.
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
  };
  // `warmup` forwards and backwards, then `steps` forwards back to back and `steps` backwards,
  // the GPU waited for before and after each run of calls (host clock): a call's mean.
  Timing Time(int steps, int warmup);

  const int B, T, C, NH;
  DeviceArray<float> qkv, dout, out, lse, dqkv;
  DeviceArray<uint16_t> out16, dqkv16, kept;
};

// What TuneAttentionBlockRows did.
struct AttentionTuning {
  struct Candidate {
    AttentionBlockRows rows;
    AttentionWork::Timing best;  // the setting's fastest forward and fastest backward
  };
  AttentionBlockRows rows;       // the setting in force after the call
  std::vector<Candidate> timed;  // in kAttentionBlockRowsAll's order; empty when none was timed
  std::string why_not;           // why none was, when none was
  // One line: "128/64, the fastest of 4 (forward + backward ms: 64/64 1.210, ...)", or "64/64
  // (not timed: <why_not>)".
  std::string Describe() const;
};

// Sets the block rows to the setting of kAttentionBlockRowsAll whose forward + backward at this
// shape is fastest (each setting's best forward and best backward over `rounds` rounds, the
// settings taken in turn within a round, each round `steps` calls after `warmup`), under the
// precision and backward kind set now, and says what it timed. Where the attention at this shape
// would not run on the tensor cores (AttentionKeptElements 0: float products, heads over 64, a
// GPU before sm_80), the block rows do not apply: nothing is timed and the setting is left as it
// is. The arrays it times on are freed before it returns.
// REQUIRES: B, T, NH > 0, C a multiple of NH; steps, rounds >= 1, warmup >= 0.
AttentionTuning TuneAttentionBlockRows(int B, int T, int C, int NH, int steps = 2, int warmup = 1,
                                       int rounds = 3);

}  // namespace atl::kernels::cuda
