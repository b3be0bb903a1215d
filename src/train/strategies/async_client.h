// Asynchronous training ("async") on a site's leader: each site pushes its progress every H
// inner steps to the parameter server (world/ps.h; hosted by the coordinator): update = local -
// base (base: the parameters it last pulled), encoded with world.codec and error feedback,
// applied with weight 1 / sites if it is at most world.async.max_staleness versions behind, then
// pulls the current parameters and goes on from them (its AdamW state kept). A refused update
// changes nothing anywhere: the error-feedback residual it consumed is restored, so what the
// codec dropped from it is sent with the next push. No barrier but one at the end (every live
// site's last push is in), after which every site pulls the final parameters. The server logs
// every decision, so `atoll replay` re-executes the run bitwise (train/replay.h).
//
// Thread-safety: one thread calls each object.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "world/codec.h"
#include "world/ps.h"

namespace atl {

// What a site keeps beside a checkpoint so that a resumed run goes on from it (the parameters are
// the checkpoint's: every site pulled them at the checkpoint's consistent cut, and the parameter
// server of the resumed run starts from them at version 0).
struct AsyncSiteState {
  int64_t completed = 0;  // the checkpoint's step
  int64_t pushes = 0, refused = 0;
  std::vector<float> residual;        // the codec's error feedback (n)
  std::vector<float> adam_m, adam_v;  // the site's AdamW (n each)
  int64_t adam_steps = 0;
};
// Bytes: "ATLA", u32 version 1, u64 n, i64 completed, pushes, refused, adam_steps
// (little-endian), then residual, adam_m and adam_v as n float32 each, then u64 XXH3 of all the
// bytes before it. Decode checks the size and the checksum (kCorruption) and n against the
// model's (kInvalidArgument: another model).
std::string EncodeAsyncSiteState(const AsyncSiteState& state);
StatusOr<AsyncSiteState> DecodeAsyncSiteState(std::string_view bytes, size_t n);

class AsyncClient {
 public:
  // A meeting of every live site (phase 0: every push is in; 1: every pull is done).
  using Barrier = std::function<Status(int phase)>;
  struct Options {
    int site = 0, sites = 1;
    int64_t inner_steps = 1;  // H: push every H steps
    int64_t max_staleness = 0;
    Codec codec = Codec::kNone;
  };
  AsyncClient(const Options& options, ParameterServer* ps, size_t n);
  // Init (the site's initial parameters) and the first pull into params. A process that takes
  // over a lost site goes on after the site's last decided push, a resumed run after `from`:
  // start_step().
  Status Start(float* params, int64_t from = 0);
  int64_t start_step() const { return start_step_; }
  // Pull steps: completed % H == 0. Returns true when params were replaced (push + pull).
  bool PullsAt(int64_t completed) const { return completed % options_.inner_steps == 0; }
  // With a barrier (a checkpoint's step): push, meet, pull, meet: a consistent cut.
  StatusOr<bool> AfterStep(int64_t completed, float* params, const Barrier& barrier = nullptr);
  // Pushes the steps since the last push (if any), waits at `barrier` (every live site done),
  // pulls the final parameters.
  Status Finish(int64_t completed, float* params, const std::function<Status()>& barrier);

  uint64_t bytes_sent() const { return bytes_sent_; }
  uint64_t bytes_received() const { return bytes_received_; }
  int64_t pushes() const { return pushes_; }
  int64_t refused() const { return refused_; }
  int64_t version() const { return version_; }
  double last_wait_s() const { return last_wait_s_; }
  // The codec's error feedback: what encoding dropped from the pushes so far.
  std::span<const float> residual() const { return residual_; }
  // A resumed run's error feedback and counters (after Start).
  void Restore(const AsyncSiteState& state);

 private:
  Status Push(int64_t completed, const float* params);
  Status Pull(float* params);

  Options options_;
  ParameterServer* ps_;
  size_t n_;
  std::vector<float> base_, update_, residual_, saved_residual_;
  std::vector<uint8_t> encoded_;
  int64_t version_ = 0, last_push_step_ = 0, pushes_ = 0, refused_ = 0, start_step_ = 0;
  uint64_t bytes_sent_ = 0, bytes_received_ = 0;
  double last_wait_s_ = 0;
};

}  // namespace atl
