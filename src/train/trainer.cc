#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"

namespace atl {

StatusOr<TokenFile> OpenTokenFile(const std::string& dir, const char* name) {
  const std::string path = dir + "/" + name;
  auto f = TokenFile::Open(path);
  if (!f.ok() && f.status().code() == StatusCode::kNotFound)
    return Status::NotFound(
        fmt::format("{}: no such file (data.dir = {}); prepare the corpus first: atoll data "
                    "prepare --out {}",
                    path, dir, dir));
  return f;
}

namespace {

// Everything a running training loop holds.
struct Run {
  const RunConfig& cfg;
  TokenFile train_tokens, val_tokens;
  Sampler train, val;
  GPT<float> model;
  AdamW optimizer;
  size_t num_val_windows = 0;
};

Status CheckData(const RunConfig& cfg, const TokenFile& train, const TokenFile& val) {
  const int seq = cfg.model.seq_len;
  if (train.size() <= size_t(seq))
    return Status::InvalidArgument(
        fmt::format("{}: {} tokens, fewer than one training window of model.seq_len + 1 = {}",
                    train.path(), train.size(), seq + 1));
  if (val.size() <= size_t(seq))
    return Status::InvalidArgument(
        fmt::format("{}: {} tokens, fewer than one validation window of model.seq_len + 1 = {}",
                    val.path(), val.size(), seq + 1));
  ATOLL_RETURN_IF_ERROR(CheckTokenRange(train.tokens(), cfg.model.vocab_size, train.path()));
  ATOLL_RETURN_IF_ERROR(CheckTokenRange(val.tokens(), cfg.model.vocab_size, val.path()));
  return Status::Ok();
}

CheckpointSource Source(const RunConfig& cfg, Run& run, int64_t completed) {
  CheckpointSource src;
  src.config = &cfg;
  src.cursor.next_step = completed;
  src.cursor.tokens_seen =
      uint64_t(completed) * uint64_t(cfg.train.batch_size) * uint64_t(cfg.model.seq_len);
  src.cursor.train_checksum = run.train_tokens.checksum();
  src.cursor.val_checksum = run.val_tokens.checksum();
  src.cursor.train_tokens = run.train_tokens.size();
  src.cursor.val_tokens = run.val_tokens.size();
  src.optimizer_steps = run.optimizer.step_count();
  src.params = run.model.params();
  src.exp_avg = run.optimizer.m();
  src.exp_avg_sq = run.optimizer.v();
  return src;
}

Status Resume(const Checkpoint& ck, const std::string& path, Run& run) {
  {
    RunConfig ck_cfg = ck.config, run_cfg = run.cfg;
    const auto ck_keys = ConfigKeys(ck_cfg), run_keys = ConfigKeys(run_cfg);
    for (size_t i = 0; i < ck_keys.size(); ++i) {
      if (ck_keys[i].section != "model") continue;
      const int a = *std::get<int*>(ck_keys[i].value), b = *std::get<int*>(run_keys[i].value);
      if (a != b)
        return Status::InvalidArgument(
            fmt::format("--resume {}: {} is {} in the checkpoint but {} in the config", path,
                        ck_keys[i].path(), a, b));
    }
  }
  if (ck.exp_avg.size() != run.model.num_params())
    return Status::InvalidArgument(fmt::format("--resume {}: loaded without the optimizer", path));
  if (ck.cursor.train_checksum != run.train_tokens.checksum() ||
      ck.cursor.val_checksum != run.val_tokens.checksum())
    return Status::InvalidArgument(fmt::format(
        "--resume {}: the data changed since the checkpoint (train.bin/val.bin checksums "
        "{}/{} in its manifest, {}/{} in {}): resuming would not continue the same run",
        path, HashToHex(ck.cursor.train_checksum), HashToHex(ck.cursor.val_checksum),
        HashToHex(run.train_tokens.checksum()), HashToHex(run.val_tokens.checksum()),
        run.cfg.data.dir));
  if (ck.cursor.next_step > run.cfg.train.steps)
    return Status::InvalidArgument(
        fmt::format("--resume {}: the checkpoint is at step {}, past train.steps = {}", path,
                    ck.cursor.next_step, run.cfg.train.steps));
  const size_t bytes = run.model.num_params() * sizeof(float);
  std::memcpy(run.model.params(), ck.params.data(), bytes);
  std::memcpy(run.optimizer.m(), ck.exp_avg.data(), bytes);
  std::memcpy(run.optimizer.v(), ck.exp_avg_sq.data(), bytes);
  run.optimizer.set_step_count(ck.optimizer_steps);
  // Keys that change the run's trajectory: resuming with them changed is allowed, but the result
  // is no longer the run the checkpoint came from.
  const TrainConfig &a = ck.config.train, &b = run.cfg.train;
  if (a.seed != b.seed || a.batch_size != b.batch_size || a.lr != b.lr || a.min_lr != b.min_lr ||
      a.warmup_steps != b.warmup_steps || a.steps != b.steps || a.weight_decay != b.weight_decay ||
      a.beta1 != b.beta1 || a.beta2 != b.beta2 || a.eps != b.eps || a.grad_clip != b.grad_clip)
    LogWarning(
        "--resume {}: [train] differs from the checkpoint's; the continuation is not the "
        "run the checkpoint came from",
        path);
  return Status::Ok();
}

}  // namespace

StatusOr<std::string> Train(const RunConfig& cfg, const TrainOptions& options) {
  Communicator* comm = options.comm;
  ATOLL_RETURN_IF_ERROR(ValidateParallel(cfg, comm != nullptr ? comm->size() : 1));
  const int rank = comm != nullptr ? comm->rank() : 0;
  const bool leader = rank == 0;
  const int64_t dp = cfg.parallel.dp;
  const bool reproducible = cfg.parallel.reproducible;
  const TrainConfig& tc = cfg.train;
  if (tc.threads > 0) omp_set_num_threads(int(tc.threads));

  ATOLL_ASSIGN_OR_RETURN(TokenFile train_tokens, OpenTokenFile(cfg.data.dir, "train.bin"));
  ATOLL_ASSIGN_OR_RETURN(TokenFile val_tokens, OpenTokenFile(cfg.data.dir, "val.bin"));
  ATOLL_RETURN_IF_ERROR(CheckData(cfg, train_tokens, val_tokens));

  const int seq = cfg.model.seq_len;
  const int micro = int(tc.micro_batch_size);
  const int64_t accum = tc.accumulation_steps();
  const auto layout = ParameterLayout(cfg.model);
  // The samplers' spans point into the mappings, which moving a TokenFile keeps.
  Sampler train_sampler(train_tokens.tokens(), uint64_t(tc.seed), seq);
  Sampler val_sampler(val_tokens.tokens(), uint64_t(tc.seed), seq);
  Run run{
      cfg,
      std::move(train_tokens),
      std::move(val_tokens),
      train_sampler,
      val_sampler,
      GPT<float>(cfg.model, micro),
      AdamW(
          layout,
          {.beta1 = tc.beta1, .beta2 = tc.beta2, .eps = tc.eps, .weight_decay = tc.weight_decay})};
  if (tc.eval_batches > 0)
    run.num_val_windows =
        std::min<size_t>(run.val.NumEvalWindows(), size_t(tc.eval_batches) * size_t(micro));

  int64_t start = 0;
  if (options.resume != nullptr) {
    ATOLL_RETURN_IF_ERROR(Resume(*options.resume, options.resume_path, run));
    start = options.resume->cursor.next_step;
  } else {
    run.model.InitParameters(uint64_t(tc.seed));
  }

  const std::string& out = options.out_dir;
  MetricsLog metrics;
  if (leader) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(out));
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out + "/config.toml", RunConfigToToml(cfg)));
    ATOLL_RETURN_IF_ERROR(metrics.Open(out + "/metrics.jsonl", start));
  }

  // Data parallel: this rank's micro-batches of each step, and the gradient reduction. A single
  // process in the normal mode runs all micro-batches with no reducer.
  const int64_t local_accum = accum / dp;
  const int64_t first_micro = int64_t(rank) * local_accum;
  std::unique_ptr<GradientReducer> reducer;
  if (dp > 1 || reproducible)
    reducer = std::make_unique<GradientReducer>(comm, cfg.model, cfg.parallel.bucket_mb,
                                                reproducible, accum);
  std::vector<double> local_losses(static_cast<size_t>(local_accum));
  std::vector<double> all_losses(static_cast<size_t>(accum));
  double comm_wait_s = 0;  // in GradientReducer::Finish: communication not hidden by backward

  if (leader && dp > 1)
    LogInfo("data parallel: {} ranks, {} micro-batches of {} each per step, {} gradient buckets{}",
            dp, local_accum, micro, reducer->buckets().size(),
            reproducible ? ", reproducible (int64 fixed-point) reduction" : "");
  if (leader)
    LogInfo(
        "training {} parameters ({} layers, {} heads, n_embd {}, seq_len {}) for steps {}..{} "
        "of {}: batch {} = {} x {} micro, {} threads, data {} ({} train / {} val tokens)",
        run.model.num_params(), cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, seq,
        start + 1, tc.steps, tc.steps, tc.batch_size, accum, micro, omp_get_max_threads(),
        cfg.data.dir, run.train_tokens.size(), run.val_tokens.size());

  const size_t n = run.model.num_params();
  std::vector<int32_t> inputs(size_t(micro) * seq), targets(size_t(micro) * seq);
  uint64_t tokens = uint64_t(start) * uint64_t(tc.batch_size) * uint64_t(seq);
  ProgressBar progress(start, tc.steps, stderr);
  for (int64_t s = start; s < tc.steps; ++s) {
    const double t0 = NowSeconds();
    run.model.ZeroGrad();
    if (reducer != nullptr) {
      if (reproducible)
        reducer->BeginFixedPoint();
      else
        reducer->Begin();
    }
    for (int64_t lj = 0; lj < local_accum; ++lj) {
      const int64_t j = first_micro + lj;
      for (int i = 0; i < micro; ++i) {
        const uint64_t position = uint64_t(j) * uint64_t(micro) + uint64_t(i);
        run.train.Window(uint64_t(s), position, inputs.data() + size_t(i) * seq,
                         targets.data() + size_t(i) * seq);
      }
      local_losses[size_t(lj)] =
          double(run.model.Forward(inputs.data(), targets.data(), micro, seq));
      // With a reducer, the last micro-batch's backward starts each bucket's all-reduce as it
      // completes. Reproducible mode: every micro-batch's gradient alone (Add zeroes the buffer
      // after accumulating it in fixed point; the hook does the same per bucket for the last one).
      const bool hooked = reducer != nullptr && lj + 1 == local_accum;
      if (hooked) run.model.set_backward_hook(reducer->Hook(run.model.grads()));
      run.model.Backward(1.0f / float(accum));
      if (hooked) run.model.set_backward_hook(nullptr);
      if (reproducible && lj + 1 < local_accum)
        ATOLL_RETURN_IF_ERROR(reducer->Add(run.model.grads()));
    }
    if (reducer != nullptr) {
      ATOLL_RETURN_IF_ERROR(reducer->Finish(run.model.grads()));
      comm_wait_s += reducer->last_wait_s();
    }
    // Every micro-batch's loss, summed in global order (rank r holds micro-batches r*k/D ...).
    if (comm != nullptr && comm->size() > 1) {
      ATOLL_RETURN_IF_ERROR(
          comm->AllGather(std::span<const double>(local_losses), std::span<double>(all_losses)));
    } else {
      all_losses = local_losses;
    }
    double loss_sum = 0.0;
    for (double l : all_losses) loss_sum += l;
    StepMetrics m;
    m.step = s + 1;
    m.loss = loss_sum / double(accum);
    m.grad_norm = GradNorm(run.model.grads(), n);
    m.lr = LearningRate(tc, s);
    if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
      if (leader) progress.Finish();
      return Status::Internal(
          fmt::format("training diverged at step {}: loss {}, gradient norm {} (lower train.lr?)",
                      s + 1, m.loss, m.grad_norm));
    }
    run.optimizer.Step(run.model.params(), run.model.grads(), m.lr,
                       ClipScale(m.grad_norm, tc.grad_clip));
    const double dt = NowSeconds() - t0;
    tokens += uint64_t(tc.batch_size) * uint64_t(seq);
    m.tokens = tokens;
    m.step_ms = dt * 1e3;
    m.tokens_per_s = double(tc.batch_size) * seq / dt;
    const bool last = s + 1 == tc.steps;
    if (!leader) continue;  // the replicas hold the same parameters; rank 0 reports and saves
    if (run.num_val_windows > 0 && (last || (tc.eval_every > 0 && (s + 1) % tc.eval_every == 0)))
      m.val_loss = EvalLoss(run.model, run.val, run.num_val_windows, micro, /*with_grads=*/false);
    ATOLL_RETURN_IF_ERROR(metrics.Append(m));
    if (options.progress) progress.Update(m);
    if (tc.checkpoint_every > 0 && (s + 1) % tc.checkpoint_every == 0)
      ATOLL_RETURN_IF_ERROR(
          WriteCheckpoint(fmt::format("{}/checkpoint-{}", out, s + 1), Source(cfg, run, s + 1)));
  }
  const std::string final_dir = out + "/checkpoint";
  if (leader && dp > 1 && tc.steps > start)
    LogInfo("data parallel: {:.2f} ms per step waiting for gradient all-reduces after backward",
            comm_wait_s * 1e3 / double(tc.steps - start));
  if (!leader) return final_dir;
  if (options.progress) progress.Finish();
  ATOLL_RETURN_IF_ERROR(WriteCheckpoint(final_dir, Source(cfg, run, tc.steps)));
  return final_dir;
}

}  // namespace atl
