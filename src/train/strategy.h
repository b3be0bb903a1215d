// How the sites of a world agree when they do not all-reduce every step (world.strategy):
//
// DiLoCo ("diloco"; arXiv 2311.08105) and Streaming DiLoCo ("streaming"; 2501.18512): every site
// trains its own replica with its inner optimizer (AdamW, the trainer's), on its share of each
// step's batch (the same share as sync, so all strategies see the same tokens). The parameters
// are cut into P contiguous fragments of the flat buffer (diloco: P = 1). Fragment p is sent
// after inner steps c = off_p, off_p + H, off_p + 2H, ... with off_p = (p + 1) * H / P (a
// staggered schedule: one fragment every H / P steps, each every H steps). Sending fragment p:
// its pseudo-gradient delta = global_p - local_p (global_p: the fragment's parameters after its
// last outer step, the same on every site) is averaged over the live sites (world/exchange.h,
// quantized with world.codec and error feedback) on a background thread while training goes on;
// after tau more inner steps (streaming.overlap_steps; diloco: 0) the average is merged:
//     outer Nesterov:  m = mu * m + avg;  global_p -= outer_lr * (avg + mu * m)
//     merge:           local_p = alpha * local_p + (1 - alpha) * global_p   (diloco: alpha = 0)
// The inner optimizer's state is kept. At the end (unless diloco's last exchange was at the last
// step) a final exchange of the whole vector with alpha = 0 leaves every site with the same
// parameters, which site 0 checkpoints. Peak WAN traffic is one fragment, 1/P of the model, and
// with tau > 0 the inner steps never wait for the WAN unless an exchange takes longer than tau
// steps.
//
// Async ("async"): each site leader pushes its progress every H inner steps to the parameter
// server (world/ps.h; hosted by the coordinator): update = local - base (base: the parameters it
// last pulled), encoded with world.codec and error feedback, applied with weight 1 / sites if it
// is at most world.async.max_staleness versions behind, then pulls the current parameters and goes
// on from them (its AdamW state kept). No barrier but one at the end (every live site's last push
// is in), after which every site pulls the final parameters. The server logs every decision, so
// `atoll replay` re-executes the run bitwise (train/replay.h).
//
// These classes run on the site leader; the site's other ranks follow the same schedule
// (Merges / pull steps) and take the changed ranges by broadcast inside the site.
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
#include "world/codec.h"
#include "world/exchange.h"
#include "world/ps.h"

namespace atl {

// One outer Nesterov step per element (PyTorch SGD, nesterov=True, dampening 0):
// m = mu * m + d; global -= lr * (d + mu * m).
void OuterNesterov(std::span<float> global, std::span<const float> d, std::span<float> momentum,
                   float lr, float mu);

struct Range {
  size_t begin = 0, end = 0;
};
// n elements cut into `parts` contiguous ranges, sizes as even as possible (the first n % parts
// one larger).
std::vector<Range> SplitEvenly(size_t n, int parts);

struct LowCommOptions {
  int fragments = 1;        // P
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
struct LowCommState {
  int64_t completed = 0;  // inner steps done
  int64_t rounds = 0;     // exchanges started: the next one's round
  int64_t exchanges = 0;  // exchanges merged
  std::vector<float> global, momentum, params;
};
// Bytes: "ATLR", u32 version 1, u64 n, i64 completed, rounds, exchanges (little-endian), then
// global, momentum and params as n float32 each. Decode checks every size (kCorruption) and n
// against the model's (kInvalidArgument: another model).
std::string EncodeLowCommState(const LowCommState& state);
StatusOr<LowCommState> DecodeLowCommState(std::string_view bytes, size_t n);

class LowCommSync {
 public:
  using Average =
      std::function<StatusOr<ExchangeResult>(int64_t round, std::span<float>, std::span<float>)>;
  // params: the initial parameters (n floats, identical on every site). average: the exchange
  // (SiteExchange::Average on the leader).
  LowCommSync(const LowCommOptions& options, Average average, const float* params, size_t n);
  ~LowCommSync();  // waits for an exchange still running

  // The fragments sent / merged after inner step `completed` (1-based), by schedule alone:
  // every rank of a site can call them.
  std::vector<int> Sends(int64_t completed) const;
  std::vector<int> Merges(int64_t completed) const;
  const std::vector<Range>& fragments() const { return fragments_; }
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
  // the local parameters to state.params.
  void Restore(const LowCommState& state);

  uint64_t bytes_sent() const { return bytes_sent_; }
  int64_t rounds() const { return rounds_; }  // exchanges started (the next one's round)
  int64_t exchanges() const { return completed_; }
  double last_wait_s() const { return last_wait_s_; }  // blocked in the last call
  const std::vector<int>& last_sites() const { return last_sites_; }

 private:
  struct Pending {
    int fragment = 0;
    int64_t merge_at = 0;
    std::vector<float> delta;  // sent: the pseudo-gradient; received: the average
    std::future<StatusOr<ExchangeResult>> result;
  };
  void Start(int fragment, int64_t merge_at, const float* params);
  Status Merge(Pending& p, float* params, float alpha);

  LowCommOptions options_;
  Average average_;
  size_t n_;
  std::vector<Range> fragments_;
  std::vector<float> global_, momentum_, residual_;
  std::vector<std::unique_ptr<Pending>> pending_;  // in start order
  std::shared_future<void> previous_;              // the last exchange started (they run in order)
  int64_t rounds_ = 0, completed_ = 0;
  bool merged_ = false;  // the last AfterStep merged an exchange
  uint64_t bytes_sent_ = 0;
  double last_wait_s_ = 0;
  std::vector<int> last_sites_;
};

class AsyncClient {
 public:
  struct Options {
    int site = 0, sites = 1;
    int64_t inner_steps = 1;  // H: push every H steps
    int64_t max_staleness = 0;
    Codec codec = Codec::kNone;
  };
  AsyncClient(const Options& options, ParameterServer* ps, size_t n);
  // Init (the site's initial parameters) and the first pull into params. A process that takes
  // over a lost site goes on after the site's last decided push: start_step().
  Status Start(float* params);
  int64_t start_step() const { return start_step_; }
  // Pull steps: completed % H == 0. Returns true when params were replaced (push + pull).
  bool PullsAt(int64_t completed) const { return completed % options_.inner_steps == 0; }
  StatusOr<bool> AfterStep(int64_t completed, float* params);
  // Pushes the steps since the last push (if any), waits at `barrier` (every live site done),
  // pulls the final parameters.
  Status Finish(int64_t completed, float* params, const std::function<Status()>& barrier);

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }
  int64_t pushes() const { return pushes_; }
  int64_t refused() const { return refused_; }
  int64_t version() const { return version_; }
  double last_wait_s() const { return last_wait_s_; }

 private:
  Status PushAndPull(int64_t completed, float* params);

  Options options_;
  ParameterServer* ps_;
  size_t n_;
  std::vector<float> base_, update_, residual_;
  std::vector<uint8_t> encoded_;
  int64_t version_ = 0, last_push_step_ = 0, pushes_ = 0, refused_ = 0, start_step_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  double last_wait_s_ = 0;
};

}  // namespace atl
