// One rank's part of a training run (`atoll train`, train/trainer.h): what the rank holds (its
// model shard, optimizer, gradient reducer, data samplers, mesh) and the work the step loop asks
// of it: the forward and backward passes of a step over the rank's micro-batches in its pipeline
// schedule with the gradient reduction, the global gradient norm, resuming from a checkpoint,
// writing one, and validation. Collective over the run's mesh where the comments say so.
//
// Thread-safety: a Run belongs to one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/optimizer.h"
#include "train/sdc/audit.h"
#include "train/sdc/faults.h"
#include "train/sdc/monitor.h"

namespace atl {

// Everything a running training loop holds on one rank of the mesh.
struct Run {
  Run(const RunConfig& c, TokenFile train_file, TokenFile val_file, Mesh m)
      : cfg(c),
        train_tokens(std::move(train_file)),
        val_tokens(std::move(val_file)),
        train(train_tokens.tokens(), uint64_t(c.train.seed), c.model.seq_len),
        val(val_tokens.tokens(), uint64_t(c.train.seed), c.model.seq_len),
        mesh(std::move(m)) {}

  const RunConfig& cfg;
  TokenFile train_tokens, val_tokens;
  Sampler train, val;  // their spans point into the mappings above
  Mesh mesh;
  int64_t accum = 1;        // micro-batches per step over the whole batch
  int64_t local_accum = 1;  // ... of this data-parallel replica
  int64_t first_micro = 0;  // its first micro-batch
  // The last ComputeStep's blocks of local_accum micro-batches (its own, then those it took over
  // from lost sites) and the live sites' generation it ran in (WorldStrategy::generation).
  size_t blocks = 1;
  int64_t generation = 0;
  // Emulates a slower site (benchmarks of world.balance): each step's passes take this many times
  // as long (the rank sleeps for the difference).
  double slowdown = 1;
  // The last ForwardBackward's passes alone (not the gradients' zeroing or reduction), seconds:
  // what world.balance compares across sites.
  double passes_s = 0;
  std::vector<PipeOp> schedule;
  std::unique_ptr<GPT<float>> model;      // this rank's shard
  std::unique_ptr<Communicator> tp_nccl;  // parallel.comm = nccl: the tp group over NCCL
  std::unique_ptr<Communicator> dp_nccl;  // ... and the dp group's (GradientReducer, normal mode)
  std::unique_ptr<Communicator> embed_nccl;  // ... and the tied wte's (pp > 1, not reproducible)
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<AdamW> optimizer;
  std::vector<std::pair<size_t, size_t>> norm_ranges;  // NormRanges of the shard
  std::unique_ptr<GPT<float>> eval_model;              // rank 0, when the shard is not whole
  size_t num_val_windows = 0;
  double comm_wait_s = 0;   // in GradientReducer::Finish: communication not hidden by backward
  int sites = 1, site = 0;  // several sites: this site's replicas follow the other sites'
  float loss_scale = 1;     // backward's: 1 / the micro-batches whose mean loss is the objective
  std::unique_ptr<FaultInjector> faults;    // [faults] for this rank; null: none
  std::unique_ptr<SdcMonitor> sdc;          // [sdc] detectors; null: all off
  std::unique_ptr<StepTrace> trace;         // the step's op fingerprints (audit replay); null: off
  std::unique_ptr<GradChecksum> grad_sums;  // sdc.checksums: through the reduction; null: off
  bool in_step = false;  // the model's op hook acts only in a step's passes (not in validation)
  bool replica_pass = false;  // ReplicaPass: the hook feeds the trace and the faults only
};

// [faults] and [sdc] (train/sdc/): this rank's fault injector (when a fault names it; its record
// goes to faults_log), corruption monitor and, for audit replays (sdc.on_alarm = redo or
// sdc.audit_every), step trace, hooked into the model (the injector first, so the detectors see
// what it changed).
// What the model's op hook reports, as the fault kind that strikes it.
FaultKind FaultKindOfOp(GPT<float>::OpKind k);
// A fresh run (not resumed) starts its fault log empty.
Status SetUpSdc(Run& run, const std::string& out_dir, bool fresh);
// Injects the faults of step s (0-based) that strike a flat buffer: the parameters and moments
// at the start of the step (where = kParam), or the reduced gradients (kGrad).
void InjectBufferFaults(Run& run, FaultKind where, int64_t s);

// The reduced gradient against the checksums the replicas put into the reduction (sdc.checksums,
// parallel/grad_checksum.h), read where the optimizer will read it; a failure goes to run.sdc.
// replicas: how many gradients were summed (dp, times the sites when the WAN summed them too).
void CheckReducedGradient(Run& run, int replicas);

// ZeRO-1: the optimizer state is sharded over the data-parallel replicas.
bool Zero(const Run& run);
// The rank's model and optimizer for reading: on the GPU their host copies download what is newer
// there without being marked written (the non-const accessors mark them, and the next step then
// uploads them again).
inline const GPT<float>& ModelView(const Run& run) { return *run.model; }
inline const AdamW& OptimizerView(const Run& run) { return *run.optimizer; }
// Throws the status of a failed tensor-parallel all-reduce out of the model's forward/backward.
void ThrowIfError(const Status& s);

// The data fits the model: a training and a validation window, token ids below the vocabulary.
Status CheckData(const RunConfig& cfg, const TokenFile& train, const TokenFile& val);
ModelShard ShardOf(const RunConfig& cfg, int tp_rank, int stage);
AdamW::Hyper HyperOf(const TrainConfig& tc);

// Takes this rank's part of the checkpoint's parameters and optimizer state (any layout wrote
// it); refuses another model, other data, or a step past train.steps (kInvalidArgument).
Status ResumeRun(const Checkpoint& ck, const std::string& path, Run& run);
// One optimizer step's forward and backward passes over this replica's micro-batches, in the
// stage's pipeline schedule, and the gradient reduction inside the site. firsts: the first
// micro-batch of each block of local_accum micro-batches to compute (empty: run.first_micro's
// alone; sync over sites: its own, then a lost site's replica's it takes over), whose gradients
// are summed. counts (world.balance, pp = 1): each block's micro-batches instead of local_accum,
// one after the other (forward, backward). Fills the losses of the blocks' micro-batches, block
// after block (last stage).
Status ForwardBackward(Run& run, int64_t s, std::vector<double>* local_losses,
                       std::span<const int64_t> firsts = {}, std::span<const int64_t> counts = {});
// Data-parallel replica `replica`'s first micro-batch of a step, in the whole batch (the replicas
// of every site, site-major).
inline int64_t FirstMicro(const Run& run, int replica) {
  return (int64_t(run.site) * run.mesh.dp() + replica) * run.local_accum;
}
// The peer check of an audit replay (train/sdc/peers.h): recomputes the forward and backward
// passes of another replica's micro-batches of step s (those from `first`, FirstMicro's: a
// data-parallel replica of the site, or another site's) on this rank, from the parameters it
// holds, without any reduction, into run.trace (its ops and losses; not its gradients). The
// detectors do not see it; the faults strike it as any computation of the rank. Leaves the
// model's gradients those of the replica's micro-batches. With tp or pp > 1, collective over the
// replica's ranks (each passes the same `first`).
Status ReplicaPass(Run& run, int64_t s, int64_t first);
// The peer check of step s of an audit replay (train/sdc/peers.h), when every rank's replay matched
// its first run: this rank recomputes its neighbouring replicas' micro-batches from the parameters
// the step started from (`before`), then goes back to the ones it ended with. The replicas: the
// site's data-parallel ones (group: the dp group), or with sync over sites of one rank each the
// sites (group: their leaders; sites true). A rank named for a neighbour's micro-batches, which it
// ran once, runs them again: only a repeated result names it faulty; another is a transient fault
// of the check ("transient", run "peer check"; the step stands). The events, the same on every
// rank; named: the faulty ranks they name. Collective over the group; with tp or pp > 1 (several
// dp groups) over the site's ranks, whose events name world ranks and replicas.
struct NamedFaulty {
  std::vector<int> sites;  // the sites of the ranks named by a majority of executions
  bool unsure = false;     // a rank named without a majority (two executions disagree)
  bool any() const { return unsure || !sites.empty(); }
};
StatusOr<std::vector<std::string>> CheckOnPeers(Run& run, int64_t s, const StepSnapshot& before,
                                                Communicator& group, bool sites,
                                                NamedFaulty* named);
// The squared global gradient norm: every element of the whole model once (NormRanges), of the
// reduced gradients (data-parallel replica 0's copy, or with ZeRO each replica's owned pieces),
// summed over the world. Reproducible mode sums in integers (ExactSquareSum), so the value does
// not depend on the layout; the normal mode in double.
StatusOr<double> SquaredGradNorm(Run& run);
// Writes a checkpoint of the whole model (collective: every rank takes part in the gather; rank
// 0 writes).
Status SaveCheckpoint(Run& run, const std::string& dir, int64_t completed);
// The validation loss on rank 0 (collective when the model is sharded); NaN elsewhere.
StatusOr<double> Validate(Run& run);

}  // namespace atl
