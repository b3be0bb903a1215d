// `atoll replay`: re-executes an asynchronous run (world.strategy = "async") from its operation
// log and checks that it reproduces the run's final parameters bitwise.
//
// The run's parameter server logged every push it decided, in order (world/ps.h: update id,
// site, base version, the site's steps, applied version or refused, checksum of the encoded
// update, weight). Replay runs every site again in this process, one thread per site, through
// the same trainer code (train/trainer.h) against a ReplayServer that serves the logged order:
//   - a site's k-th push must be the logged k-th push of that site (same base version, same
//     steps, same weight and the same XXH3-64 of its encoded bytes — else the replay diverged:
//     kInternal naming the update); it waits for its turn (its update id) and is applied or
//     refused as logged, with world/ps.h's ApplyUpdate, the coordinator's own code;
//   - a site's pull before its k-th push returns the parameters of that push's base version
//     (waiting until that version exists); after its last logged push, the final parameters
//     (once every logged update is in);
//   - a site that died during the run (fewer logged pushes than its steps would make) stops
//     where the log ends for it;
//   - a site that a new process took over (a logged rejoin after its step L): its first process
//     ends at the pull after its push of step L, and a new Train (TrainOptions::rejoin: fresh
//     optimizer state and error feedback) goes on from step L, as the run's new process did.
// Each site's computation depends only on the parameters it pulled and its own data, optimizer
// state and error-feedback residual, and every kernel's result is independent of the thread
// count, so the re-executed updates are the logged ones bit for bit and the server ends with the
// run's final parameters, which Replay compares with the run's final checkpoint.
//
// Limits: sites of one rank each (world.ranks_per_site = 1); the data (data.dir) must be the
// run's (checked against the checksums in the final checkpoint's manifest: kInvalidArgument).
// Bitwise identity holds for the same build on a CPU of the same kind: the op log's init record
// names the run's build and CPU (core/build_info.h), and a replay elsewhere says so up front and
// in its report or error.
//
// Thread-safety: ReplayServer is thread-safe.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "world/ps.h"

namespace atl {

class ReplayServer {
 public:
  ReplayServer(OpLog log, int sites);
  // The parameter server as seen by one site (owned by this object).
  ParameterServer* ForSite(int site);
  // After every site has ended: the final parameters and how many logged updates were served.
  const std::vector<float>& params() const { return params_; }
  int64_t served() const { return next_id_; }
  int64_t logged() const { return int64_t(log_.entries.size()); }

  // ParameterServer calls, by site. Init returns where the site's current process starts (0,
  // or for a process that took the site over, the logged rejoin step).
  StatusOr<int64_t> Init(int site, std::span<const float> params);
  StatusOr<int64_t> Pull(int site, std::span<float> params);
  StatusOr<PsPushResult> Push(const PsUpdate& update);
  // Ends the replay: every waiting and later call returns an error (a site failed or diverged,
  // so the updates the others wait for will never come). The first reason is kept.
  void Abort(const Status& why);

 private:
  class View;
  Status CopyVersion(int64_t version, std::span<float> out, std::unique_lock<std::mutex>& lock);

  OpLog log_;
  std::vector<std::vector<size_t>> by_site_;   // log entry indices of each site, in order
  std::vector<size_t> pushed_;                 // pushes served per site
  std::vector<std::vector<int64_t>> rejoins_;  // per site: the logged rejoin steps, in order
  std::vector<size_t> process_;                // per site: processes ended (rejoins taken)
  std::vector<std::unique_ptr<View>> views_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool initialized_ = false;
  std::vector<float> params_;
  int64_t version_ = 0;
  int64_t next_id_ = 0;  // the next logged update to decide
  Status aborted_ = Status::Ok();
  std::map<int64_t, std::vector<float>> snapshots_;  // versions some later pull needs
  std::map<int64_t, int> needed_;                    // version -> pulls still to serve
};

struct ReplayOptions {
  std::string run_dir;   // `atoll launch --out DIR`: config.toml, ops.jsonl, checkpoint/
  std::string work_dir;  // scratch for the re-executed sites' files (default: run_dir/replay)
  bool progress = true;
};

struct ReplayReport {
  int64_t updates = 0;  // logged updates re-executed
  int sites = 0;
  uint64_t replayed_hash = 0, checkpoint_hash = 0;  // XXH3-64 of the final float32 parameters
  bool identical = false;
  size_t first_difference = 0;  // when not identical
  // Empty, or how the run's build or CPU (logged in its op log's init record) differs from this
  // replay's: then a difference may come from the arithmetic, not from the log.
  std::string elsewhere;
};

// Bad run directory, config, log or checkpoint: kInvalidArgument / kNotFound / kCorruption
// (exit 2); a diverged replay: kInternal naming the update (exit 1).
StatusOr<ReplayReport> Replay(const ReplayOptions& options);

}  // namespace atl
