// The silent-data-corruption monitor of one rank: runs the detectors after every optimizer step
// and reports what they found as `sdc` events (train/sdc/faults.h injects what they should find).
//
// Detectors ([sdc] in the config; train/config.h):
//   - guard (sdc.guard): the step guard (train/sdc/guard.h) over the loss, the gradient norm
//     (global signals: every rank sees the same value, reported with rank -1), and this rank's
//     per-tensor update RMS per unit of learning rate (rms(p_after - p_before) / lr over the
//     elements the rank updates, summed by the optimizer in its own pass; lr, so the schedule's
//     warmup and decay do not look like anomalies) and per-block max |activation|
//     (the residual stream after each block, over the step's micro-batches).
//   - fingerprints (sdc.fingerprints; data-parallel replicas only, dp > 1): the parameters'
//     per-tensor hashes compared over the dp group after every step, and the AdamW moments' every
//     sdc.moments_every steps; a replica outside the majority is named (by its rank in the site)
//     with the tensor. With ZeRO the parameters are compared before the update instead (after it
//     every replica has copied the owners' pieces, so they agree by construction), and the
//     moments, which are not replicated, are not compared. Fingerprints see corruption of what
//     replicas hold (parameters, moments, a replica's own update); a fault in a computation whose
//     result is summed over the replicas reaches every replica alike and is the guard's to see.
//     Across sites (set_sites; world.strategy = sync, where the sites hold one model): the site
//     leaders' per-tensor hashes of the parameters (and moments, at the same cadence) are
//     all-gathered over the WAN after every step (8 bytes a tensor); a site outside the majority
//     is named with the tensor (two sites: both, no majority). This sees what reached one site
//     only: a WAN payload corrupted in the all-gather half of the ring, or a site's state.
//   - memory checks (sdc.memory; train/sdc/memory.h): the rank's parameters and moments are
//     sealed at the end of each step (SealAtRest) and checked before the next (CheckAtRest); a
//     changed tensor is named, and repaired from a data-parallel replica whose check passed, or
//     (sync across sites, set_sites) from another site's copy.
//   - checksums (sdc.checksums): every block GEMM's column checksum (train/sdc/checksum.h),
//     forward and backward, checked right after the GEMM, and (tp = 1) each block's output
//     against the residual add that made it (CheckResidualColumns); the first failure of the
//     step is reported with its micro-batch, block and op ("gemm_fwd 2", "activation"), and how
//     many failed. And the reduced gradient's segment sums against what the replicas put into
//     the reduction (parallel/grad_checksum.h; op "grad", what: the tensor), where the
//     optimizer reads it.
// An event names the step (1-based), site, rank, detector, and what it saw: the tensor or the
// signal, the value, the median and how many robust deviations (log scale) it was off.
//
// On the GPU the detectors read the state where it lives: the fingerprints and the memory checks
// hash the GPU's buffers (SdcOptions::params_on), the guard takes each block output's max |x|
// there (OnActivation's on_device); a few bytes come back. The checksums read host copies.
//
// Thread-safety: belongs to its rank's training thread; AfterStep is collective over the dp group
// when fingerprints are on.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/log.h"
#include "core/status.h"
#include "model/config.h"
#include "parallel/grad_checksum.h"
#include "train/sdc/checksum.h"
#include "train/sdc/faults.h"
#include "train/sdc/fingerprint.h"
#include "train/sdc/guard.h"
#include "train/sdc/memory.h"

namespace atl {

// Every site's hashes (cross-site fingerprints), and the site each came from (the live sites of a
// sync run: all of them, or the survivors of a lost one).
struct SiteHashes {
  std::vector<int> sites;
  std::vector<std::vector<uint64_t>> hashes;  // by position in sites
};

struct SdcEvent {
  int64_t step = 0;
  int site = 0, rank = -1;  // rank -1: a signal every rank shares (loss, gradient norm)
  // "guard", "fingerprint", "checksum", "memory", "replay" (train/sdc/audit.h)
  std::string detector;
  std::string what;  // the signal ("loss", "update_rms.h.1.mlp.c_fc.weight", "act_max.2")
                     // or the tensor ("params:h.1.attn.c_attn.weight", "moment_v:wte")
  // guard (StepGuard::Outlier); checksum: the column sum (value), the expected one (median) and
  // |value - median| over the rounding bound (deviations)
  double value = 0, median = 0, deviations = 0;
  bool has_majority = true;  // fingerprint: false when two replicas disagree
  // fingerprint: sites compared (site: the one outside), not replicas; replay: the sites
  // recomputed each other's micro-batches (peers.h; site, peer: sites)
  bool across_sites = false;
  // replay: "transient" (this rank's replay differed; where: micro, layer, op, what = the
  // tensor of a differing gradient), "reproduced" (every rank's replay matched; rank -1) or
  // "faulty_rank" (another rank's execution of the same micro-batches differed; train/sdc/peers.h:
  // peer, has_majority, what = whose micro-batches, and where)
  std::string verdict;
  int64_t micro = -1;  // replay, checksum: where
  int layer = -1;
  std::string op;
  int64_t count = 0;     // checksum: the GEMMs that failed in the step
  int source = -1;       // memory, verdict "repaired": the replica (rank in the site) copied from
  int source_site = -1;  // ... or the site (the same rank there), when no replica could
  std::string run;       // transient: the run that was corrupted ("first" or "replay")
  int peer = -1;         // faulty_rank: a rank that disagreed with it (no majority: the other)
  bool peers_agree = false;  // reproduced: other ranks' executions agreed too (peers.h)
  std::string ToJson() const;
  std::string ToString() const;
};

// Adds the seconds between its construction and its end to *acc.
class SdcTimer {
 public:
  explicit SdcTimer(double* acc) : acc_(acc), t0_(NowSeconds()) {}
  ~SdcTimer() { *acc_ += NowSeconds() - t0_; }
  SdcTimer(const SdcTimer&) = delete;
  SdcTimer& operator=(const SdcTimer&) = delete;

 private:
  double* acc_;
  double t0_;
};

// Seconds each detector has taken on this rank so far (what it costs, measured in the run).
struct SdcCost {
  double guard = 0, fingerprints = 0, memory = 0, checksums = 0;
};

struct SdcOptions {
  bool guard = true;
  bool fingerprints = true;
  bool checksums = false;
  // With checksums: each block's output checked against the residual add that made it (tp = 1:
  // with tensor parallelism mlp.c_proj's product is a partial sum until its all-reduce).
  bool residual = false;
  bool memory = true;
  int64_t moments_every = 1;
  StepGuard::Options guard_options;
  // Where the parameters and the moments that the fingerprints and the memory checks hash live:
  // on the GPU (kCuda) they are hashed there (fingerprint.h), and their pointers are device
  // memory.
  Device params_on = Device::kCpu, moments_on = Device::kCpu;
};

class SdcMonitor {
 public:
  // layout: this rank's tensors (its shard's); dp_group: the data-parallel replicas (null or
  // size 1: no fingerprints) and replica_ranks their ranks in the site, by dp rank; zero: ZeRO-1.
  // moments_size: the AdamW moments' length on this rank (its shard with ZeRO).
  SdcMonitor(SdcOptions o, std::vector<ParamTensor> layout, size_t moments_size, int site, int rank,
             Communicator* dp_group, std::vector<int> replica_ranks, bool zero);

  bool active() const { return o_.guard || o_.checksums || o_.memory || fingerprints(); }
  // Whether the memory checks are on (SealAtRest and CheckAtRest read the state).
  bool memory() const { return o_.memory; }
  bool fingerprints() const { return o_.fingerprints && (replicas() || sites_ != nullptr); }
  // Cross-site fingerprints: gather(mine) returns every site's vector, by site, on the leader
  // (empty elsewhere; WorldStrategy::GatherOverSites). Collective over the sites' leaders.
  using SitesGather = std::function<StatusOr<SiteHashes>(const std::vector<uint64_t>& mine)>;
  // ... and state at rest that no data-parallel replica could repair, copied from another site
  // (WorldStrategy::RepairAcrossSites: returns the site copied from, -1 for none). Collective
  // over the world.
  using SitesRepair = std::function<StatusOr<int>(bool corrupt, const HostStateFn& state)>;
  void set_sites(SitesGather gather, SitesRepair repair) {
    sites_ = std::move(gather);
    sites_repair_ = std::move(repair);
  }

  // The model's op hook, activations only (kind 2): the max |x| of each block's output (on_device:
  // `out` is GPU memory, read there; the step's maxima stay on the GPU until AfterStep reads them
  // at once, so no block output makes the host wait).
  void OnActivation(int layer, const float* out, size_t n, bool on_device = false);
  // Each block's max |output| so far this step (infinity where one was not finite; 0 for a block
  // not seen), the GPU's included.
  const std::vector<double>& activation_maxima();
  // The micro-batch the next GEMMs belong to (its index in the whole batch).
  void At(int64_t micro) { micro_ = micro; }
  // The model's op hook, GEMMs (checksums on): checks c = a·w (+ bias), or a·wᵀ for kind
  // kGemmBackward (GPT::OpEvent's operands).
  void OnGemm(FaultKind kind, int layer, int gemm, const float* c, const float* a, const float* w,
              const float* bias, int rows, int inner, int cols);
  // The model's op hook, block outputs (checksums and residual on): out[rows, cols] = x + the
  // block's mlp.c_proj product, whose column sums its OnGemm kept (CheckResidualColumns).
  void OnResidual(int layer, const float* out, const float* x, int rows, int cols);
  // The reduced gradient's checksum (parallel/grad_checksum.h), checked where the optimizer reads
  // it: a failure is the step's checksum event with op "grad" and the tensor (what). seconds:
  // the checksum's total so far (its cost).
  void OnReducedGradient(const GradChecksum::Mismatch& mm, double seconds);
  // Memory checks: SealAtRest at the end of a step, when nothing will change the parameters
  // and moments before the next one (after the world strategy's exchanges); CheckAtRest at the
  // start of a step, before anything reads them: what changed since becomes an event of this step,
  // and with data-parallel replicas is repaired from one whose check passed (collective over the dp
  // group when dp > 1), into `state`'s buffers. params, m, v: where they live (params_on,
  // moments_on), as SealAtRest's.
  Status CheckAtRest(const float* params, const float* m, const float* v, const HostStateFn& state);
  void SealAtRest(const float* params, const float* m, const float* v) {
    if (!o_.memory) return;
    const SdcTimer timer(&cost_.memory);
    seal_.Seal(params, m, v);
  }
  const SdcCost& cost() const { return cost_; }
  // Before step s's optimizer update: with ZeRO, compares the replicas' parameters (collective
  // over the dp group).
  Status BeforeUpdate(int64_t s, const float* params);
  // After it (guard): what the update moved, per layout tensor, as the optimizer summed it in
  // its own pass (AdamW::update_squares, owned_numel: this rank's elements). With ZeRO each
  // replica updated its own pieces: the sums are added over the dp group (collective), so the
  // signal is the whole tensor's as without it.
  Status OnUpdate(const std::vector<double>& squares, const std::vector<size_t>& numel);
  // After step s (0-based)'s update: the detectors. m, v: the moments (null: not compared).
  StatusOr<std::vector<SdcEvent>> AfterStep(int64_t s, double loss, double grad_norm, double lr,
                                            const float* params, const float* m, const float* v);

  // Audit replay (train/sdc/audit.h): the detectors' state before a step's AfterStep, to go back
  // to when the step is replayed; and, for a replayed step found reproducible (a genuine spike,
  // not corruption), the guard signals its last AfterStep flagged join their histories.
  void SaveState() { saved_guard_ = guard_; }
  void RestoreState() {
    guard_ = saved_guard_;
    ClearActivationMaxima();
    checksum_ = {};
  }
  void AcceptFlagged() { guard_.Accept(flagged_); }

 private:
  SdcOptions o_;
  std::vector<ParamTensor> layout_;
  int site_, rank_;
  Communicator* dp_;
  bool zero_;
  bool replicas() const { return dp_ != nullptr && dp_->size() > 1; }
  // A buffer's per-tensor fingerprints, with the name its events give it ("params", ...).
  using Hashed = std::pair<const char*, std::vector<uint64_t>>;
  // Compares a buffer's fingerprints over the dp group; mismatches become events.
  Status Compare(int64_t s, const Hashed& buffer, std::vector<SdcEvent>* out);
  // The cross-site comparison of every buffer (one gather for all of them).
  Status CompareSites(int64_t s, const std::vector<Hashed>& buffers, std::vector<SdcEvent>* out);
  // The events of `mismatches` in buffer `what`: among the dp replicas (sites null), or among the
  // sites (replica i is site (*sites)[i]).
  void AddMismatches(int64_t s, const char* what,
                     const std::vector<FingerprintMismatch>& mismatches,
                     const std::vector<int>* sites, std::vector<SdcEvent>* out) const;
  SitesGather sites_;
  SitesRepair sites_repair_;

  std::vector<int> replica_ranks_;
  StepGuard guard_, saved_guard_;
  std::vector<StepGuard::Signal> flagged_;  // by the last AfterStep
  std::vector<double> update_sq_;           // OnUpdate's, this step (empty: no update)
  std::vector<size_t> update_numel_;
  std::vector<SdcEvent> pending_;  // found before the update (ZeRO)
  std::vector<double> act_max_;    // per block, this step
  Buffer<float> act_max_gpu_;      // ... and on the GPU, since act_max_ last took them
  bool act_max_on_gpu_ = false;    // whether act_max_gpu_ holds any
  void ClearActivationMaxima();
  int64_t micro_ = -1;
  // A failed checksum of block `layer`'s op: the step's first names the place, the others count.
  void Mismatch(const ChecksumMismatch& mm, int layer, std::string op);
  // count failures of the step; the first one names the place.
  void Failed(int64_t micro, int layer, std::string op, std::string what, double got,
              double expected, double bound, int64_t count);
  double grad_seconds_ = 0;        // the gradient checksum's seconds already counted
  SdcEvent checksum_;              // the step's first failing GEMM or residual add (count 0: none)
  std::vector<double> proj_sums_;  // the last mlp.c_proj product's column sums (residual)
  int proj_layer_ = -1;            // ... its block (-1: none since the last block output)
  RestSeal seal_;
  SdcCost cost_;
  std::vector<SdcEvent> at_rest_;  // found by CheckAtRest, reported by AfterStep
};

// Every rank's events, on every rank of `group`: each rank's list (one JSON object per entry)
// all-gathered, in rank order, with duplicates (the same finding made by several replicas)
// dropped. Collective over group.
StatusOr<std::vector<std::string>> ShareEvents(Communicator& group,
                                               const std::vector<std::string>& mine);

}  // namespace atl
