// Fault injection for silent-data-corruption experiments: flip one bit of one float where real
// hardware corrupts data without an error (a GEMM's output, an activation, a reduced gradient, a
// parameter or an optimizer moment in memory), once ("transient") or as a bad core that corrupts
// a rank's GEMMs with some probability every step ("persistent").
//
// A fault is written as KIND:KEY=VALUE,KEY=VALUE... and several are joined by ';' (config
// [faults] inject, or `atoll train --inject SPEC`, repeatable):
//   gemm_fwd     a forward GEMM product of block `layer` (gemm 0..3: attn.c_attn, attn.c_proj,
//                mlp.c_fc, mlp.c_proj; before the residual add), in micro-batch `micro`
//   gemm_bwd     the input gradient a backward GEMM computes (the same four GEMMs)
//   activation   block `layer`'s output (the residual stream) in micro-batch `micro`
//   grad         the gradient after the data-parallel reduction, before the norm and the step
//   param        a parameter in memory, at the start of the step (before its forward)
//   moment       an AdamW moment (moment=m or v) in memory, at the start of the step
//   bad_core     every GEMM product (forward and backward) of the rank is corrupted with
//                probability `p` per GEMM call, every step from `step` on (default 1). A flaky
//                core by default; `stuck=1`: a defective one, which corrupts the same GEMM of the
//                same micro-batch the same way every time it computes it (a replay on the rank
//                repeats the fault; only another rank's execution differs: train/sdc/peers.h)
//   wan          a payload the site's leader (rank 0) sends to another site over the WAN
//                transport, before the transport checksums it (world/wan.h WanPayloadFault),
//                so the receiver accepts it: the `chunk`-th data chunk (0-based) the site sends
//                from the start of step `step`'s WAN work on (AtWan: after its backward pass).
//                sync: the step's gradient all-reduce first,
//                a ring of 1 MiB chunks: the first half of them the reduce-scatter (its sums
//                reach every site), the second half the all-gather (with two sites only the
//                receiver takes them); then the losses', then the detectors'. Unset, chunk is drawn
//                among the gradient all-reduce's (set_wan_chunks; SyncWanChunksPerStep). diloco,
//                streaming: the exchange after the step (drawn in 0..3). Needs the WAN transport
//                (`atoll launch`, or tests that connect real endpoints).
// Keys: step (1-based, the step whose computation is corrupted; required except for bad_core),
// site (0), rank (0: the rank within the site), layer, gemm, micro (the micro-batch's index in the
// whole batch; default: the rank's first), elem (the element of the target buffer, taken modulo
// its size), bit (0..31: 31 is the sign, 23..30 the exponent, 0..22 the mantissa), moment (m, v),
// p, stuck (bad_core), chunk (wan). `elem` of wan indexes the chunk's 32-bit words (a float32 with
// codec none). Unset layer, gemm, elem and bit are drawn from [faults] seed, so a campaign names
// only the kind and the step. `elem` of grad, param and moment indexes this rank's flat buffer (its
// shard's layout); of a GEMM or activation, the row-major output of the micro-batch.
//
// layer, gemm and micro also narrow a bad_core (a core that corrupts only one GEMM of one block).
// Draws are keyed by (faults.seed, the spec's place in the whole list, site, rank), so two ranks
// named by two specs flip different elements, and adding a spec moves no other spec's draws.
// A drawn layer is one this rank holds (pipeline parallel: its stage's blocks).
//
// On an audit replay of a step (train/sdc/audit.h) a transient fault does not fire again (it
// struck once), and a bad core draws afresh (its coins and elements are counted through the
// step's GEMM calls, which the replay continues): what a flaky core does. A stuck one keys them
// by the micro-batch and the GEMM instead, and strikes the replay as it struck the first run.
//
// Every fault that fires is logged (LogWarning) and appended to the rank's log (DIR/faults.jsonl
// for rank 0, DIR/faults-rank<r>.jsonl for the others; train/run.h's SetUpSdc removes it at the
// start of a fresh run) as one JSON object: kind, step, site, rank, micro, layer, gemm, elem,
// bit, before, after (non-finite values as strings), bits_before, bits_after (hex). Faults stay
// in the run's saved config: a resumed run keeps its bad cores (a transient fault of an earlier
// step does not fire again).
//
// Thread-safety: a FaultInjector belongs to its rank's training thread, except OnWanPayload,
// which the WAN transport's sender threads call.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl {

enum class FaultKind {
  kGemmForward,
  kGemmBackward,
  kActivation,
  kGrad,
  kParam,
  kMoment,
  kBadCore,
  kWan
};

struct FaultSpec {
  FaultKind kind = FaultKind::kParam;
  int64_t step = 0;  // 1-based; bad_core: the first step it corrupts
  int site = 0;
  int rank = 0;
  int layer = -1;      // -1: drawn
  int gemm = -1;       // -1: drawn
  int64_t micro = -1;  // -1: the rank's first micro-batch of the step
  int64_t elem = -1;   // -1: drawn
  int bit = -1;        // -1: drawn
  char moment = 'm';   // 'm' or 'v'
  double p = 0;        // bad_core: probability per GEMM call
  bool stuck = false;  // bad_core: the same corruption whenever it computes the same thing
  int64_t chunk = -1;  // wan: the data chunk of the step (-1: drawn in 0..3)
};

const char* FaultKindName(FaultKind k);
// How events name a traced op of kind k (kGemmForward, kGemmBackward, kActivation): "gemm_fwd 2",
// "gemm_bwd 0", "activation".
std::string OpName(FaultKind k, int gemm);

// Parses `text` (specs joined by ';'; empty: none). Errors are kInvalidArgument naming the spec
// and the key ("faults.inject: 'param:step=x': step: expected an integer").
StatusOr<std::vector<FaultSpec>> ParseFaults(std::string_view text);

// Where a fault struck: the ground truth a detector's report is compared with.
struct FaultRecord {
  FaultKind kind;
  int64_t step;
  int site, rank;
  int64_t micro;
  int layer, gemm;
  int64_t elem;
  int bit;
  float before, after;
  int64_t chunk = -1;  // wan: the chunk of the step, and the site it went to
  int to_site = -1;
};

// The spec as text (what Unfired reports).
std::string FormatSpec(const FaultSpec& f);

// Flips `bit` of *x; returns the old value.
float FlipBit(float* x, int bit);

class FaultInjector {
 public:
  // The faults that apply to (site, rank); `n_layer` bounds the drawn layers; `seed` keys every
  // draw. `log_path` (may be empty) receives a JSON line per fault that fires.
  FaultInjector(const std::vector<FaultSpec>& specs, uint64_t seed, int site, int rank,
                int layer_begin, int layer_end, std::string log_path);
  ~FaultInjector();
  FaultInjector(const FaultInjector&) = delete;
  FaultInjector& operator=(const FaultInjector&) = delete;

  bool empty() const { return specs_.empty(); }

  // The computation the next hook calls belong to: step s (0-based, as the loop counts) and the
  // micro-batch j (its index in the whole batch), forward or backward.
  void At(int64_t s, int64_t micro);
  // The model's op hook (GPT::set_op_hook): a forward GEMM product, a backward one, or a block's
  // output (kind: kGemmForward, kGemmBackward or kActivation).
  void OnOp(FaultKind kind, int layer, int gemm, float* out, size_t n);
  // A flat buffer of kind kGrad, kParam or kMoment ('m' / 'v' for moments) at step s (0-based).
  void OnBuffer(FaultKind kind, int64_t s, float* data, size_t n, char moment = 0);
  // Step s's WAN work begins (after its backward pass): wan faults count their chunks from here.
  void AtWan(int64_t s);
  // The WAN transport's payload fault (world/wan.h WanPayloadFault): a data chunk to `to_site`,
  // sent during the step At last named. Any thread.
  void OnWanPayload(int to_site, std::string* payload);
  // Whether a wan fault is among this rank's.
  bool has_wan() const;
  // How many chunks a drawn wan chunk is drawn among (default 4).
  void set_wan_chunks(int64_t n) { wan_chunks_per_step_ = std::max<int64_t>(1, n); }

  const std::vector<FaultRecord>& fired() const { return fired_; }
  // The transient faults of this rank that have not fired (at the end of a run: a micro-batch
  // or layer the rank never computed), as their specs' text.
  // Faults of steps before first_step (0-based; a resumed run's start) are not counted.
  std::vector<std::string> Unfired(int64_t first_step = 0) const;

 private:
  // A draw below n for spec i's slot (layer, gemm, bit, elem, the bad core's coin) at the current
  // step; call: the bad core's GEMM call within the step (0 otherwise).
  uint64_t Draw(size_t i, uint64_t slot, uint64_t call, uint64_t n) const;
  double Coin(size_t i, uint64_t call) const;
  void Fire(size_t i, uint64_t call, float* data, size_t n, int layer, int gemm, int64_t chunk = -1,
            int to_site = -1);

  std::vector<FaultSpec> specs_;  // this rank's
  std::vector<size_t> index_;     // ... their places in the whole list
  std::vector<uint8_t> done_;     // transient faults fire once (a byte each: two threads)
  uint64_t seed_;
  int site_, rank_, layer_begin_, layer_end_;
  std::atomic<int64_t> step_{-1}, micro_{-1};  // read by OnWanPayload's thread
  uint64_t op_calls_ = 0;                      // bad core: the draw's counter within the step
  int64_t wan_step_ = -1, wan_chunks_ = 0;     // AtWan's step, and its chunks so far (mu_)
  int64_t wan_chunks_per_step_ = 4;            // a drawn chunk is below this
  std::mutex mu_;                              // Fire's record and log; OnWanPayload
  std::string log_path_;
  std::FILE* log_ = nullptr;
  std::vector<FaultRecord> fired_;
};

}  // namespace atl
