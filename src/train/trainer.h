// The single-process training loop: `atoll train`.
//
// Per optimizer step s (0-based; metrics and checkpoints count completed steps, s + 1):
//   1. zero the gradients; for each of k = batch_size / micro_batch_size micro-batches j, fill
//      micro_batch_size windows from the sampler at (seed, s, position j * micro + i), forward,
//      and backward with loss_scale 1/k, so the gradients are those of the mean loss over the
//      whole batch;
//   2. the global gradient norm (fixed-order double sum), the clipping factor, the learning rate
//      of step s (warmup + cosine), one AdamW update;
//   3. a metrics line; validation every eval_every steps and at the end (the mean loss over the
//      first eval_batches * micro_batch_size validation windows, Sampler::EvalWindow); a
//      checkpoint every checkpoint_every steps (DIR/checkpoint-<s+1>) and at the end
//      (DIR/checkpoint).
//
// Determinism: the batch of step s depends only on (seed, s); parameters, gradients and moments
// are computed by kernels whose results do not depend on the thread count; the schedule is a
// function of s. So two runs with the same config give the same bits, any thread count gives
// the same bits, and a run resumed from checkpoint-k (which holds the parameters and moments
// exactly, and k) continues exactly as the uninterrupted run did.
//
// Parallel layouts (parallel.dp x tp x pp = N ranks under mpirun, TrainOptions::comm the world;
// parallel/mesh.h orders them pp, dp, tp):
//   - Data parallel: replica r takes micro-batches j = r*k/D .. (r+1)*k/D - 1 of each step
//     (positions j * micro + i, so the union over replicas is exactly the single-process batch),
//     backward with loss_scale 1/k, and the gradients are summed over the replicas
//     (parallel/data_parallel.h: buckets started from a backward hook during the last
//     micro-batch's backward, waited before the optimizer), which gives the single-process
//     gradient of the mean loss up to float rounding. Every replica then runs the same AdamW
//     step. With parallel.zero, the buckets are reduce-scattered instead, each replica updates
//     its pieces (AdamW over its shard of the moments) and the parameters are all-gathered.
//   - Tensor parallel: each rank holds a ModelShard (model/config.h) of its heads and MLP
//     columns; the model all-reduces activations over the tp group inside forward and backward.
//   - Pipeline parallel: stage s holds blocks StageLayers(n_layer, pp, s) (the first also the
//     embeddings, the last ln_f and the tied head); each replica's micro-batches run in the
//     parallel.schedule order (1f1b or gpipe, parallel/pipeline.h) with activations sent to the
//     next stage and their gradients back. The first and the last stage sum their wte gradients.
//   The reported loss is the mean of every micro-batch's loss in global order, and the gradient
//   norm counts every element of the whole model once (parallel/grad_norm.h). Only rank 0 writes
//   config.toml, metrics.jsonl and checkpoints: the shards of replica 0 are gathered into the
//   whole model, so every layout writes the same files and any layout resumes from them. Rank 0
//   runs validation on the gathered whole model.
// parallel.reproducible = true reduces each micro-batch's gradient in int64 fixed point and sums
// the squared norm in integers, which makes the parameters bitwise identical for any dp (and for
// dp = 1 with reproducible = true), with or without ZeRO.
// Single process with parallel.reproducible = false is the loop above, unchanged.
//
// Several sites (world.sites = S > 1, world.strategy = "sync"; TrainOptions::site, wan): the
// sites' replicas are data-parallel replicas too — replica index site * dp + dp_rank of S * dp —
// and the reduction is hierarchical: the site's ranks sum their gradients (above), the site
// leader all-reduces the site's sum with the other leaders over the WAN, then broadcasts it to
// the site's ranks. The loss curve is the single-process one up to float rounding. Each site's
// leader writes its own metrics.jsonl (with the site and the step's WAN time); site 0 alone
// validates and writes checkpoints.
//
// The other strategies (world.strategy = "diloco", "streaming", "async"; train/strategies/): each
// site takes the same share of every step's batch as with sync, but its gradients stay in the
// site (the loss is scaled by the site's micro-batches, the reported loss is the site's, the
// clipping norm the site's gradient's) and its own AdamW steps its own replica; the sites agree
// through the strategy's exchanges (diloco, streaming: WorldHooks::average) or the parameter
// server (async: WorldHooks::ps), run by the leader after the optimizer step, and the site's
// other ranks take the changed parameters by broadcast. Metrics add wan_bytes_sent,
// sync_bytes_sent (what sync would have sent by then) and outer_rounds; wan_ms is the time the
// step waited on the WAN.
//
// The loop calls the strategy (train/strategies/world_strategy.h) at three points: Start before
// the first step, AfterBackward after the site's gradients are reduced, AfterStep after the
// optimizer step; one rank's mechanics (forward, backward, norm, checkpoints) are train/run.h.
//
// Thread-safety: one Train call per thread; OpenMP's thread count is set per calling thread.
#pragma once

#include <functional>
#include <span>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"
#include "data/dataset.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/strategies/world_strategy.h"

namespace atl {

struct TrainOptions {
  std::string out_dir;                 // metrics.jsonl, config.toml, checkpoint[-<step>]
  const Checkpoint* resume = nullptr;  // continue from this state (loaded with the optimizer)
  std::string resume_path;             // where it came from, for messages
  bool progress = true;                // progress bar / lines on stderr
  // The ranks of this site (MPI world); nullptr: one process. Its size must equal
  // parallel.dp * parallel.tp * parallel.pp.
  Communicator* comm = nullptr;

  // Where checkpoints go (default: out_dir). With several sites only the lowest live site writes
  // them.
  std::string checkpoint_dir;
  // Several sites (world.sites > 1): this site (world.site) and, on the site's leader, how the
  // strategy reaches the other sites (train/strategies/world_strategy.h).
  WorldHooks world;
  // Fault injection (tests, benchmarks): the site's leader ends its process abruptly, as a
  // crash would (no goodbye to the coordinator), right after this step; 0: never.
  int64_t die_after_step = 0;
  int die_rank = 0;     // the rank of the site that dies (0: the leader)
  double slowdown = 1;  // Run::slowdown: emulates a slower site (benchmarks)
  // ... but instead of ending the process, Train returns kUnavailable ("stopped after step N"):
  // a site of a world in one process (train/local_world.h) whose thread then drops its links.
  bool die_returns = false;
};

// Trains and returns the final checkpoint's directory ("" with train.checkpoint_every = -1: none
// written). Bad config or data: kInvalidArgument /
// kNotFound / kCorruption (exit 2); divergence or I/O failure: runtime errors (exit 1).
StatusOr<std::string> Train(const RunConfig& cfg, const TrainOptions& options);

// Opens DIR/train.bin or DIR/val.bin with a hint to run `atoll data prepare` when it is missing.
StatusOr<TokenFile> OpenTokenFile(const std::string& dir, const char* name);

}  // namespace atl
