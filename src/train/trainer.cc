#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/grad_norm.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/evaluate.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/strategy.h"

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

ModelShard ShardOf(const RunConfig& cfg, int tp_rank, int stage) {
  const LayerRange layers = StageLayers(cfg.model.n_layer, int(cfg.parallel.pp), stage);
  return ModelShard{tp_rank, int(cfg.parallel.tp), layers.begin, layers.end};
}

AdamW::Hyper HyperOf(const TrainConfig& tc) {
  return {.beta1 = tc.beta1, .beta2 = tc.beta2, .eps = tc.eps, .weight_decay = tc.weight_decay};
}

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
  std::vector<PipeOp> schedule;
  std::unique_ptr<GPT<float>> model;  // this rank's shard
  std::unique_ptr<GradientReducer> reducer;
  std::unique_ptr<AdamW> optimizer;
  std::vector<std::pair<size_t, size_t>> norm_ranges;  // NormRanges of the shard
  std::unique_ptr<GPT<float>> eval_model;              // rank 0, when the shard is not whole
  size_t num_val_windows = 0;
  double comm_wait_s = 0;  // in GradientReducer::Finish: communication not hidden by backward
  // Several sites: this site, and on its leader the WAN among the sites' leaders.
  int sites = 1, site = 0;
  Communicator* wan = nullptr;
  double wan_s = 0;        // the leader's time in WAN all-reduces, this step
  double wan_total_s = 0;  // ... and over the run
  bool sync = true;        // world.strategy == "sync" (or a single site)
  float loss_scale = 1;    // backward's: 1 / the micro-batches whose mean loss is the objective
};

bool Zero(const Run& run) { return run.cfg.parallel.zero && run.reducer != nullptr; }

// Throws the status of a failed tensor-parallel all-reduce out of the model's forward/backward.
void ThrowIfError(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

// The optimizer moments in the shard's layout (ZeRO: gathered from the dp replicas; collective
// over the dp group).
Status LocalMoments(Run& run, std::vector<float>* m, std::vector<float>* v) {
  const size_t n = run.model->num_params();
  m->assign(n, 0.0f);
  v->assign(n, 0.0f);
  if (!Zero(run)) {
    std::copy(run.optimizer->m(), run.optimizer->m() + n, m->begin());
    std::copy(run.optimizer->v(), run.optimizer->v() + n, v->begin());
    return Status::Ok();
  }
  ATOLL_RETURN_IF_ERROR(run.reducer->AllGather(m->data(), run.optimizer->m()));
  return run.reducer->AllGather(v->data(), run.optimizer->v());
}

// The whole model's parameters (and moments) on world rank 0, assembled from every shard of
// data-parallel replica 0. Collective over the world; other ranks' outputs are left empty.
Status GatherWhole(Run& run, bool with_moments, std::vector<float>* params, std::vector<float>* m,
                   std::vector<float>* v) {
  const Mesh& mesh = run.mesh;
  const GPTConfig& mc = run.cfg.model;
  std::vector<float> local_m, local_v;
  if (with_moments) ATOLL_RETURN_IF_ERROR(LocalMoments(run, &local_m, &local_v));
  const size_t n = run.model->num_params();
  const float* local[3] = {run.model->params(), local_m.data(), local_v.data()};
  const int parts = with_moments ? 3 : 1;
  if (mesh.rank() != 0) {
    if (mesh.dp_rank() == 0)
      for (int i = 0; i < parts; ++i)
        ATOLL_RETURN_IF_ERROR(mesh.world()->Send(std::span<const float>(local[i], n), 0, 100 + i));
    return Status::Ok();
  }
  std::vector<float>* whole[3] = {params, m, v};
  for (int i = 0; i < parts; ++i) whole[i]->assign(NumParameters(mc), 0.0f);
  for (int stage = 0; stage < mesh.pp(); ++stage) {
    for (int t = 0; t < mesh.tp(); ++t) {
      const ModelShard shard = ShardOf(run.cfg, t, stage);
      const int from = mesh.RankOf(0, t, stage);
      const auto layout = ShardLayout(mc, shard);
      const size_t count = layout.back().offset + layout.back().numel;
      std::vector<float> buf;
      for (int i = 0; i < parts; ++i) {
        const float* src = local[i];
        if (from != 0) {
          buf.resize(count);
          ATOLL_RETURN_IF_ERROR(mesh.world()->Recv(std::span<float>(buf), from, 100 + i));
          src = buf.data();
        }
        CopyShard(mc, shard, whole[i]->data(), const_cast<float*>(src), /*to_shard=*/false);
      }
    }
  }
  return Status::Ok();
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
  if (ck.exp_avg.size() != NumParameters(run.cfg.model))
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
  // The checkpoint holds the whole model whatever layout wrote it: take this rank's part.
  const GPTConfig& mc = run.cfg.model;
  const ModelShard& shard = run.model->shard();
  const size_t n = run.model->num_params();
  std::vector<float> whole(ck.params.begin(), ck.params.end());
  CopyShard(mc, shard, whole.data(), run.model->params(), true);
  std::vector<float> m(n), v(n);
  whole.assign(ck.exp_avg.begin(), ck.exp_avg.end());
  CopyShard(mc, shard, whole.data(), m.data(), true);
  whole.assign(ck.exp_avg_sq.begin(), ck.exp_avg_sq.end());
  CopyShard(mc, shard, whole.data(), v.data(), true);
  if (Zero(run)) {
    for (const auto& o : run.reducer->owned()) {
      std::copy_n(m.data() + o.local_begin, o.length, run.optimizer->m() + o.shard_begin);
      std::copy_n(v.data() + o.local_begin, o.length, run.optimizer->v() + o.shard_begin);
    }
  } else {
    std::copy(m.begin(), m.end(), run.optimizer->m());
    std::copy(v.begin(), v.end(), run.optimizer->v());
  }
  run.optimizer->set_step_count(ck.optimizer_steps);
  // Keys that change the run's trajectory: resuming with them changed is allowed, but the result
  // is no longer the run the checkpoint came from.
  const TrainConfig &a = ck.config.train, &b = run.cfg.train;
  if (run.mesh.rank() == 0 &&
      (a.seed != b.seed || a.batch_size != b.batch_size || a.lr != b.lr || a.min_lr != b.min_lr ||
       a.warmup_steps != b.warmup_steps || a.steps != b.steps || a.weight_decay != b.weight_decay ||
       a.beta1 != b.beta1 || a.beta2 != b.beta2 || a.eps != b.eps || a.grad_clip != b.grad_clip))
    LogWarning(
        "--resume {}: [train] differs from the checkpoint's; the continuation is not the "
        "run the checkpoint came from",
        path);
  return Status::Ok();
}

// The squared global gradient norm: every element of the whole model once (NormRanges), of the
// reduced gradients (data-parallel replica 0's copy, or with ZeRO each replica's owned pieces),
// summed over the world. Reproducible mode sums in integers (ExactSquareSum), so the value does
// not depend on the layout; the normal mode in double.
StatusOr<double> SquaredGradNorm(Run& run) {
  const Mesh& mesh = run.mesh;
  const bool exact = run.cfg.parallel.reproducible;
  ExactSquareSum sum_exact;
  double sum = 0.0;
  auto add = [&](const float* g, size_t count) {
    if (exact)
      sum_exact.Add(g, count);
    else
      sum += GradSquaredSum(g, count);
  };
  if (Zero(run)) {
    std::vector<std::pair<size_t, size_t>> owned;
    for (const auto& o : run.reducer->owned())
      owned.emplace_back(o.local_begin, o.local_begin + o.length);
    const float* g = run.reducer->shard_grads();
    size_t oi = 0;
    for (const auto& [b, e] : IntersectRanges(run.norm_ranges, owned)) {
      while (run.reducer->owned()[oi].local_begin + run.reducer->owned()[oi].length <= b) ++oi;
      const auto& o = run.reducer->owned()[oi];
      add(g + o.shard_begin + (b - o.local_begin), e - b);
    }
  } else if (mesh.dp_rank() == 0) {
    for (const auto& [b, e] : run.norm_ranges) add(run.model->grads() + b, e - b);
  }
  Communicator* world = mesh.world();
  if (exact) {
    std::vector<int64_t> parts = sum_exact.parts();
    if (world != nullptr && world->size() > 1)
      ATOLL_RETURN_IF_ERROR(world->AllReduce(std::span<int64_t>(parts)));
    return ExactSquareSum::Value(parts, world != nullptr ? world->size() : 1);
  }
  if (world != nullptr && world->size() > 1)
    ATOLL_RETURN_IF_ERROR(world->AllReduce(std::span<double>(&sum, 1)));
  return sum;
}

// One optimizer step's forward and backward passes over this replica's micro-batches, in the
// stage's pipeline schedule, and the gradient reduction. Fills the losses of this replica's
// micro-batches (last stage).
Status ForwardBackward(Run& run, int64_t s, std::vector<double>* local_losses) {
  const RunConfig& cfg = run.cfg;
  const Mesh& mesh = run.mesh;
  GPT<float>& model = *run.model;
  const int seq = cfg.model.seq_len, C = cfg.model.n_embd;
  const int micro = int(cfg.train.micro_batch_size);
  const size_t acts = size_t(micro) * seq * C;
  const bool first = mesh.first_stage(), last = mesh.last_stage();
  const bool reproducible = cfg.parallel.reproducible;
  Communicator* pp = mesh.pp_group();
  const int stage = mesh.pp_rank();
  GradientReducer* reducer = run.reducer.get();

  model.ZeroGrad();
  if (reducer != nullptr) {
    if (reproducible)
      reducer->BeginFixedPoint();
    else
      reducer->Begin();
  }
  std::vector<int32_t> inputs(size_t(micro) * seq), targets(size_t(micro) * seq);
  std::vector<float> recv(pp != nullptr ? acts : 0);
  const int slots = SlotsUsed(run.schedule);
  std::vector<CommHandle> fwd_sends(static_cast<size_t>(slots)),
      bwd_sends(static_cast<size_t>(slots));
  std::vector<std::vector<float>> bwd_bufs(pp != nullptr && !first ? static_cast<size_t>(slots)
                                                                   : 0);
  size_t last_backward = 0;
  for (size_t i = 0; i < run.schedule.size(); ++i)
    if (run.schedule[i].kind == PipeOp::kBackward) last_backward = i;

  for (size_t i = 0; i < run.schedule.size(); ++i) {
    const PipeOp& op = run.schedule[i];
    const int64_t j = run.first_micro + op.micro;  // the micro-batch's index in the whole batch
    const int tag = 2 * op.micro;
    if (op.kind == PipeOp::kForward) {
      if (first || last) {
        for (int w = 0; w < micro; ++w) {
          const uint64_t position = uint64_t(j) * uint64_t(micro) + uint64_t(w);
          run.train.Window(uint64_t(s), position, inputs.data() + size_t(w) * seq,
                           targets.data() + size_t(w) * seq);
        }
      }
      if (!first) ATOLL_RETURN_IF_ERROR(pp->Recv(std::span<float>(recv), stage - 1, tag));
      ATOLL_RETURN_IF_ERROR(fwd_sends[size_t(op.slot)].Wait());  // the slot's previous output
      const float loss = model.ForwardStage(op.slot, inputs.data(), recv.data(),
                                            last ? targets.data() : nullptr, micro, seq);
      if (last) (*local_losses)[size_t(op.micro)] = double(loss);
      if (!last)
        fwd_sends[size_t(op.slot)] =
            pp->ISend(std::span<const float>(model.stage_output(op.slot), acts), stage + 1, tag);
      continue;
    }
    if (!last) ATOLL_RETURN_IF_ERROR(pp->Recv(std::span<float>(recv), stage + 1, tag + 1));
    // With a reducer, the last backward starts each bucket's reduction as its blocks complete.
    // Reproducible mode: every micro-batch's gradient alone (Add zeroes the buffer after
    // accumulating it in fixed point; the hook does the same per bucket for the last one).
    const bool hooked = reducer != nullptr && i == last_backward && cfg.parallel.overlap;
    if (hooked) model.set_backward_hook(reducer->Hook(model.grads()));
    model.BackwardStage(op.slot, recv.data(), run.loss_scale);
    if (hooked) model.set_backward_hook(nullptr);
    if (!first) {
      std::vector<float>& buf = bwd_bufs[size_t(op.slot)];
      ATOLL_RETURN_IF_ERROR(bwd_sends[size_t(op.slot)].Wait());
      buf.assign(model.input_grad(), model.input_grad() + acts);
      bwd_sends[size_t(op.slot)] = pp->ISend(std::span<const float>(buf), stage - 1, tag + 1);
    }
    if (reproducible && i != last_backward) ATOLL_RETURN_IF_ERROR(reducer->Add(model.grads()));
  }
  for (CommHandle& h : fwd_sends) ATOLL_RETURN_IF_ERROR(h.Wait());
  for (CommHandle& h : bwd_sends) ATOLL_RETURN_IF_ERROR(h.Wait());

  // The tied wte: the first stage's embedding gradient plus the last stage's head gradient, on
  // both (before the data-parallel reduction, whose last bucket holds wte; in the reproducible
  // mode the fixed-point reduction comes first).
  const size_t wte = model.layout().front().numel;  // this rank's vocabulary share of wte
  Communicator* embed = mesh.embed_group();
  if (embed != nullptr && !reproducible)
    ATOLL_RETURN_IF_ERROR(embed->AllReduce(std::span<float>(model.grads(), wte)));
  if (reducer != nullptr) {
    ATOLL_RETURN_IF_ERROR(reducer->Finish(model.grads()));
    run.comm_wait_s += reducer->last_wait_s();
  }
  if (embed != nullptr && reproducible)
    ATOLL_RETURN_IF_ERROR(embed->AllReduce(std::span<float>(model.grads(), wte)));
  return Status::Ok();
}

// Several sites: the leader sums the site's (already site-reduced) vector with the other sites'
// over the WAN, then every rank of the site takes the leader's result.
template <class T>
Status WorldSum(Run& run, std::span<T> data) {
  if (run.sites == 1) return Status::Ok();
  if (run.wan != nullptr) {
    const double t0 = NowSeconds();
    ATOLL_RETURN_IF_ERROR(run.wan->AllReduce(data).WithContext("the WAN all-reduce across sites"));
    run.wan_s += NowSeconds() - t0;
    run.wan_total_s += NowSeconds() - t0;
  }
  if (run.mesh.world() != nullptr && run.mesh.size() > 1)
    ATOLL_RETURN_IF_ERROR(run.mesh.world()->Broadcast(data, 0));
  return Status::Ok();
}

CheckpointSource Source(const RunConfig& cfg, const Run& run, int64_t completed,
                        const float* params, const float* m, const float* v) {
  CheckpointSource src;
  src.config = &cfg;
  src.cursor.next_step = completed;
  src.cursor.tokens_seen =
      uint64_t(completed) * uint64_t(cfg.train.batch_size) * uint64_t(cfg.model.seq_len);
  src.cursor.train_checksum = run.train_tokens.checksum();
  src.cursor.val_checksum = run.val_tokens.checksum();
  src.cursor.train_tokens = run.train_tokens.size();
  src.cursor.val_tokens = run.val_tokens.size();
  src.optimizer_steps = run.optimizer->step_count();
  src.params = params;
  src.exp_avg = m;
  src.exp_avg_sq = v;
  return src;
}

// Writes a checkpoint of the whole model (collective: every rank takes part in the gather; rank 0
// writes).
Status SaveCheckpoint(Run& run, const std::string& dir, int64_t completed) {
  if (run.model->shard().whole(run.cfg.model) && !Zero(run)) {
    if (run.mesh.rank() != 0) return Status::Ok();
    return WriteCheckpoint(dir, Source(run.cfg, run, completed, run.model->params(),
                                       run.optimizer->m(), run.optimizer->v()));
  }
  std::vector<float> params, m, v;
  ATOLL_RETURN_IF_ERROR(GatherWhole(run, /*with_moments=*/true, &params, &m, &v));
  if (run.mesh.rank() != 0) return Status::Ok();
  return WriteCheckpoint(dir, Source(run.cfg, run, completed, params.data(), m.data(), v.data()));
}

// The validation loss on rank 0 (collective when the model is sharded); NaN elsewhere.
StatusOr<double> Validate(Run& run) {
  const int micro = int(run.cfg.train.micro_batch_size);
  GPT<float>* model = run.model.get();
  if (!model->shard().whole(run.cfg.model)) {
    std::vector<float> params, unused_m, unused_v;
    ATOLL_RETURN_IF_ERROR(GatherWhole(run, /*with_moments=*/false, &params, &unused_m, &unused_v));
    if (run.mesh.rank() != 0) return std::nan("");
    if (run.eval_model == nullptr)
      run.eval_model = std::make_unique<GPT<float>>(run.cfg.model, micro);
    std::copy(params.begin(), params.end(), run.eval_model->params());
    model = run.eval_model.get();
  }
  if (run.mesh.rank() != 0) return std::nan("");
  return EvalLoss(*model, run.val, run.num_val_windows, micro, /*with_grads=*/false);
}

// A rejoining site's leader: reserves its place at exchange J = (the latest one a live site has
// begun) + 2, so the others wait for it there and not before, then waits for the state that
// leads into J (published when exchange J - 1 is merged), which it fetches. The others wait at J
// about as long as the fetch takes: the newcomer trains its H steps beside theirs. When they
// began J meanwhile (a race), it tries again with a later J.
StatusOr<LowCommState> TakeOver(const TrainOptions& o, const LowCommSync& sync, size_t n,
                                int site) {
  if (!o.fetch || !o.join || !o.current_round)
    return Status::InvalidArgument("rejoin: no way to fetch the state or to join the world");
  const std::string who = fmt::format("site {}: rejoin", site);
  const double deadline = NowSeconds() + o.rejoin_timeout_s;
  int64_t J = -1;
  for (;;) {
    ATOLL_ASSIGN_OR_RETURN(const int64_t begun, o.current_round());
    J = std::max<int64_t>(begun, -1) + 2;
    if (sync.StepOfExchange(J) < 0)
      return Status::Unavailable(fmt::format(
          "{}: too close to the end of the run: exchange round {} would be past the last step", who,
          J));
    Status joined = o.join(kRoundsPerExchange * J);
    if (joined.ok()) break;
    if (joined.code() != StatusCode::kNotFound || NowSeconds() >= deadline)
      return joined.WithContext(who);
    LogInfo("{}: too late for exchange round {} ({}); trying the next", who, J, joined.message());
  }
  LogInfo("{}: registered for exchange round {} (after step {}); waiting for its state", who, J,
          sync.StepOfExchange(J));
  // States are published under their exchange round: ask for J's alone (nothing is sent until
  // a live site has it).
  for (;;) {
    StatusOr<std::pair<uint64_t, std::string>> got = o.fetch(uint64_t(J));
    if (!got.ok()) {
      if (got.status().code() != StatusCode::kNotFound || NowSeconds() >= deadline)
        return got.status().WithContext(who + ": fetching the state");
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    ATOLL_ASSIGN_OR_RETURN(LowCommState st, DecodeLowCommState(got->second, n));
    if (st.rounds != J || got->first != uint64_t(J))
      return Status::Internal(fmt::format(
          "{}: a live site's state is for exchange round {}, not round {} it should wait at", who,
          st.rounds, J));
    LogInfo("{}: took over at step {} ({:.1f} MB of state fetched); joining at exchange round {}",
            who, st.completed, double(got->second.size()) / 1e6, J);
    return st;
  }
}

}  // namespace

StatusOr<std::string> Train(const RunConfig& cfg, const TrainOptions& options) {
  Communicator* comm = options.comm;
  ATOLL_RETURN_IF_ERROR(ValidateParallel(cfg, comm != nullptr ? comm->size() : 1));
  const ParallelConfig& pc = cfg.parallel;
  const TrainConfig& tc = cfg.train;
  if (tc.threads > 0) omp_set_num_threads(int(tc.threads));

  ATOLL_ASSIGN_OR_RETURN(TokenFile train_tokens, OpenTokenFile(cfg.data.dir, "train.bin"));
  ATOLL_ASSIGN_OR_RETURN(TokenFile val_tokens, OpenTokenFile(cfg.data.dir, "val.bin"));
  ATOLL_RETURN_IF_ERROR(CheckData(cfg, train_tokens, val_tokens));
  ATOLL_ASSIGN_OR_RETURN(PipeScheduleKind schedule_kind, ParsePipeSchedule(pc.schedule));
  ATOLL_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Make(comm, int(pc.dp), int(pc.tp), int(pc.pp)));
  Run run(cfg, std::move(train_tokens), std::move(val_tokens), std::move(mesh));
  const Mesh& me = run.mesh;
  const bool leader = me.rank() == 0;

  const int seq = cfg.model.seq_len;
  const int micro = int(tc.micro_batch_size);
  run.accum = tc.accumulation_steps();
  run.sites = int(cfg.world.sites);
  run.site = options.site;
  run.wan = options.wan;
  const std::string& strategy = cfg.world.strategy;
  run.sync = run.sites == 1 || strategy == "sync";
  // The objective of a site's replica: the mean loss over the whole batch (sync), or over the
  // site's share of it (the other strategies: sites train apart between exchanges).
  run.loss_scale = 1.0f / float(run.sync ? run.accum : run.accum / run.sites);
  if (run.sites > 1 && leader) {
    if (run.sync && run.wan == nullptr)
      return Status::InvalidArgument("world.sites > 1 needs the WAN among the site leaders");
    if ((strategy == "diloco" || strategy == "streaming") && !options.average)
      return Status::InvalidArgument(
          fmt::format("world.strategy = \"{}\" needs the exchange among the sites", strategy));
    if (strategy == "async" && options.ps == nullptr)
      return Status::InvalidArgument("world.strategy = \"async\" needs the parameter server");
  }
  // Replicas: the dp replicas of every site, site-major.
  run.local_accum = run.accum / (pc.dp * run.sites);
  run.first_micro = (int64_t(run.site) * pc.dp + me.dp_rank()) * run.local_accum;
  run.schedule = MakePipeSchedule(schedule_kind, me.pp(), me.pp_rank(), int(run.local_accum));
  const ModelShard shard = ShardOf(cfg, me.tp_rank(), me.pp_rank());
  run.model = std::make_unique<GPT<float>>(cfg.model, micro, shard, SlotsUsed(run.schedule));
  if (Communicator* tp = me.tp_group()) {
    run.model->set_tensor_parallel(
        [tp](float* data, size_t n) { ThrowIfError(tp->AllReduce(std::span<float>(data, n))); });
  }
  run.norm_ranges = NormRanges(cfg.model, shard);
  // A single process in the normal mode needs no reducer.
  if (pc.dp > 1 || pc.reproducible)
    run.reducer =
        std::make_unique<GradientReducer>(me.dp_group(), run.model->layout(),
                                          GradientReducer::Options{.bucket_mb = pc.bucket_mb,
                                                                   .reproducible = pc.reproducible,
                                                                   .micro_batches = run.accum,
                                                                   .zero = pc.zero});
  if (Zero(run)) {
    std::vector<std::pair<size_t, size_t>> owned;
    for (const auto& o : run.reducer->owned()) owned.emplace_back(o.local_begin, o.length);
    run.optimizer = std::make_unique<AdamW>(run.model->layout(), HyperOf(tc), owned);
  } else {
    run.optimizer = std::make_unique<AdamW>(run.model->layout(), HyperOf(tc));
  }
  if (tc.eval_batches > 0)
    run.num_val_windows =
        std::min<size_t>(run.val.NumEvalWindows(), size_t(tc.eval_batches) * size_t(micro));

  int64_t start = 0;
  if (options.resume != nullptr) {
    ATOLL_RETURN_IF_ERROR(Resume(*options.resume, options.resume_path, run));
    start = options.resume->cursor.next_step;
  } else {
    run.model->InitParameters(uint64_t(tc.seed));
  }

  // The strategy across sites (train/strategy.h): every rank keeps the schedule, the leader acts.
  const size_t n_params = run.model->num_params();
  std::unique_ptr<LowCommSync> lowcomm;
  std::unique_ptr<AsyncClient> async;
  if (!run.sync) {
    if (options.resume != nullptr)
      return Status::InvalidArgument(fmt::format(
          "--resume: world.strategy = \"{}\" keeps state across sites (outer momentum, the "
          "global parameters) that checkpoints do not hold yet; resume is for sync runs",
          strategy));
    const WorldConfig& w = cfg.world;
    ATOLL_ASSIGN_OR_RETURN(const Codec codec, ParseCodec(w.codec));
    if (strategy == "async") {
      async =
          std::make_unique<AsyncClient>(AsyncClient::Options{.site = run.site,
                                                             .sites = run.sites,
                                                             .inner_steps = w.diloco.inner_steps,
                                                             .max_staleness = w.async.max_staleness,
                                                             .codec = codec},
                                        options.ps, n_params);
      if (leader && options.rejoin) {
        // A new process for a lost site: a member from the barrier at the end on (the only
        // round of async), then it goes on after the site's last decided push.
        if (!options.join) return Status::InvalidArgument("rejoin: no way to join the world");
        ATOLL_RETURN_IF_ERROR(
            options.join(tc.steps).WithContext(fmt::format("site {}: rejoin", run.site)));
      }
      if (leader) ATOLL_RETURN_IF_ERROR(async->Start(run.model->params()));
      if (me.size() > 1)
        ATOLL_RETURN_IF_ERROR(
            me.world()->Broadcast(std::span<float>(run.model->params(), n_params), 0));
    } else {
      const bool streaming = strategy == "streaming";
      LowCommOptions lo;
      lo.fragments = streaming ? int(w.streaming.fragments) : 1;
      lo.inner_steps = w.diloco.inner_steps;
      lo.overlap = streaming ? w.streaming.overlap_steps : 0;
      lo.alpha = streaming ? float(w.streaming.alpha) : 0.0f;
      lo.outer_lr = float(w.diloco.outer_lr);
      lo.outer_momentum = float(w.diloco.outer_momentum);
      lo.total_steps = tc.steps;
      lo.final_sync = streaming || tc.steps % w.diloco.inner_steps != 0;
      lowcomm = std::make_unique<LowCommSync>(lo, options.average, run.model->params(), n_params);
    }
  }
  if (options.rejoin) {
    if (lowcomm == nullptr && async == nullptr)
      return Status::InvalidArgument(fmt::format(
          "--rejoin: world.strategy = \"{}\": only diloco, streaming and async runs can be "
          "rejoined",
          strategy));
    // Where the leader goes on from, to the site's other ranks (async: the parameters pulled
    // at Start are shared already; diloco, streaming: those of the state taken over).
    double at = 0;
    if (leader && lowcomm != nullptr) {
      ATOLL_ASSIGN_OR_RETURN(const LowCommState st,
                             TakeOver(options, *lowcomm, n_params, run.site));
      lowcomm->Restore(st);
      std::copy(st.params.begin(), st.params.end(), run.model->params());
      at = double(st.completed);
    }
    if (leader && async != nullptr) {
      at = double(async->start_step());
      LogInfo("site {}: rejoin: took over after step {} (the site's last push)", run.site,
              async->start_step());
    }
    if (me.size() > 1) {
      ATOLL_RETURN_IF_ERROR(me.world()->Broadcast(std::span<double>(&at, 1), 0));
      if (lowcomm != nullptr)
        ATOLL_RETURN_IF_ERROR(
            me.world()->Broadcast(std::span<float>(run.model->params(), n_params), 0));
    }
    start = int64_t(at);
    if (async != nullptr && start >= tc.steps)
      return Status::Unavailable(fmt::format(
          "site {}: rejoin: the site's pushes already reach the last step {}", run.site, tc.steps));
  }
  // The leader's parameters after a strategy changed them, to the site's other ranks.
  auto share = [&](Range r) -> Status {
    if (me.size() == 1 || r.end == r.begin) return Status::Ok();
    return me.world()->Broadcast(std::span<float>(run.model->params() + r.begin, r.end - r.begin),
                                 0);
  };

  const std::string& out = options.out_dir;
  const std::string ck_dir = options.checkpoint_dir.empty() ? out : options.checkpoint_dir;
  MetricsLog metrics;
  if (leader) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(out));
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out + "/config.toml", RunConfigToToml(cfg)));
    ATOLL_RETURN_IF_ERROR(metrics.Open(out + "/metrics.jsonl", start));
  }
  if (leader && me.size() > 1)
    LogInfo(
        "mesh dp {} x tp {} x pp {}: {} micro-batches of {} per replica per step{}{}{}{}", me.dp(),
        me.tp(), me.pp(), run.local_accum, micro,
        me.pp() > 1 ? fmt::format(", {} pipeline schedule", PipeScheduleName(schedule_kind)) : "",
        run.reducer != nullptr && me.dp() > 1
            ? fmt::format(", {} gradient buckets", run.reducer->buckets().size())
            : "",
        pc.zero && me.dp() > 1 ? ", ZeRO-1 optimizer sharding" : "",
        pc.reproducible ? ", reproducible (int64 fixed-point) reduction" : "");
  if (leader)
    LogInfo(
        "training {} parameters ({} layers, {} heads, n_embd {}, seq_len {}) for steps {}..{} "
        "of {}: batch {} = {} x {} micro, {} threads per rank, data {} ({} train / {} val "
        "tokens)",
        NumParameters(cfg.model), cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd, seq,
        start + 1, tc.steps, tc.steps, tc.batch_size, run.accum, micro, omp_get_max_threads(),
        cfg.data.dir, run.train_tokens.size(), run.val_tokens.size());

  std::vector<double> local_losses(static_cast<size_t>(run.local_accum));
  uint64_t tokens = uint64_t(start) * uint64_t(tc.batch_size) * uint64_t(seq);
  ProgressBar progress(start, tc.steps, stderr);
  for (int64_t s = start; s < tc.steps; ++s) {
    const double t0 = NowSeconds();
    try {
      ATOLL_RETURN_IF_ERROR(ForwardBackward(run, s, &local_losses));
    } catch (const std::runtime_error& e) {  // a failed tensor-parallel all-reduce
      return Status::Internal(fmt::format("step {}: {}", s + 1, e.what()));
    }
    // Every micro-batch's loss, summed in global order (the last stage's tp rank 0 of replica r
    // holds micro-batches r*k/D ...).
    std::vector<double> all_losses(static_cast<size_t>(run.accum), 0.0);
    if (me.last_stage() && me.tp_rank() == 0)
      std::copy(local_losses.begin(), local_losses.end(), all_losses.begin() + run.first_micro);
    if (me.size() > 1) ATOLL_RETURN_IF_ERROR(me.world()->AllReduce(std::span<double>(all_losses)));
    if (run.sites > 1 && run.sync) {
      // The coordinator's round: every live site has reached this step.
      if (run.wan != nullptr && options.round)
        ATOLL_RETURN_IF_ERROR(options.round(s).WithContext(fmt::format("step {}", s + 1)));
      run.wan_s = 0;
      ATOLL_RETURN_IF_ERROR(
          WorldSum(run, std::span<float>(run.model->grads(), run.model->num_params())));
      ATOLL_RETURN_IF_ERROR(WorldSum(run, std::span<double>(all_losses)));
    }
    double loss_sum = 0.0;
    for (double l : all_losses) loss_sum += l;
    StepMetrics m;
    m.step = s + 1;
    m.loss = loss_sum / double(run.sync ? run.accum : run.accum / run.sites);
    ATOLL_ASSIGN_OR_RETURN(const double squared_norm, SquaredGradNorm(run));
    m.grad_norm = std::sqrt(squared_norm);
    m.lr = LearningRate(tc, s);
    if (!std::isfinite(m.loss) || !std::isfinite(m.grad_norm)) {
      if (leader) progress.Finish();
      return Status::Internal(
          fmt::format("training diverged at step {}: loss {}, gradient norm {} (lower train.lr?)",
                      s + 1, m.loss, m.grad_norm));
    }
    const float clip = ClipScale(m.grad_norm, tc.grad_clip);
    if (Zero(run)) {
      run.optimizer->Step(run.model->params(), run.reducer->shard_grads(), m.lr, clip);
      ATOLL_RETURN_IF_ERROR(run.reducer->AllGatherInPlace(run.model->params()));
    } else {
      run.optimizer->Step(run.model->params(), run.model->grads(), m.lr, clip);
    }
    const bool last = s + 1 == tc.steps;
    double wait_s = run.wan_s;
    if (lowcomm != nullptr) {
      if (leader) {
        ATOLL_RETURN_IF_ERROR(lowcomm->AfterStep(s + 1, run.model->params()));
        if (options.publish)
          if (auto state = lowcomm->QuietState(s + 1, run.model->params()))
            options.publish(uint64_t(lowcomm->rounds()), std::move(state));
      }
      for (int f : lowcomm->Merges(s + 1))
        ATOLL_RETURN_IF_ERROR(share(lowcomm->fragments()[size_t(f)]));
      wait_s = lowcomm->last_wait_s();
      if (last) {
        if (leader) ATOLL_RETURN_IF_ERROR(lowcomm->Finish(run.model->params()));
        ATOLL_RETURN_IF_ERROR(share({0, n_params}));
        wait_s += lowcomm->last_wait_s();
      }
    } else if (async != nullptr) {
      if (last) {
        if (leader)
          ATOLL_RETURN_IF_ERROR(async->Finish(s + 1, run.model->params(), options.finish_barrier));
        ATOLL_RETURN_IF_ERROR(share({0, n_params}));
      } else {
        if (leader) ATOLL_RETURN_IF_ERROR(async->AfterStep(s + 1, run.model->params()).status());
        if (async->PullsAt(s + 1)) ATOLL_RETURN_IF_ERROR(share({0, n_params}));
      }
      wait_s = async->last_wait_s();
    }
    const double dt = NowSeconds() - t0;
    tokens += uint64_t(tc.batch_size) * uint64_t(seq);
    m.tokens = tokens;
    m.step_ms = dt * 1e3;
    m.tokens_per_s = double(tc.batch_size) * seq / dt;
    if (run.sites > 1) {
      m.site = run.site;
      m.wan_ms = wait_s * 1e3;
      if (async != nullptr)
        m.wan_bytes_sent = async->bytes_sent();
      else if (options.wan_bytes)
        m.wan_bytes_sent = options.wan_bytes();
      else if (lowcomm != nullptr)
        m.wan_bytes_sent = lowcomm->bytes_sent();
      if (!run.sync) {
        m.sync_bytes_sent = uint64_t(double(s + 1) * 2.0 * double(run.sites - 1) /
                                     double(run.sites) * 4.0 * double(NumParameters(cfg.model)));
        m.outer_rounds = lowcomm != nullptr ? lowcomm->exchanges() : async->pushes();
      }
    }
    if (run.num_val_windows > 0 && run.site == 0 &&
        (last || (tc.eval_every > 0 && (s + 1) % tc.eval_every == 0))) {
      ATOLL_ASSIGN_OR_RETURN(const double val_loss, Validate(run));
      if (leader) m.val_loss = val_loss;
    }
    if (leader) {
      ATOLL_RETURN_IF_ERROR(metrics.Append(m));
      if (options.progress) progress.Update(m);
    }
    if (tc.checkpoint_every > 0 && (s + 1) % tc.checkpoint_every == 0 && run.site == 0)
      ATOLL_RETURN_IF_ERROR(
          SaveCheckpoint(run, fmt::format("{}/checkpoint-{}", ck_dir, s + 1), s + 1));
    if (options.die_after_step == s + 1 && leader) {
      LogWarning("site {}: dying after step {} (fault injection)", run.site, s + 1);
      std::fflush(nullptr);
      std::_Exit(3);
    }
  }
  const std::string final_dir = ck_dir + "/checkpoint";
  if (leader && me.dp() > 1 && tc.steps > start)
    LogInfo("data parallel: {:.2f} ms per step waiting for gradient reductions after backward",
            run.comm_wait_s * 1e3 / double(tc.steps - start));
  if (run.wan != nullptr && run.sync && tc.steps > start)
    LogInfo("site {}: {:.1f} ms per step in the WAN all-reduce across {} sites", run.site,
            run.wan_total_s * 1e3 / double(tc.steps - start), run.sites);
  if (leader && options.progress) progress.Finish();
  if (leader && lowcomm != nullptr)
    LogInfo("site {}: {} exchanges ({}), {:.1f} MB sent over the WAN", run.site,
            lowcomm->exchanges(), strategy, double(lowcomm->bytes_sent()) / 1e6);
  if (leader && async != nullptr)
    LogInfo("site {}: {} pushes ({} refused as stale), {:.1f} MB pushed, {:.1f} MB pulled",
            run.site, async->pushes(), async->refused(), double(async->bytes_sent()) / 1e6,
            double(async->bytes_received()) / 1e6);
  if (run.site == 0) ATOLL_RETURN_IF_ERROR(SaveCheckpoint(run, final_dir, tc.steps));
  return final_dir;
}

}  // namespace atl
