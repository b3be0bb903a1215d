// Train: the step loop (train/trainer.h). One rank's mechanics live in train/run.h; how the
// sites agree, in train/strategies/.
#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <span>
#include <stdexcept>
#include <thread>
#include <utility>
#include <vector>

#if ATOLL_HAVE_NCCL
#include "comm/nccl/nccl_comm.h"
#endif
#include "core/file.h"
#include "core/log.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/grad_norm.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/gpu_setup.h"
#include "train/hf_import.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/predict.h"
#include "train/run.h"
#include "train/schedule.h"
#include "train/sdc/peers.h"
#include "train/step.h"
#include "train/strategies/world_strategy.h"

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

// parallel.comm = nccl: an NCCL communicator over `group`'s ranks (collective over it).
StatusOr<std::unique_ptr<Communicator>> NcclOver(Communicator& group) {
#if ATOLL_HAVE_NCCL
  return MakeNcclCommunicator(group);
#else
  (void)group;
  return Status::InvalidArgument("parallel.comm = nccl: this atoll was built without NCCL");
#endif
}

// train.init_from: this rank's part of the weights of an atoll checkpoint or a Hugging Face
// GPT-2 directory, whose model shape must be the run's, or differ only in a longer context: then
// wpe's first seq_len rows are taken (fine-tuning at a shorter context, as nanoGPT crops them).
Status InitFromWeights(const RunConfig& cfg, Run& run) {
  const std::string& path = cfg.train.init_from;
  auto loaded = LoadWeights(path);
  if (!loaded.ok()) return loaded.status().WithContext("train.init_from");
  const GPTConfig &got = loaded->config.model, &want = cfg.model;
  GPTConfig cropped = got;
  cropped.seq_len = want.seq_len;
  if (!(cropped == want) || got.seq_len < want.seq_len)
    return Status::InvalidArgument(fmt::format(
        "train.init_from {}: the weights are of n_layer {} n_head {} n_embd {} seq_len {} "
        "vocab_size {}, the config's [model] is of {} {} {} {} {}: set [model] to the weights' "
        "shape (a shorter seq_len may be set)",
        path, got.n_layer, got.n_head, got.n_embd, got.seq_len, got.vocab_size, want.n_layer,
        want.n_head, want.n_embd, want.seq_len, want.vocab_size));
  std::vector<float> whole = std::move(loaded->params);
  if (got.seq_len > want.seq_len) {
    // Every tensor is the same but wpe, whose rows [seq_len, C] come first in its storage.
    const auto from = ParameterLayout(got), to = ParameterLayout(want);
    std::vector<float> mine(NumParameters(want));
    for (size_t i = 0; i < to.size(); ++i) {
      if (from[i].name != to[i].name)  // the layout's order does not depend on seq_len
        return Status::Internal(fmt::format("train.init_from: tensor {} of the weights against {}",
                                            from[i].name, to[i].name));
      std::copy_n(whole.begin() + long(from[i].offset), to[i].numel,
                  mine.begin() + long(to[i].offset));
    }
    whole = std::move(mine);
  }
  CopyShard(want, run.model->shard(), whole.data(), run.model->params(), /*to_shard=*/true);
  return Status::Ok();
}

// The rank's state for the run: the mesh, the model shard, the reducer and the optimizer, the
// parameters initialized (randomly, or from train.init_from) or resumed. Returns the step the run
// starts from.
StatusOr<int64_t> SetUp(const RunConfig& cfg, const TrainOptions& options, Run& run) {
  const ParallelConfig& pc = cfg.parallel;
  const TrainConfig& tc = cfg.train;
  const Mesh& me = run.mesh;
  ATOLL_ASSIGN_OR_RETURN(PipeScheduleKind schedule_kind, ParsePipeSchedule(pc.schedule));
  run.accum = tc.accumulation_steps();
  run.sites = int(cfg.world.sites);
  run.site = options.world.site;
  // Replicas: the dp replicas of every site, site-major.
  run.local_accum = run.accum / (pc.dp * run.sites);
  run.first_micro = FirstMicro(run, me.dp_rank());
  run.slowdown = options.slowdown;
  run.schedule = MakePipeSchedule(schedule_kind, me.pp(), me.pp_rank(), int(run.local_accum));
  const ModelShard shard = ShardOf(cfg, me.tp_rank(), me.pp_rank());
  Device device = Device::kCpu;
  ParseDevice(tc.device, &device);  // checked with the config
  if (std::string why; !DeviceUsable(device, &why))
    return Status::InvalidArgument(
        fmt::format("train.device = {}, but this rank cannot use it: {}", tc.device, why));
  run.model = std::make_unique<GPT<float>>(cfg.model, int(tc.micro_batch_size), shard,
                                           SlotsUsed(run.schedule), device);
  // The process's settings: every run sets them (tests train several in one process).
  if (device == Device::kCuda) ATOLL_RETURN_IF_ERROR(SetUpGpu(cfg, me));
  if (Communicator* tp = me.tp_group()) {
    // parallel.comm = nccl: the GPU's tensors are all-reduced where they are, over NCCL (made
    // from the MPI group; the host's, the vocabulary loss's statistics, stay on MPI).
    std::function<void(float*, size_t)> on_gpu;
    if (pc.comm == "nccl") {
      ATOLL_ASSIGN_OR_RETURN(run.tp_nccl, NcclOver(*tp));
      on_gpu = [g = run.tp_nccl.get()](float* data, size_t n) {
        ThrowIfError(g->AllReduce(std::span<float>(data, n)));
      };
    }
    run.model->set_tensor_parallel(
        [tp](float* data, size_t n) { ThrowIfError(tp->AllReduce(std::span<float>(data, n))); },
        std::move(on_gpu));
  }
  run.norm_ranges = NormRanges(cfg.model, shard);
  // parallel.comm = nccl sums the dp group's gradients in GPU memory too, in the normal mode;
  // the reproducible mode's fixed point, ZeRO's shards and the gradient checksums work on host
  // memory, over MPI (said once in the log).
  Communicator* dp_comm = me.dp_group();
  const char* host_mode = pc.reproducible     ? "parallel.reproducible"
                          : pc.zero           ? "parallel.zero"
                          : cfg.sdc.checksums ? "sdc.checksums"
                                              : nullptr;
  if (pc.comm == "nccl" && pc.dp > 1) {
    if (host_mode != nullptr) {
      if (me.rank() == 0)
        LogInfo(
            "parallel.comm = nccl: the data-parallel gradients go through host memory and MPI "
            "({} works on host memory)",
            host_mode);
    } else {
      ATOLL_ASSIGN_OR_RETURN(run.dp_nccl, NcclOver(*dp_comm));
      dp_comm = run.dp_nccl.get();
    }
  }
  // ... and the tied wte's gradient between the first and the last stage, where ForwardBackward
  // sums it on the GPU: not in the reproducible mode (on the host, after its fixed-point
  // reduction), nor after a backward overlapped with a host-memory reduction (the gradients are
  // on the host then), where the communicator would never be used.
  const bool host_overlap = pc.dp > 1 && pc.overlap && run.dp_nccl == nullptr;
  if (Communicator* embed = me.embed_group();
      embed != nullptr && pc.comm == "nccl" && !pc.reproducible && !host_overlap) {
    ATOLL_ASSIGN_OR_RETURN(run.embed_nccl, NcclOver(*embed));
  }
  // A single process in the normal mode needs no reducer.
  if (pc.dp > 1 || pc.reproducible)
    run.reducer =
        std::make_unique<GradientReducer>(dp_comm, run.model->layout(),
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
    // A GPU rank's parameters, gradients and moments stay on the GPU (ZeRO's shards: the host).
    if (run.model->device() == Device::kCuda) run.optimizer->PlaceOnDevice();
    // Only the step guard reads what the update moved.
    run.optimizer->set_update_squares(cfg.sdc.guard);
  }
  if (tc.eval_batches > 0)
    run.num_val_windows = std::min<size_t>(run.val.NumEvalWindows(),
                                           size_t(tc.eval_batches) * size_t(tc.micro_batch_size));
  if (options.resume != nullptr) {
    ATOLL_RETURN_IF_ERROR(ResumeRun(*options.resume, options.resume_path, run));
    return options.resume->cursor.next_step;
  }
  if (!tc.init_from.empty()) {
    ATOLL_RETURN_IF_ERROR(InitFromWeights(cfg, run));
    return 0;
  }
  run.model->InitParameters(uint64_t(tc.seed));
  return 0;
}

// The checkpoint of step `step` into dir, written by the lowest live site, and by the next when
// that one is lost before the live sites meet again after it wrote (sync; otherwise site 0,
// once). Every site keeps its own state beside it first (diloco, streaming). Collective over the
// world.
Status SaveOnLeadSite(Run& run, WorldStrategy& strategy, const std::string& dir, int64_t step) {
  ATOLL_RETURN_IF_ERROR(strategy.SaveSiteState(dir, step, ModelView(run).params()));
  for (int wrote = -1;;) {
    ATOLL_RETURN_IF_ERROR(strategy.AgreeOnLive());
    if (strategy.lead_site() == wrote) return Status::Ok();
    wrote = strategy.lead_site();
    if (run.site == wrote) ATOLL_RETURN_IF_ERROR(SaveCheckpoint(run, dir, step));
  }
}

// Installs the rank's wan faults in the WAN transport (world/wan.h WanPayloadFault) for as long
// as it lives.
class PayloadFaultScope {
 public:
  PayloadFaultScope() = default;
  explicit PayloadFaultScope(std::function<void(WanPayloadFault)> set) : set_(std::move(set)) {}
  PayloadFaultScope(PayloadFaultScope&& o) noexcept : set_(std::move(o.set_)) { o.set_ = nullptr; }
  PayloadFaultScope& operator=(PayloadFaultScope&&) = delete;
  ~PayloadFaultScope() {
    if (set_) set_(nullptr);
  }

 private:
  std::function<void(WanPayloadFault)> set_;
};

StatusOr<PayloadFaultScope> InstallPayloadFault(Run& run, const TrainOptions& options) {
  // Every site decides from the whole list (the same config everywhere), so none is left
  // waiting for a site that refused.
  ATOLL_ASSIGN_OR_RETURN(const std::vector<FaultSpec> specs, ParseFaults(run.cfg.faults.inject));
  const bool any_wan = std::any_of(specs.begin(), specs.end(),
                                   [](const FaultSpec& x) { return x.kind == FaultKind::kWan; });
  const auto no_transport = [] {
    return Status::InvalidArgument(
        "faults.inject: a wan fault needs the WAN transport between the sites (atoll launch); "
        "this run's WAN has no payload to corrupt");
  };
  if (any_wan && options.world.wan != nullptr && !options.world.payload_fault)
    return no_transport();
  FaultInjector* f = run.faults.get();
  if (f == nullptr || !f->has_wan()) return PayloadFaultScope();
  if (!options.world.payload_fault) return no_transport();
  options.world.payload_fault(
      [f](int to_site, uint32_t, std::string* payload) { f->OnWanPayload(to_site, payload); });
  return PayloadFaultScope(options.world.payload_fault);
}

// What each detector cost on this rank, per step and as a share of the step time, measured in
// this run (bench/sdc_bench.sh reads the line).
// bookkeeping_s: what makes a replay possible (the snapshot and the op trace), not the replays.
void LogSdcCost(const SdcCost& c, double bookkeeping_s, double replays_s, int64_t replayed,
                double steps_s, int64_t steps) {
  const double per = 1e3 / double(steps);
  auto part = [&](const char* name, double s) {
    return fmt::format("{} {:.2f} ms ({:.2f}%)", name, s * per, 100 * s / steps_s);
  };
  LogInfo("sdc cost per step: {}, {}, {}, {}, {}; {} replay(s) took {:.2f}% of the run",
          part("guard", c.guard), part("fingerprints", c.fingerprints), part("memory", c.memory),
          part("checksums", c.checksums), part("snapshot+trace", bookkeeping_s), replayed,
          100 * replays_s / steps_s);
}

void LogStart(const RunConfig& cfg, const Run& run, int64_t start) {
  const Mesh& me = run.mesh;
  const ParallelConfig& pc = cfg.parallel;
  const TrainConfig& tc = cfg.train;
  if (me.size() > 1)
    LogInfo("mesh dp {} x tp {} x pp {}: {} micro-batches of {} per replica per step{}{}{}{}",
            me.dp(), me.tp(), me.pp(), run.local_accum, tc.micro_batch_size,
            me.pp() > 1 ? fmt::format(", {} pipeline schedule", pc.schedule) : "",
            run.reducer != nullptr && me.dp() > 1
                ? fmt::format(", {} gradient buckets", run.reducer->buckets().size())
                : "",
            pc.zero && me.dp() > 1 ? ", ZeRO-1 optimizer sharding" : "",
            pc.reproducible ? ", reproducible (int64 fixed-point) reduction" : "");
  LogInfo(
      "training {} parameters ({} layers, {} heads, n_embd {}, seq_len {}) for steps {}..{} of "
      "{}: batch {} = {} x {} micro, {} threads per rank, data {} ({} train / {} val tokens)",
      NumParameters(cfg.model), cfg.model.n_layer, cfg.model.n_head, cfg.model.n_embd,
      cfg.model.seq_len, start + 1, tc.steps, tc.steps, tc.batch_size, run.accum,
      tc.micro_batch_size, omp_get_max_threads(), cfg.data.dir, run.train_tokens.size(),
      run.val_tokens.size());
}

}  // namespace

StatusOr<std::string> Train(const RunConfig& cfg, const TrainOptions& options) {
  Communicator* comm = options.comm;
  ATOLL_RETURN_IF_ERROR(ValidateParallel(cfg, comm != nullptr ? comm->size() : 1));
  const TrainConfig& tc = cfg.train;
  if (tc.threads > 0) omp_set_num_threads(int(tc.threads));

  ATOLL_ASSIGN_OR_RETURN(TokenFile train_tokens, OpenTokenFile(cfg.data.dir, "train.bin"));
  ATOLL_ASSIGN_OR_RETURN(TokenFile val_tokens, OpenTokenFile(cfg.data.dir, "val.bin"));
  ATOLL_RETURN_IF_ERROR(CheckData(cfg, train_tokens, val_tokens));
  ATOLL_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Make(comm, int(cfg.parallel.dp), int(cfg.parallel.tp),
                                               int(cfg.parallel.pp)));
  Run run(cfg, std::move(train_tokens), std::move(val_tokens), std::move(mesh));
  const Mesh& me = run.mesh;
  const bool leader = me.rank() == 0;
  ATOLL_ASSIGN_OR_RETURN(int64_t start, SetUp(cfg, options, run));
  // A resumed run, or a lost site's new process, goes on with the log of the flips before it.
  ATOLL_RETURN_IF_ERROR(
      SetUpSdc(run, options.out_dir, options.resume == nullptr && !options.world.rejoin));

  // How the sites agree (train/strategies/world_strategy.h): every rank keeps the schedule, the
  // leader acts.
  const size_t n_params = run.model->num_params();
  StrategyContext sc;
  sc.cfg = &cfg;
  sc.world = &options.world;
  sc.site_comm = me.world();
  sc.leader = leader;
  sc.n_params = n_params;
  sc.optimizer = run.optimizer.get();
  sc.resumed = options.resume != nullptr;
  sc.resume_path = options.resume_path;
  if (run.trace != nullptr)
    sc.on_wan = [trace = run.trace.get()](std::span<const std::byte> sums, bool after) {
      trace->SetWan(sums.data(), sums.size(), after);
    };
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<WorldStrategy> strategy, MakeWorldStrategy(sc));
  // The sites of a sync run hold one model: their fingerprints are compared too.
  if (run.sdc != nullptr && SyncOverSites(cfg))
    run.sdc->set_sites([s = strategy.get()](
                           const std::vector<uint64_t>& mine) { return s->GatherOverSites(mine); },
                       [s = strategy.get()](bool corrupt, const HostStateFn& state) {
                         return s->RepairAcrossSites(corrupt, state);
                       });
  // wan faults strike in the WAN transport, on the leader's sender threads, until Train returns.
  ATOLL_ASSIGN_OR_RETURN(const PayloadFaultScope payload_fault, InstallPayloadFault(run, options));
  ATOLL_ASSIGN_OR_RETURN(start, strategy->Start(start, run.model->params()));
  // The memory checks (train/sdc/memory.h): sealed at the end of each step (and here, before the
  // first), checked at the start of each and before a checkpoint is written (what they find
  // there is logged, and reported with the next step).
  // They hash the state where it lives (on the GPU, there); a repair writes the host's copies.
  auto seal_at_rest = [&] {
    if (run.sdc != nullptr && run.sdc->memory())
      run.sdc->SealAtRest(run.model->resident_params(), run.optimizer->resident_m(),
                          run.optimizer->resident_v());
  };
  const HostStateFn host_state = [&run, n_params] {
    return HostState{run.model->params(), n_params, run.optimizer->m(), run.optimizer->v(),
                     run.optimizer->size()};
  };
  auto check_at_rest = [&] {
    return run.sdc == nullptr || !run.sdc->memory()
               ? Status::Ok()
               : run.sdc->CheckAtRest(run.model->resident_params(), run.optimizer->resident_m(),
                                      run.optimizer->resident_v(), host_state);
  };
  seal_at_rest();
  // The objective of a site's replica: the mean loss over the whole batch (sync), or over the
  // site's share of it (the sites train apart between exchanges; with world.balance ComputeStep
  // takes the share's size, and sets run.loss_scale each step).
  const int64_t objective = strategy->whole_batch() ? run.accum : run.accum / run.sites;

  const std::string& out = options.out_dir;
  const std::string ck_dir = options.checkpoint_dir.empty() ? out : options.checkpoint_dir;
  MetricsLog metrics;
  if (leader) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(out));
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out + "/config.toml", RunConfigToToml(cfg)));
    ATOLL_RETURN_IF_ERROR(metrics.Open(out + "/metrics.jsonl", start, out + "/events.jsonl"));
    LogStart(cfg, run, start);
  }
  // The planner's view of a step (train/predict.h): printed now, compared with the steps at the
  // end; a plan.json of an earlier run in this directory must not stand for this one.
  if (leader) std::filesystem::remove(out + "/plan.json");
  // Only the leader prints and compares it: the other ranks do not read the calibration.
  const StepPrediction prediction =
      leader ? PredictStep(cfg, omp_get_max_threads(), ProcsOnHost(),
                           int(std::max(1u, std::thread::hardware_concurrency())),
                           DefaultCalibrationPath())
             : StepPrediction{};
  if (leader) LogInfo("{}", DescribePrediction(prediction));
  std::vector<double> step_ms, wan_ms;  // this process's steps, for the comparison

  const int seq = cfg.model.seq_len;
  std::vector<double> local_losses(static_cast<size_t>(run.local_accum));
  uint64_t tokens = uint64_t(start) * uint64_t(tc.batch_size) * uint64_t(seq);
  ProgressBar progress(start, tc.steps, stderr);
  // Audit replays (sdc.on_alarm = redo, sdc.audit_every): the state each step starts from.
  const bool replays = run.trace != nullptr;
  StepSnapshot snapshot;
  // What the detectors cost in this run (LogSdcCost): the steps' time, the snapshots', and the
  // replays' (re-executions of alarmed or audited steps).
  double steps_s = 0, snapshot_s = 0, replays_s = 0;
  bool replicas_agreed = true;  // the data-parallel replicas' fingerprints, after the last step
  int64_t replayed = 0;
  std::vector<std::string> carried;  // the events of a step computed again without a faulty site
  // The GPU copies of the steps after the first (whose uploads of the parameters and the
  // moments are once a run), and of the validations among them.
  std::pair<uint64_t, uint64_t> copies_from, val_copies;
  int64_t validations = 0;
  for (int64_t s = start; s < tc.steps; ++s) {
    if (s == start + 1) {
      copies_from = DeviceCopies();
      val_copies = {0, 0};
      validations = 0;
    }
    const double t0 = NowSeconds();
    InjectBufferFaults(run, FaultKind::kParam, s);
    ATOLL_RETURN_IF_ERROR(check_at_rest());
    if (replays) {
      const SdcTimer timer(&snapshot_s);
      snapshot.Take(run.model->params(), n_params, *run.optimizer);
      if (run.sdc != nullptr) run.sdc->SaveState();
    }
    StepMetrics m;
    m.step = s + 1;
    ATOLL_RETURN_IF_ERROR(ComputeStep(run, *strategy, s, objective, local_losses, &m));
    // With replays, a non-finite loss or norm is an alarm like the detectors' (a flipped
    // exponent can make one): the replay decides whether the run diverged.
    if (!Finite(m) && !replays) {
      if (leader) progress.Finish();
      return Diverged(m);
    }
    if (run.sdc != nullptr) ATOLL_RETURN_IF_ERROR(CheckStep(run, s, &m));
    // A fingerprint mismatch is replayed only when the replicas held the same bits at the step's
    // start: they agreed at the end of the last step and the memory checks found nothing they
    // could not repair since. Then one of them computed this step differently, which a replay
    // finds and undoes. Otherwise it may be state at rest, which a replay would reproduce every
    // step. With ZeRO the replicas are compared before the update: nothing a replay could undo.
    const bool replicas_apart = cfg.sdc.memory && replicas_agreed && !Zero(run) &&
                                HasEvent(m.sdc, "fingerprint") && !HasUnrepaired(m.sdc);
    bool alarm =
        !Finite(m) || ((HasComputeAlarm(m.sdc) || replicas_apart) && cfg.sdc.on_alarm == "redo");
    const bool audit = cfg.sdc.audit_every > 0 && (s + 1) % cfg.sdc.audit_every == 0;
    if (replays) {  // the sites that replay together decide together
      ATOLL_ASSIGN_OR_RETURN(const int64_t alarms, strategy->SumOverSites(alarm ? 1 : 0));
      alarm = alarms > 0;
    }
    FaultyRank faulty;  // a rank that computes wrong results, found by the replay
    if (replays && (alarm || audit)) {
      const double r0 = NowSeconds();
      Status r = ReplayStep(run, *strategy, s, objective, local_losses, snapshot, &m,
                            &replicas_agreed, &faulty);
      replays_s += NowSeconds() - r0;
      ++replayed;
      if (!r.ok()) {
        if (leader) progress.Finish();
        return r;
      }
    } else {
      replicas_agreed = !HasEvent(m.sdc, "fingerprint");
    }
    // sdc.on_faulty = exclude: the faulty rank's site leaves the world (below); the others compute
    // the step again from its start without it, taking over its micro-batches.
    const bool exclude =
        faulty.named && !faulty.unsure && cfg.sdc.on_faulty == "exclude" && strategy->elastic();
    if (exclude && !faulty.here) {
      LogWarning("step {}: another site leaves the world (sdc.on_faulty = exclude): {}", s + 1,
                 faulty.why);
      carried.insert(carried.end(), m.sdc.begin(), m.sdc.end());
      snapshot.Restore(run.model->params(), run.optimizer.get());
      if (run.sdc != nullptr) run.sdc->RestoreState();
      seal_at_rest();
      ATOLL_RETURN_IF_ERROR(strategy->AgreeOnLive());
      --s;
      continue;
    }
    m.sdc.insert(m.sdc.begin(), carried.begin(), carried.end());
    carried.clear();
    const bool last = s + 1 == tc.steps;
    // Not after a step a faulty rank computed (the run stops, or its site leaves): nothing of it
    // is served to others (a sync site's new process takes what AfterStep publishes).
    // One site's strategy reads nothing (and a GPU's parameters stay there).
    if (!faulty.named)
      ATOLL_RETURN_IF_ERROR(strategy->AfterStep(
          s + 1, run.cfg.world.sites > 1 ? run.model->params() : nullptr, last));
    seal_at_rest();  // after the strategy's exchanges, which may move the parameters
    const double dt = NowSeconds() - t0;
    steps_s += dt;
    tokens += uint64_t(tc.batch_size) * uint64_t(seq);
    m.tokens = tokens;
    m.step_ms = dt * 1e3;
    m.tokens_per_s = double(tc.batch_size) * seq / dt;
    strategy->Fill(&m);
    if (faulty.named) {  // on every rank of every site alike (but those that go on), the line
      if (leader) {
        ATOLL_RETURN_IF_ERROR(metrics.Append(m));
        progress.Finish();
      }
      if (exclude) {  // this site: it leaves, the others go on
        if (leader && options.world.leave) (void)options.world.leave();
        // The site's other ranks end only after the leader left: their error would abort the
        // site's job (MPI_Abort) before it could, and the others would wait the dead-site time.
        if (me.size() > 1) (void)me.world()->Barrier();
        return Status::Unavailable(fmt::format(
            "site {} leaves the world (sdc.on_faulty = exclude): {}", run.site, faulty.why));
      }
      return Status::Internal(fmt::format(
          "{}; stopping: restart without its host from a checkpoint written no later than the "
          "last step the other ranks confirmed{}",
          faulty.why,
          faulty.unsure || !SyncOverSites(cfg)
              ? ""
              : " (or let its site leave the world: sdc.on_faulty = \"exclude\")"));
    }
    // A site lost after the step's sums is seen before its validation moves (sync).
    ATOLL_RETURN_IF_ERROR(last ? strategy->AgreeOnLive() : strategy->ShareLead());
    if (run.num_val_windows > 0 && run.site == strategy->lead_site() &&
        (last || (tc.eval_every > 0 && (s + 1) % tc.eval_every == 0))) {
      const auto before = DeviceCopies();
      ATOLL_ASSIGN_OR_RETURN(const double val_loss, Validate(run));
      const auto after = DeviceCopies();
      val_copies.first += after.first - before.first;
      val_copies.second += after.second - before.second;
      ++validations;
      if (leader) m.val_loss = val_loss;
    }
    if (leader) {
      ATOLL_RETURN_IF_ERROR(metrics.Append(m));
      if (options.progress) progress.Update(m);
      step_ms.push_back(m.step_ms);
      wan_ms.push_back(m.wan_ms.value_or(0.0));
    }
    if (tc.checkpoint_every > 0 && (s + 1) % tc.checkpoint_every == 0) {
      ATOLL_RETURN_IF_ERROR(check_at_rest());  // on every site: it may repair across them
      ATOLL_RETURN_IF_ERROR(
          SaveOnLeadSite(run, *strategy, fmt::format("{}/checkpoint-{}", ck_dir, s + 1), s + 1));
    }
    if (options.die_after_step == s + 1 && me.rank() == options.die_rank) {
      LogWarning("site {}: rank {} dying after step {} (fault injection)", run.site, me.rank(),
                 s + 1);
      if (options.die_returns)
        return Status::Unavailable(
            fmt::format("site {}: stopped after step {} (fault injection)", run.site, s + 1));
      std::fflush(nullptr);
      std::_Exit(3);
    }
  }
  if (leader && me.dp() > 1 && tc.steps > start)
    LogInfo("data parallel: {:.2f} ms per step waiting for gradient reductions after backward",
            run.comm_wait_s * 1e3 / double(tc.steps - start));
  if (leader && options.progress) progress.Finish();
  if (leader && run.model->device() == Device::kCuda && tc.steps > start + 1) {
    const auto [up, down] = DeviceCopies();
    const double per_step = 1e-3 / double(tc.steps - start - 1);
    const double per_val = 1e-3 / double(std::max<int64_t>(validations, 1));
    LogInfo(
        "GPU copies per step (rank 0, after the first, validations apart): {:.1f} KB host to "
        "GPU, {:.1f} KB GPU to host; per validation: {:.1f} KB, {:.1f} KB",
        double(up - copies_from.first - val_copies.first) * per_step,
        double(down - copies_from.second - val_copies.second) * per_step,
        double(val_copies.first) * per_val, double(val_copies.second) * per_val);
  }
  if (leader && run.sdc != nullptr && tc.steps > start)
    LogSdcCost(run.sdc->cost(), (run.trace != nullptr ? run.trace->seconds() : 0.0) + snapshot_s,
               replays_s, replayed, steps_s, tc.steps - start);
  if (run.faults != nullptr)
    for (const std::string& spec : run.faults->Unfired(start))
      LogWarning("fault {} never fired (this rank computed no such step, layer or micro-batch)",
                 spec);
  if (const std::string summary = strategy->Summary(); !summary.empty()) LogInfo("{}", summary);
  if (leader && step_ms.size() > 2) {
    const double in_site = me.dp() > 1 ? run.comm_wait_s / double(step_ms.size()) : 0.0;
    const StepParts measured = MeasuredParts(step_ms, wan_ms, in_site, /*skip=*/2);
    LogInfo("{}", DescribeComparison(prediction, measured));
    ATOLL_RETURN_IF_ERROR(
        WriteFileAtomic(out + "/plan.json", ComparisonJson(prediction, measured)));
  }
  const std::string final_dir = ck_dir + "/checkpoint";
  ATOLL_RETURN_IF_ERROR(check_at_rest());
  if (tc.checkpoint_every < 0) return std::string();  // none asked for (benchmarks)
  ATOLL_RETURN_IF_ERROR(SaveOnLeadSite(run, *strategy, final_dir, tc.steps));
  return final_dir;
}

}  // namespace atl
