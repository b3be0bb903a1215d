// The fault-injection campaign (`atoll sdc-campaign`, bench/sdc_bench.sh): many short training
// runs, each with one bit flip (train/sdc/faults.h) at a drawn injection site, bit, step and rank,
// scored against the flip's ground truth (the run's faults log) and a clean run of the same
// config. It answers: which flips do the detectors (train/sdc/monitor.h, audit.h) catch, how fast,
// do they name the right place, does the run recover bitwise, and do the flips they miss matter?
//
// Injection i (0-based) of `injections`: bit bits[i mod B] and site kinds[(i / B) mod K], so
// every (site, bit) pair is struck equally often when injections is a multiple of B * K; the step
// is drawn from [first_step, train.steps] and the rank from the site's ranks; layer, GEMM, element
// (and the moment, m or v) come from faults.seed = seed * 1000003 + i. Every run trains the same
// config (its sdc settings are the detectors under test; on_alarm = redo replays alarmed steps)
// in this process, ranks as threads (comm/inprocess.h) when the layout has more than one.
//
// Scoring one injection (Outcome):
//   - detected by a detector: one of its events (in metrics.jsonl) at the flip's step or later
//     that the clean run does not have at the same step (a genuine spike both runs see is not the
//     flip's); a replay counts when its verdict is "transient" (it found the corruption). Steps to
//     detection: the first such event's step minus the flip's.
//   - localized: an event names the flip's place: a replay or checksum event the flip's step,
//     rank, micro-batch, block and op (gemm_fwd g, gemm_bwd g, activation) or, for a gradient,
//     "grad" and the tensor; a fingerprint or memory event the rank and the tensor ("params:..."
//     or "moment_m:..."). The guard's events name signals, not places: they do not localize.
//   - recovered: the final parameters are bitwise those of the clean run (site 0's checkpoint;
//     with several sites, also every site's: their fingerprints, compared after every step, did
//     not differ after the last one).
//   - harm: |final validation loss / the clean run's - 1|; harmful above `harm` (0.1%). A run
//     that stopped (sdc.on_alarm = stop, a diverged or faulty-rank error) has harm +inf.
//   - false findings (FalseFindings): those of the clean runs (their metrics lines with events
//     are kept in DIR/clean_events.jsonl). Before its flip an injected run is the clean run bit for
//     bit: any finding there that the clean run lacks is counted in the outcome (it must be 0).
//   - stopped: the run ended with an error (a divergence two runs agreed on, a rank computing
//     three different results); counted apart. A detector's finding before the stop counts as
//     a detection (not recovered); a stop no detector saw is not counted as a miss.
//
// Thread-safety: RunCampaign uses the process (OpenMP threads, the working directory tree).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/status.h"
#include "train/config.h"
#include "train/sdc/faults.h"

namespace atl {

struct CampaignOptions {
  RunConfig cfg;                 // every run's config; faults.inject is set per injection
  std::vector<FaultKind> kinds;  // injection sites (not bad_core), in the order they are cycled
  std::vector<int> bits;         // the bits flipped, cycled (empty: 0..31)
  int64_t injections = 64;
  uint64_t seed = 1;
  int64_t first_step = 10;  // earliest step struck (1-based): past the guard's warm-up
  int64_t clean_steps = 0;  // a separate clean run of this many steps for false positives
  double harm = 1e-3;       // relative change of the final validation loss that is harmful
  std::string dir;          // work directory: injections.jsonl, bits.csv (runs are removed)
  // Called after each injection with (done, total, the outcome's one-line summary).
  std::function<void(int64_t, int64_t, const std::string&)> progress;
};

// Findings on clean steps, counted in steps: alarms (the guard flagged a step) and verdicts of
// corruption (a fingerprint mismatch, a checksum failure, a replay's "transient"). With
// on_alarm = redo an alarm whose replay reproduced the step was a genuine spike in the data: the
// run went on unchanged, at the price of one more execution of the step.
struct FalseFindings {
  int64_t alarm_steps = 0, reproduced = 0, verdict_steps = 0;
  void operator+=(const FalseFindings& o) {
    alarm_steps += o.alarm_steps;
    reproduced += o.reproduced;
    verdict_steps += o.verdict_steps;
  }
};

struct Outcome {
  std::string spec;  // what was asked (FormatSpec)
  FaultKind kind = FaultKind::kParam;
  int bit = 0;
  bool fired = false;
  FaultRecord truth{};  // when fired
  char moment = 0;      // kMoment: 'm' or 'v'
  std::string tensor;   // flat-buffer kinds: the tensor the element belongs to
  bool guard = false, fingerprint = false, checksum = false, memory = false;  // detected by
  bool replay = false;
  int64_t delay = -1;  // steps from the flip to its first detection (-1: none)
  bool localized = false;
  bool recovered = false;
  double harm = 0;
  FalseFindings false_findings;  // at steps before the flip's, not in the clean run (0)
  std::string error;             // the run stopped: why
  bool detected() const { return guard || fingerprint || checksum || memory || replay; }
  std::string ToJson() const;
};

struct CampaignResult {
  std::vector<Outcome> outcomes;
  double clean_val_loss = 0;
  int64_t clean_run_steps = 0;  // the clean runs' steps ...
  FalseFindings clean_run;      // ... and what was found in them
  double harm = 1e-3;
  int ranks = 1;
  int64_t dp = 1;  // data-parallel replicas (fingerprints need 2)
  bool zero = false;
  bool memory = true;  // sdc.memory
  std::string layout;  // "dp 2", "one process", ...
};

// Runs the campaign; bad options are kInvalidArgument (the config is checked as `atoll train`
// checks it). Each outcome is appended to DIR/injections.jsonl as it is scored.
StatusOr<CampaignResult> RunCampaign(const CampaignOptions& o);

// The tables (markdown): per injection site, per bit, and the goals' lines.
std::string CampaignTables(const CampaignResult& r);
// Detection rate per bit as CSV (bit,n,any,guard,fingerprint,checksum,memory,replay,
// harmful_misses), for plots.
std::string CampaignBitsCsv(const CampaignResult& r);

// "gemm_fwd,grad" -> kinds (bad_core is refused: the campaign injects one flip per run).
StatusOr<std::vector<FaultKind>> ParseFaultKinds(std::string_view list);
// "0-31", "23-31", "30,31" -> bits (ranges and single bits, comma-separated).
StatusOr<std::vector<int>> ParseBits(std::string_view list);

}  // namespace atl
