// One rank's part of a training run (train/run.h): its state, the forward and backward passes of
// a step, the gradient norm, resuming, checkpoints and validation.
#include "train/run.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/hash.h"
#include "core/log.h"
#include "parallel/grad_norm.h"
#include "parallel/pipeline.h"
#include "train/evaluate.h"
#include "train/strategies/world_strategy.h"

namespace atl {

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

bool Zero(const Run& run) { return run.cfg.parallel.zero && run.reducer != nullptr; }

void ThrowIfError(const Status& s) {
  if (!s.ok()) throw std::runtime_error(s.ToString());
}

namespace {

// The optimizer moments in the shard's layout (ZeRO: gathered from the dp replicas; collective
// over the dp group).
Status LocalMoments(Run& run, std::vector<float>* m, std::vector<float>* v) {
  const size_t n = run.model->num_params();
  m->assign(n, 0.0f);
  v->assign(n, 0.0f);
  if (!Zero(run)) {
    // Read through the const view: a GPU's moments stay the newer copy (no upload after).
    const AdamW& opt = OptimizerView(run);
    std::copy(opt.m(), opt.m() + n, m->begin());
    std::copy(opt.v(), opt.v() + n, v->begin());
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
  const float* local[3] = {ModelView(run).params(), local_m.data(), local_v.data()};
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

}  // namespace

Status ResumeRun(const Checkpoint& ck, const std::string& path, Run& run) {
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
       a.beta1 != b.beta1 || a.beta2 != b.beta2 || a.eps != b.eps || a.grad_clip != b.grad_clip ||
       a.precision != b.precision || a.attention_backward != b.attention_backward))
    LogWarning(
        "--resume {}: [train] differs from the checkpoint's; the continuation is not the "
        "run the checkpoint came from",
        path);
  return Status::Ok();
}

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
  } else if (mesh.dp_rank() == 0 && run.optimizer->on_device() && !exact) {
    const float* g = run.model->device_grads();  // summed where they are
    for (const auto& [b, e] : run.norm_ranges) sum += DeviceGradSquaredSum(g + b, e - b);
  } else if (mesh.dp_rank() == 0) {
    for (const auto& [b, e] : run.norm_ranges) add(ModelView(run).grads() + b, e - b);
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

FaultKind FaultKindOfOp(GPT<float>::OpKind k) {
  using K = GPT<float>::OpKind;
  return k == K::kGemmForward    ? FaultKind::kGemmForward
         : k == K::kGemmBackward ? FaultKind::kGemmBackward
                                 : FaultKind::kActivation;
}

Status SetUpSdc(Run& run, const std::string& out_dir, bool fresh) {
  const RunConfig& cfg = run.cfg;
  const Mesh& me = run.mesh;
  const ModelShard& shard = run.model->shard();
  const std::string log = me.rank() == 0
                              ? out_dir + "/faults.jsonl"
                              : fmt::format("{}/faults-rank{}.jsonl", out_dir, me.rank());
  if (fresh) std::remove(log.c_str());  // no earlier run's record to mistake for this one's
  if (!cfg.faults.inject.empty()) {
    ATOLL_ASSIGN_OR_RETURN(std::vector<FaultSpec> specs, ParseFaults(cfg.faults.inject));
    auto f = std::make_unique<FaultInjector>(specs, uint64_t(cfg.faults.seed), run.site, me.rank(),
                                             shard.layer_begin, shard.end(cfg.model), log);
    if (SyncOverSites(cfg)) f->set_wan_chunks(SyncWanChunksPerStep(cfg));
    if (!f->empty()) {
      ATOLL_RETURN_IF_ERROR(MakeDirs(out_dir));
      run.faults = std::move(f);
    }
  }
  SdcOptions o;
  o.guard = cfg.sdc.guard;
  o.fingerprints = cfg.sdc.fingerprints;
  o.checksums = cfg.sdc.checksums;
  o.residual = cfg.sdc.checksums && me.tp() == 1;
  o.memory = cfg.sdc.memory;
  o.moments_every = cfg.sdc.moments_every;
  o.guard_options.threshold = cfg.sdc.guard_threshold;
  o.guard_options.window = size_t(cfg.sdc.guard_window);
  o.params_on = run.model->device();
  o.moments_on = run.optimizer->on_device() ? Device::kCuda : Device::kCpu;
  std::vector<int> replica_ranks;
  for (int r = 0; r < me.dp(); ++r)
    replica_ranks.push_back(me.RankOf(r, me.tp_rank(), me.pp_rank()));
  auto monitor =
      std::make_unique<SdcMonitor>(o, run.model->layout(), run.optimizer->size(), run.site,
                                   me.rank(), me.dp_group(), std::move(replica_ranks), Zero(run));
  // Sync sites compare fingerprints over the WAN even with one replica each (set_sites, later).
  if (monitor->active() || (cfg.sdc.fingerprints && SyncOverSites(cfg)))
    run.sdc = std::move(monitor);
  if (cfg.sdc.on_alarm == "redo" || cfg.sdc.audit_every > 0)
    run.trace = std::make_unique<StepTrace>();
  if (cfg.sdc.checksums && run.sdc != nullptr) {
    // Segments never straddle a tensor (an event names it) nor a bucket or a ZeRO piece.
    std::vector<size_t> cuts = run.reducer != nullptr ? run.reducer->Cuts() : std::vector<size_t>{};
    for (const ParamTensor& t : run.model->layout()) cuts.push_back(t.offset);
    run.grad_sums = std::make_unique<GradChecksum>(run.model->num_params(), kGradChecksumChunk,
                                                   std::move(cuts));
    if (run.reducer != nullptr) run.reducer->set_checksum(run.grad_sums.get());
  }
  FaultInjector* faults = run.faults.get();
  SdcMonitor* sdc = cfg.sdc.guard ? run.sdc.get() : nullptr;
  SdcMonitor* checks = cfg.sdc.checksums ? run.sdc.get() : nullptr;
  StepTrace* trace = run.trace.get();
  if (faults == nullptr && sdc == nullptr && checks == nullptr && trace == nullptr)
    return Status::Ok();
  const bool* in_step = &run.in_step;
  const bool* replica_pass = &run.replica_pass;
  // The guard alone reads the GPU's activations where they are (a max |x| per block output); the
  // others read, or write, host copies.
  const bool device_reader = faults == nullptr && checks == nullptr && trace == nullptr;
  run.model->set_op_hook(
      [faults, sdc, checks, trace, in_step, replica_pass](const GPT<float>::OpEvent& e) {
        if (!*in_step) return;
        const FaultKind kind = FaultKindOfOp(e.kind);
        if (faults != nullptr) faults->OnOp(kind, e.layer, e.gemm, e.out, e.n);
        if (*replica_pass) {
          if (trace != nullptr) trace->OnOp(kind, e.layer, e.gemm, e.out, e.n);
          return;
        }
        if (sdc != nullptr && kind == FaultKind::kActivation)
          sdc->OnActivation(e.layer, e.out, e.n, e.on_device);
        if (checks != nullptr) {
          if (kind == FaultKind::kActivation)
            checks->OnResidual(e.layer, e.out, e.a, e.rows, e.cols);
          else
            checks->OnGemm(kind, e.layer, e.gemm, e.out, e.a, e.w, e.bias, e.rows, e.inner, e.cols);
        }
        if (trace != nullptr) trace->OnOp(kind, e.layer, e.gemm, e.out, e.n);
      },
      device_reader);
  return Status::Ok();
}

void InjectBufferFaults(Run& run, FaultKind where, int64_t s) {
  FaultInjector* f = run.faults.get();
  if (f == nullptr) return;
  if (where == FaultKind::kGrad) {
    if (Zero(run))
      f->OnBuffer(FaultKind::kGrad, s, run.reducer->shard_grads(), run.optimizer->size());
    else
      f->OnBuffer(FaultKind::kGrad, s, run.model->grads(), run.model->num_params());
    return;
  }
  f->OnBuffer(FaultKind::kParam, s, run.model->params(), run.model->num_params());
  f->OnBuffer(FaultKind::kMoment, s, run.optimizer->m(), run.optimizer->size(), 'm');
  f->OnBuffer(FaultKind::kMoment, s, run.optimizer->v(), run.optimizer->size(), 'v');
}

void CheckReducedGradient(Run& run, int replicas) {
  const GradChecksum* sums = run.grad_sums.get();
  if (sums == nullptr || run.sdc == nullptr) return;
  GradChecksum::Mismatch mm;
  // Pipeline stages in the reproducible mode add the tied wte's two halves after the reduction.
  const size_t from = run.mesh.embed_group() != nullptr && run.cfg.parallel.reproducible
                          ? run.model->layout().front().numel
                          : 0;
  if (Zero(run)) {
    const float* shard = run.reducer->shard_grads();
    for (const OwnedRange& o : run.reducer->owned()) {
      const size_t b = std::max(o.local_begin, from), e = o.local_begin + o.length;
      if (b < e) sums->Check(shard + o.shard_begin + (b - o.local_begin), b, e, replicas, &mm);
    }
  } else {
    sums->Check(run.model->grads() + from, from, run.model->num_params(), replicas, &mm);
  }
  run.sdc->OnReducedGradient(mm, sums->seconds());
}

Status ForwardBackward(Run& run, int64_t s, std::vector<double>* local_losses,
                       std::span<const int64_t> firsts, std::span<const int64_t> counts) {
  const int64_t own[] = {run.first_micro};
  if (firsts.empty()) firsts = own;
  // Where each block's losses start in local_losses, and the blocks' schedules (world.balance:
  // a block of any size, one micro-batch after the other; pp = 1).
  std::vector<size_t> offset(firsts.size() + 1, 0);
  std::vector<std::vector<PipeOp>> sized(counts.size());
  for (size_t b = 0; b < firsts.size(); ++b) {
    const int64_t n = counts.empty() ? run.local_accum : counts[b];
    offset[b + 1] = offset[b] + size_t(n);
    if (!counts.empty()) sized[b] = MakePipeSchedule(PipeScheduleKind::k1F1B, 1, 0, int(n));
  }
  local_losses->assign(offset.back(), 0.0);
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
  if (run.trace != nullptr) run.trace->Clear();
  // One process in the normal mode has no reducer: the checksum records the whole gradient.
  GradChecksum* sums = reducer == nullptr && !run.replica_pass ? run.grad_sums.get() : nullptr;
  if (sums != nullptr) sums->Begin();
  run.in_step = true;
  struct InStep {
    bool* on;
    ~InStep() { *on = false; }
  } in_step{&run.in_step};
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
  // Block after block (its own micro-batches, then any it takes over), each in the schedule; the
  // reduction starts in the last block's last backward.
  const double t_passes = NowSeconds();
  for (size_t b = 0; b < firsts.size(); ++b) {
    const std::vector<PipeOp>& schedule = counts.empty() ? run.schedule : sized[b];
    size_t last_backward = 0;
    for (size_t i = 0; i < schedule.size(); ++i)
      if (schedule[i].kind == PipeOp::kBackward) last_backward = i;
    for (size_t i = 0; i < schedule.size(); ++i) {
      const bool final_backward = b + 1 == firsts.size() && i == last_backward;
      const PipeOp& op = schedule[i];
      const int64_t j = firsts[b] + op.micro;  // the micro-batch's index in the whole batch
      const int tag = 2 * op.micro;
      if (run.faults != nullptr) run.faults->At(s, j);
      if (run.trace != nullptr) run.trace->At(j);
      if (run.sdc != nullptr) run.sdc->At(j);
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
        if (last) (*local_losses)[offset[b] + size_t(op.micro)] = double(loss);
        if (!last)
          fwd_sends[size_t(op.slot)] =
              pp->ISend(std::span<const float>(model.stage_output(op.slot), acts), stage + 1, tag);
        continue;
      }
      if (!last) ATOLL_RETURN_IF_ERROR(pp->Recv(std::span<float>(recv), stage + 1, tag + 1));
      // With a reducer, the last backward starts each bucket's reduction as its blocks complete.
      // Reproducible mode: every micro-batch's gradient alone (Add zeroes the buffer after
      // accumulating it in fixed point; the hook does the same per bucket for the last one).
      // Not over NCCL: GPT's backward hook on the GPU sees host copies of the gradients.
      const bool hooked =
          reducer != nullptr && final_backward && cfg.parallel.overlap && !reducer->device_memory();
      if (hooked) model.set_backward_hook(reducer->Hook(model.host_grads_buffer()));
      model.BackwardStage(op.slot, recv.data(), run.loss_scale);
      if (hooked) model.set_backward_hook(nullptr);
      if (!first) {
        std::vector<float>& buf = bwd_bufs[size_t(op.slot)];
        ATOLL_RETURN_IF_ERROR(bwd_sends[size_t(op.slot)].Wait());
        buf.assign(model.input_grad(), model.input_grad() + acts);
        bwd_sends[size_t(op.slot)] = pp->ISend(std::span<const float>(buf), stage - 1, tag + 1);
      }
      if (reproducible && reducer != nullptr && !final_backward) {
        ATOLL_RETURN_IF_ERROR(reducer->Add(model.grads()));  // which zeroes the host's copy
        // On the GPU: zeroed there too, so the next backward uploads nothing.
        if (model.device() == Device::kCuda) model.ZeroGrad();
      }
    }
  }
  run.passes_s = NowSeconds() - t_passes;
  for (CommHandle& h : fwd_sends) ATOLL_RETURN_IF_ERROR(h.Wait());
  for (CommHandle& h : bwd_sends) ATOLL_RETURN_IF_ERROR(h.Wait());

  // The tied wte: the first stage's embedding gradient plus the last stage's head gradient, on
  // both (before the data-parallel reduction, whose last bucket holds wte; in the reproducible
  // mode the fixed-point reduction comes first).
  const size_t wte = model.layout().front().numel;  // this rank's vocabulary share of wte
  Communicator* embed = mesh.embed_group();
  const bool on_gpu = reducer != nullptr && reducer->device_memory();
  // A hooked backward (a host-memory reducer, overlapped) left the gradients on the host, its
  // buckets' reductions possibly still writing there: wte is summed there too (in the last
  // bucket, which starts in Finish). Otherwise a GPU rank's gradients are on its GPU.
  const bool grads_on_gpu =
      model.device() == Device::kCuda && !(reducer != nullptr && cfg.parallel.overlap && !on_gpu);
  if (embed != nullptr && !reproducible) {
    if (run.embed_nccl != nullptr && grads_on_gpu) {  // summed where it is
      ATOLL_RETURN_IF_ERROR(
          run.embed_nccl->AllReduce(std::span<float>(model.mutable_device_grads(), wte)));
    } else if (grads_on_gpu) {  // wte's gradient alone through the host
      float* g = model.mutable_device_grads();
      std::vector<float> host(wte);
      CopyOut(Device::kCuda, host.data(), g, wte);
      ATOLL_RETURN_IF_ERROR(embed->AllReduce(std::span<float>(host)));
      CopyIn(Device::kCuda, g, host.data(), wte);
    } else {
      ATOLL_RETURN_IF_ERROR(embed->AllReduce(std::span<float>(model.grads(), wte)));
    }
  }
  if (reducer != nullptr) {
    // Over NCCL the GPU's gradients are summed where they are (after the backward's kernels, so
    // that the wait is the reduction's alone).
    if (on_gpu) SynchronizeDevice();
    ATOLL_RETURN_IF_ERROR(reducer->Finish(on_gpu ? model.mutable_device_grads() : model.grads()));
    run.comm_wait_s += reducer->last_wait_s();
  }
  if (embed != nullptr && reproducible)
    ATOLL_RETURN_IF_ERROR(embed->AllReduce(std::span<float>(model.grads(), wte)));
  if (sums != nullptr) sums->Predict(model.grads(), 0, model.num_params());
  return Status::Ok();
}

Status ReplicaPass(Run& run, int64_t s, int64_t first) {
  const int64_t own_first = run.first_micro;
  std::unique_ptr<GradientReducer> reducer = std::move(run.reducer);  // no reduction
  run.first_micro = first;
  run.replica_pass = true;
  std::vector<double> losses(static_cast<size_t>(run.local_accum));
  Status st;
  try {
    st = ForwardBackward(run, s, &losses);
  } catch (const std::runtime_error& e) {  // a failed tensor-parallel all-reduce
    st = Status::Internal(
        fmt::format("step {}: the peer check's recomputation: {}", s + 1, e.what()));
  }
  run.replica_pass = false;
  run.first_micro = own_first;
  run.reducer = std::move(reducer);
  if (st.ok() && run.trace != nullptr) run.trace->SetLosses(losses, first);
  return st;
}

namespace {

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

}  // namespace

Status SaveCheckpoint(Run& run, const std::string& dir, int64_t completed) {
  if (run.model->shard().whole(run.cfg.model) && !Zero(run)) {
    if (run.mesh.rank() != 0) return Status::Ok();
    return WriteCheckpoint(dir, Source(run.cfg, run, completed, ModelView(run).params(),
                                       OptimizerView(run).m(), OptimizerView(run).v()));
  }
  std::vector<float> params, m, v;
  ATOLL_RETURN_IF_ERROR(GatherWhole(run, /*with_moments=*/true, &params, &m, &v));
  if (run.mesh.rank() != 0) return Status::Ok();
  return WriteCheckpoint(dir, Source(run.cfg, run, completed, params.data(), m.data(), v.data()));
}

StatusOr<double> Validate(Run& run) {
  const int micro = int(run.cfg.train.micro_batch_size);
  GPT<float>* model = run.model.get();
  if (!model->shard().whole(run.cfg.model)) {
    std::vector<float> params, unused_m, unused_v;
    ATOLL_RETURN_IF_ERROR(GatherWhole(run, /*with_moments=*/false, &params, &unused_m, &unused_v));
    if (run.mesh.rank() != 0) return std::nan("");
    if (run.eval_model == nullptr) {  // on the rank's device (a GPU: a whole model beside it)
      try {
        run.eval_model = std::make_unique<GPT<float>>(run.cfg.model, micro, ModelShard{}, 1,
                                                      run.model->device());
        // Forward only: the bf16 copies would save little and take memory after this check.
        run.eval_model->set_bf16_copies(false);
      } catch (const std::exception& e) {  // the GPU's memory: the CPU takes it
        LogWarning("rank 0: validating on the CPU (the whole model does not go on the GPU: {})",
                   e.what());
        run.eval_model = std::make_unique<GPT<float>>(run.cfg.model, micro);
      }
    }
    std::copy(params.begin(), params.end(), run.eval_model->params());
    model = run.eval_model.get();
  }
  if (run.mesh.rank() != 0) return std::nan("");
  return EvalLoss(*model, run.val, run.num_val_windows, micro, /*with_grads=*/false);
}

}  // namespace atl
