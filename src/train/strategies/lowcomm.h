// DiLoCo ("diloco"; arXiv 2311.08105) and Streaming DiLoCo ("streaming"; 2501.18512) on a site's
// leader: when each fragment is exchanged, the outer step, the merge, and the state a rejoining
// process takes over.
//
// Every site trains its own replica with its inner optimizer (AdamW, the trainer's), on its share
// of each step's batch. The parameters are cut into P fragments (train/strategies/fragments.h;
// diloco: P = 1, the whole model). Fragment p is sent after inner steps c = off_p, off_p + H,
// off_p + 2H, ... with off_p = (p + 1) * H / P (a staggered schedule: one fragment every H / P
// steps, each every H steps). Sending fragment p: its pseudo-gradient delta = global_p - local_p
// (global_p: the fragment's parameters after its last outer step, the same on every site) is
// averaged over the live sites (world/exchange.h, quantized with world.codec and error feedback)
// on a background thread while training goes on; after tau more inner steps
// (streaming.overlap_steps; diloco: 0) the average is merged (train/strategies/outer.h):
//     outer Nesterov:  m = mu * m + avg;  global_p -= outer_lr * (avg + mu * m)
//     merge:           local_p = alpha * local_p + (1 - alpha) * global_p   (diloco: alpha = 0)
// The inner optimizer's state is kept. The exchange's commit round carries a digest of the new
// global_p and momentum (computed from the average before anything is committed), so sites whose
// arithmetic disagrees are caught, not trusted. At the end (unless diloco's last exchange was at
// the last step) a final exchange of the whole vector is a plain average: every site's parameters
// become global - mean(delta), the mean of the sites' replicas (no outer step, momentum untouched).
// Peak WAN traffic is one fragment, and with tau > 0 the inner steps never wait for the WAN
// unless an exchange takes longer than tau steps.
//
// These run on the site leader; the site's other ranks follow the same schedule (Merges) and
// take the changed ranges by broadcast inside the site (train/strategies/lowcomm_strategy.cc).
//
// Thread-safety: one thread calls each object; LowCommSync runs its exchanges on its own thread.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "train/strategies/fragments.h"
#include "world/exchange.h"

namespace atl {

struct LowCommOptions {
  // The fragments in schedule order (P = fragments.size()); empty: the whole buffer (DiLoCo).
  std::vector<Fragment> fragments;
  int64_t inner_steps = 1;  // H
  int64_t overlap = 0;      // tau
  float alpha = 0.0f;
  float outer_lr = 0.7f, outer_momentum = 0.9f;
  int64_t total_steps = 0;  // the run's last step (train.steps)
  bool final_sync = true;   // the final whole-vector exchange (see above)
};

// Rejoins (diloco, streaming): what a new process needs to take over a site that was lost, taken
// on a live site's leader at a quiet point, when no exchange is in flight (DiLoCo: right after
// its outer step; streaming: after a merge that left none pending, which needs tau < H / P). The
// global parameters and outer momentum are the same on every site; params is the taking site's
// replica (DiLoCo: equal to global). The newcomer starts its inner optimizer afresh (AdamW
// moments zero) and its error feedback at zero, trains from step completed + 1, and takes part
// from exchange `rounds` on.
//
// Resume (a checkpoint's per-site state, train/strategies/lowcomm_strategy.cc): the same at any
// step with no exchange in flight, plus the error feedback and the inner optimizer, so a
// resumed run goes on bitwise.
struct LowCommState {
  int64_t completed = 0;  // inner steps done
  int64_t rounds = 0;     // exchanges started: the next one's round
  int64_t exchanges = 0;  // exchanges merged
  std::vector<float> global, momentum, params;
  // Resume only (empty in a rejoin's): the error feedback (n), the inner AdamW's moments (n each)
  // and update count.
  std::vector<float> residual, adam_m, adam_v;
  int64_t adam_steps = 0;
};
// Bytes: "ATLR", u32 version (1: a rejoin's, 2: with the resume fields), u64 n, i64 completed,
// rounds, exchanges (little-endian), then global, momentum and params as n float32 each; version
// 2: i64 adam_steps, then residual, adam_m and adam_v as n float32 each. Decode checks every
// size (kCorruption) and n against the model's (kInvalidArgument: another model).
std::string EncodeLowCommState(const LowCommState& state);
StatusOr<LowCommState> DecodeLowCommState(std::string_view bytes, size_t n);

class LowCommSync {
 public:
  // SiteExchange::Average on the leader: averages data over the live sites with error feedback
  // (residual), committing only when every site's digest of the result agrees.
  // pace: this site's seconds per micro-batch (SetPace), voted in the commit round.
  using Average = AverageFn;
  // params: the initial parameters (n floats, identical on every site).
  LowCommSync(LowCommOptions options, Average average, const float* params, size_t n);
  ~LowCommSync();  // waits for an exchange still running

  // The fragments sent / merged after inner step `completed` (1-based), by schedule alone:
  // every rank of a site can call them.
  std::vector<int> Sends(int64_t completed) const;
  std::vector<int> Merges(int64_t completed) const;
  const std::vector<Fragment>& fragments() const { return fragments_; }
  // The step after which exchange `round` (0-based, in start order) starts by the schedule, or
  // -1 when the schedule has no such exchange before the run's last step (the final exchange
  // of Finish is not counted).
  int64_t StepOfExchange(int64_t round) const;

  // After inner step `completed` on the leader: merges the fragments due (waiting for their
  // exchanges), then starts the exchanges due. params: the local parameters (n floats).
  Status AfterStep(int64_t completed, float* params);
  // After the last step: merges what is pending and, with final_sync, runs the final exchange.
  // Every site's params are then the same.
  Status Finish(float* params);

  // The state for a rejoin after AfterStep(completed) when that call merged an exchange and
  // none is pending (before the last step); null otherwise. params: the local parameters.
  std::shared_ptr<const std::string> QuietState(int64_t completed, const float* params) const;
  // Takes the state over (a rejoining site's leader, before its first step); the caller sets
  // the local parameters to state.params. With state.residual (a resume): the error feedback too.
  void Restore(const LowCommState& state);
  // The state for a resume after step `completed`, with the error feedback (the caller adds the
  // inner optimizer's); null while an exchange is in flight (streaming between a send and its
  // merge). params: the local parameters.
  std::unique_ptr<LowCommState> ResumeState(int64_t completed, const float* params) const;

  uint64_t bytes_sent() const { return bytes_sent_; }
  int64_t rounds() const { return rounds_; }  // exchanges started (the next one's round)
  int64_t exchanges() const { return completed_; }
  double last_wait_s() const { return last_wait_s_; }  // blocked in the last call
  const std::vector<int>& last_sites() const { return last_sites_; }
  // world.balance: this site's seconds per micro-batch, voted with in the exchanges started from
  // now on; and the paces by site the last merged exchange's sites voted with (empty: none yet).
  void SetPace(double seconds_per_micro) { pace_ = seconds_per_micro; }
  const std::vector<double>& last_paces() const { return last_paces_; }

 private:
  // One exchange, from its start to its merge. The vectors are packed: the fragment's elements
  // range by range.
  struct Pending {
    int fragment = 0;  // -1: the final whole-vector exchange
    int64_t merge_at = 0;
    std::vector<float> delta;     // sent: the pseudo-gradient; received: the average
    std::vector<float> residual;  // the fragment's error feedback, written back at the merge
    // The global parameters and momentum the average leads to, computed (on the exchange's
    // thread) for the commit round's digest and taken at the merge.
    std::vector<float> new_global, new_momentum;
    std::future<StatusOr<ExchangeResult>> result;
  };
  const Fragment& FragmentOf(int fragment) const;
  void Start(int fragment, int64_t merge_at, const float* params);
  // The outer step (or the final average) that `mean` leads to: p.new_global, p.new_momentum.
  void Outcome(Pending& p, std::span<const float> mean) const;
  // What the sites compare in the commit round: XXH3 of p's new global parameters and momentum.
  static uint64_t DigestOf(const Pending& p);
  Status Merge(Pending& p, float* params, float alpha);

  LowCommOptions options_;
  Average average_;
  size_t n_;
  std::vector<Fragment> fragments_;
  Fragment whole_;
  std::vector<float> global_, momentum_, residual_;
  std::vector<std::unique_ptr<Pending>> pending_;  // in start order
  std::shared_future<void> previous_;              // the last exchange started (they run in order)
  int64_t rounds_ = 0, completed_ = 0;
  bool merged_ = false;  // the last AfterStep merged an exchange
  uint64_t bytes_sent_ = 0;
  double last_wait_s_ = 0;
  std::vector<int> last_sites_;
  double pace_ = 0;
  std::vector<double> last_paces_;
};

}  // namespace atl
