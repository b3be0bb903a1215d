// Train: the step loop (train/trainer.h). One rank's mechanics live in train/run.h; how the
// sites agree, in train/strategies/.
#include "train/trainer.h"

#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/file.h"
#include "core/log.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "parallel/data_parallel.h"
#include "parallel/grad_norm.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/run.h"
#include "train/schedule.h"
#include "train/sdc/peers.h"
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

// The rank's state for the run: the mesh, the model shard, the reducer and the optimizer, the
// parameters initialized or resumed. Returns the step the run starts from.
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
  run.schedule = MakePipeSchedule(schedule_kind, me.pp(), me.pp_rank(), int(run.local_accum));
  const ModelShard shard = ShardOf(cfg, me.tp_rank(), me.pp_rank());
  run.model = std::make_unique<GPT<float>>(cfg.model, int(tc.micro_batch_size), shard,
                                           SlotsUsed(run.schedule));
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
    run.num_val_windows = std::min<size_t>(run.val.NumEvalWindows(),
                                           size_t(tc.eval_batches) * size_t(tc.micro_batch_size));
  if (options.resume != nullptr) {
    ATOLL_RETURN_IF_ERROR(ResumeRun(*options.resume, options.resume_path, run));
    return options.resume->cursor.next_step;
  }
  run.model->InitParameters(uint64_t(tc.seed));
  return 0;
}

// The corruption detectors after step s's update (train/sdc/monitor.h): every rank logs what it
// found; the site's ranks share their findings, which go into the step's metrics; with
// sdc.on_alarm = "stop" any finding ends the run on every rank of the site alike.
Status CheckStep(Run& run, int64_t s, StepMetrics* m) {
  ATOLL_ASSIGN_OR_RETURN(std::vector<SdcEvent> events,
                         run.sdc->AfterStep(s, m->loss, m->grad_norm, m->lr, run.model->params(),
                                            run.optimizer->m(), run.optimizer->v()));
  std::vector<std::string> mine;
  for (const SdcEvent& e : events) {
    LogWarning("silent data corruption suspected: {}", e.ToString());
    mine.push_back(e.ToJson());
  }
  if (run.mesh.size() > 1) {
    ATOLL_ASSIGN_OR_RETURN(m->sdc, ShareEvents(*run.mesh.world(), mine));
  } else {
    m->sdc = std::move(mine);
  }
  if (!m->sdc.empty() && !OnlyRepaired(m->sdc) && run.cfg.sdc.on_alarm == "stop")
    return Status::Internal(fmt::format(
        "silent data corruption suspected at step {} ({}{}); sdc.on_alarm = stop ends the run",
        s + 1, m->sdc.front(),
        m->sdc.size() > 1 ? fmt::format(" and {} more", m->sdc.size() - 1) : ""));
  return Status::Ok();
}

// Step s's computation: the forward and backward passes, the losses and the gradient reduction
// (in the site, then by the strategy), the gradient norm and the optimizer update. Fills m's
// loss, grad_norm and lr. A non-finite loss or norm is left for the caller to judge.
Status ComputeStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                   std::vector<double>& local_losses, StepMetrics* m) {
  const Mesh& me = run.mesh;
  const TrainConfig& tc = run.cfg.train;
  const size_t n_params = run.model->num_params();
  const bool over_wan = SyncOverSites(run.cfg);
  std::vector<double> all_losses(static_cast<size_t>(run.accum), 0.0);
  // The site's passes and its sums with the other sites, again when the live sites changed before
  // they agreed (sync: the survivors take over a lost site's micro-batches).
  for (bool agreed = false; !agreed;) {
    // This replica's micro-batches: its own, then those of the lost sites it takes over.
    std::vector<int64_t> firsts = {run.first_micro};
    ATOLL_ASSIGN_OR_RETURN(const std::vector<int> taken, strategy.TakenOver());
    for (int lost : taken)
      firsts.push_back((int64_t(lost) * me.dp() + me.dp_rank()) * run.local_accum);
    try {
      ATOLL_RETURN_IF_ERROR(ForwardBackward(run, s, &local_losses, firsts));
    } catch (const std::runtime_error& e) {  // a failed tensor-parallel all-reduce
      return Status::Internal(fmt::format("step {}: {}", s + 1, e.what()));
    }
    // Every micro-batch's loss, summed in global order (the last stage's tp rank 0 of replica r
    // holds micro-batches r*k/D ...).
    std::fill(all_losses.begin(), all_losses.end(), 0.0);
    if (me.last_stage() && me.tp_rank() == 0)
      for (size_t b = 0; b < firsts.size(); ++b)
        std::copy_n(local_losses.begin() + std::ptrdiff_t(b * size_t(run.local_accum)),
                    run.local_accum, all_losses.begin() + firsts[b]);
    if (me.size() > 1) ATOLL_RETURN_IF_ERROR(me.world()->AllReduce(std::span<double>(all_losses)));
    if (run.faults != nullptr) run.faults->AtWan(s);
    // The sites' sums: the gradients (the reproducible mode's exact int64 sums), the losses and,
    // with sync across sites, the gradient checksum's records, which the WAN sums with the
    // losses. The reduced gradient is checked against them where the optimizer reads it.
    const std::span<double> records =
        over_wan && run.grad_sums != nullptr ? run.grad_sums->records() : std::span<double>();
    std::vector<double> sums = all_losses;
    sums.insert(sums.end(), records.begin(), records.end());
    SiteSums site;
    site.grads = std::span<float>(run.model->grads(), n_params);
    if (over_wan && run.reducer != nullptr) site.fixed = run.reducer->fixed_sums();
    site.losses = std::span<double>(sums);
    ATOLL_ASSIGN_OR_RETURN(agreed, strategy.AfterBackward(s, site));
    if (!agreed) continue;
    run.blocks = firsts.size();
    run.generation = strategy.generation();
    if (!site.fixed.empty()) run.reducer->ConvertFixed(run.model->grads());
    std::copy(sums.begin(), sums.begin() + run.accum, all_losses.begin());
    std::copy(sums.begin() + run.accum, sums.end(), records.begin());
  }
  InjectBufferFaults(run, FaultKind::kGrad, s);
  CheckReducedGradient(run, me.dp() * (over_wan ? run.sites : 1));
  if (run.trace != nullptr) {
    run.trace->SetLosses(local_losses, run.first_micro);
    if (Zero(run))
      run.trace->SetGrads({}, run.reducer->shard_grads(), run.optimizer->size());
    else
      run.trace->SetGrads(run.model->layout(), run.model->grads(), n_params);
  }
  double loss_sum = 0.0;
  for (double l : all_losses) loss_sum += l;
  m->loss = loss_sum / double(objective);
  ATOLL_ASSIGN_OR_RETURN(const double squared_norm, SquaredGradNorm(run));
  m->grad_norm = std::sqrt(squared_norm);
  m->lr = LearningRate(tc, s);
  const float clip = ClipScale(m->grad_norm, tc.grad_clip);
  if (run.sdc != nullptr) ATOLL_RETURN_IF_ERROR(run.sdc->BeforeUpdate(s, run.model->params()));
  run.optimizer->Step(run.model->params(),
                      Zero(run) ? run.reducer->shard_grads() : run.model->grads(), m->lr, clip);
  if (run.sdc != nullptr)
    ATOLL_RETURN_IF_ERROR(
        run.sdc->OnUpdate(run.optimizer->update_squares(), run.optimizer->owned_numel()));
  return Zero(run) ? run.reducer->AllGatherInPlace(run.model->params()) : Status::Ok();
}

bool Finite(const StepMetrics& m) { return std::isfinite(m.loss) && std::isfinite(m.grad_norm); }

Status Diverged(const StepMetrics& m) {
  return Status::Internal(
      fmt::format("training diverged at step {}: loss {}, gradient norm {} (lower train.lr?)",
                  m.step, m.loss, m.grad_norm));
}

// The audit replay of step s (train/sdc/audit.h), on every rank of the site alike (with sync
// across sites: of every site, which decide together through the strategy): rolls back to
// the pre-step snapshot and computes the step again; when some rank's two runs differ, a third
// run decides which one was corrupted. Keeps the result two runs agree on. m: the first run's
// metrics (its sdc events), replaced by the kept run's, with the first run's events and the
// verdict in front. agreed: whether the kept run's replicas agree (no fingerprint mismatch).
// When every replay matched and the site's replicas (or, sync with one rank a site, the sites)
// each hold the whole model, other ranks' executions decide between the data and a rank that
// repeats its fault (CheckOnPeers); faulty: whether they named a rank (or site) of any site.
Status ReplayStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                  std::vector<double>& local_losses, const StepSnapshot& snapshot, StepMetrics* m,
                  bool* agreed, bool* faulty) {
  Communicator* site = run.mesh.world();
  const std::vector<ParamTensor> none;
  const std::vector<ParamTensor>& layout = Zero(run) ? none : run.model->layout();
  auto compute = [&](StepMetrics* out) {
    snapshot.Restore(run.model->params(), run.optimizer.get());
    if (run.sdc != nullptr) run.sdc->RestoreState();
    out->step = m->step;
    return ComputeStep(run, strategy, s, objective, local_losses, out);
  };
  // How many ranks say yes: of the site, or of the world when the sites replay together.
  auto count = [&](bool mine) -> StatusOr<int64_t> {
    ATOLL_ASSIGN_OR_RETURN(const int64_t n, CountOnSite(site, mine));
    return strategy.SumOverSites(n);
  };
  // Runs of one live set are compared: when a site is lost in the middle (sync), the micro-batches
  // each site computes change, and the latest run becomes the first of a new replay.
  const StepTrace first = *run.trace;
  const int64_t generation = run.generation;
  auto relive = [&] {
    return ReplayStep(run, strategy, s, objective, local_losses, snapshot, m, agreed, faulty);
  };
  StepMetrics kept;
  ATOLL_RETURN_IF_ERROR(compute(&kept));
  if (run.generation != generation) return relive();
  auto diff = FirstDifference(first, *run.trace, layout);
  ATOLL_ASSIGN_OR_RETURN(const int64_t differing, count(diff.has_value()));
  if (differing > 0) {
    const StepTrace replay = *run.trace;
    kept = StepMetrics();
    ATOLL_RETURN_IF_ERROR(compute(&kept));
    if (run.generation != generation) return relive();
    const bool first_bad = diff && !FirstDifference(replay, *run.trace, layout);
    const bool replay_bad = diff && !FirstDifference(first, *run.trace, layout);
    if (diff) diff->run = first_bad ? "first" : "replay";
    ATOLL_ASSIGN_OR_RETURN(const int64_t split, count(diff && !first_bad && !replay_bad));
    if (split > 0)
      return Status::Internal(fmt::format(
          "step {}: three runs of the step gave three different results on {} rank(s){}: a rank "
          "that keeps computing wrong results; stopping (leaving a faulty rank out is not "
          "supported yet)",
          s + 1, split,
          diff && !first_bad && !replay_bad
              ? fmt::format(", this one (rank {} of site {}) among them", run.mesh.rank(), run.site)
              : ""));
  }
  std::vector<std::string> peers;
  bool named = false;
  Communicator* sites = strategy.PeerSites();
  // Only each replica's own micro-batches are recomputed by its peers: not with a lost site's.
  if (differing == 0 && run.mesh.tp() == 1 && run.mesh.pp() == 1 && run.blocks == 1) {
    if (run.mesh.dp() > 1) {
      ATOLL_ASSIGN_OR_RETURN(peers,
                             CheckOnPeers(run, s, snapshot, *run.mesh.dp_group(), false, &named));
    } else if (sites != nullptr) {
      ATOLL_ASSIGN_OR_RETURN(peers, CheckOnPeers(run, s, snapshot, *sites, true, &named));
    }
  }
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::string> verdict,
                         ShareReplays(site, run.site, run.mesh.rank(), s, diff));
  if (!peers.empty()) verdict = std::move(peers);  // in place of "reproduced"
  ATOLL_ASSIGN_OR_RETURN(const int64_t faulty_ranks, count(named));
  *faulty = faulty_ranks > 0;
  // Where some site computed the step differently, the other sites' sums differ after the WAN
  // because they received it: not a payload of their own.
  ATOLL_ASSIGN_OR_RETURN(const int64_t computed, count(diff && diff->op != "wan"));
  if (computed > 0)
    verdict.erase(std::remove_if(verdict.begin(), verdict.end(),
                                 [](const std::string& e) {
                                   return e.find("\"op\":\"wan\"") != std::string::npos;
                                 }),
                  verdict.end());
  if (*faulty) {  // the step is not trusted: its line with the verdicts, then the run stops
    std::vector<std::string> events = std::move(m->sdc);
    events.insert(events.end(), verdict.begin(), verdict.end());
    kept.sdc = std::move(events);
    *m = std::move(kept);
    return Status::Ok();
  }
  if (!Finite(kept)) return Diverged(kept);  // two runs agree on it: not a transient fault
  if (run.sdc != nullptr) {
    ATOLL_RETURN_IF_ERROR(CheckStep(run, s, &kept));
    // Two runs agree on what the guard flags: a genuine spike, part of the run from now on.
    if (HasEvent(kept.sdc, "guard") && !HasEvent(kept.sdc, "checksum")) run.sdc->AcceptFlagged();
  }
  *agreed = !HasEvent(kept.sdc, "fingerprint");
  std::vector<std::string> events = std::move(m->sdc);
  events.insert(events.end(), verdict.begin(), verdict.end());
  events.insert(events.end(), kept.sdc.begin(), kept.sdc.end());
  kept.sdc = std::move(events);
  *m = std::move(kept);
  return Status::Ok();
}

// The checkpoint of step `step` into dir, written by the lowest live site, and by the next when
// that one is lost before the live sites meet again after it wrote (sync; otherwise site 0,
// once). Collective over the world.
Status SaveOnLeadSite(Run& run, WorldStrategy& strategy, const std::string& dir, int64_t step) {
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
  ATOLL_RETURN_IF_ERROR(SetUpSdc(run, options.out_dir, options.resume == nullptr));

  // How the sites agree (train/strategies/world_strategy.h): every rank keeps the schedule, the
  // leader acts.
  const size_t n_params = run.model->num_params();
  StrategyContext sc;
  sc.cfg = &cfg;
  sc.world = &options.world;
  sc.site_comm = me.world();
  sc.leader = leader;
  sc.n_params = n_params;
  sc.resumed = options.resume != nullptr;
  if (run.trace != nullptr)
    sc.on_wan = [trace = run.trace.get()](std::span<const std::byte> sums, bool after) {
      trace->SetWan(sums.data(), sums.size(), after);
    };
  ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<WorldStrategy> strategy, MakeWorldStrategy(sc));
  // The sites of a sync run hold one model: their fingerprints are compared too.
  if (run.sdc != nullptr && SyncOverSites(cfg))
    run.sdc->set_sites(
        [s = strategy.get()](const std::vector<uint64_t>& mine) {
          return s->GatherOverSites(mine);
        },
        [s = strategy.get()](bool corrupt, float* p, size_t n, float* m, float* v, size_t k) {
          return s->RepairAcrossSites(corrupt, p, n, m, v, k);
        });
  // wan faults strike in the WAN transport, on the leader's sender threads, until Train returns.
  ATOLL_ASSIGN_OR_RETURN(const PayloadFaultScope payload_fault, InstallPayloadFault(run, options));
  ATOLL_ASSIGN_OR_RETURN(start, strategy->Start(start, run.model->params()));
  // The memory checks (train/sdc/memory.h): sealed at the end of each step (and here, before the
  // first), checked at the start of each and before a checkpoint is written (what they find
  // there is logged, and reported with the next step).
  auto seal_at_rest = [&] {
    if (run.sdc != nullptr)
      run.sdc->SealAtRest(run.model->params(), run.optimizer->m(), run.optimizer->v());
  };
  auto check_at_rest = [&] {
    return run.sdc == nullptr
               ? Status::Ok()
               : run.sdc->CheckAtRest(run.model->params(), n_params, run.optimizer->m(),
                                      run.optimizer->v(), run.optimizer->size());
  };
  seal_at_rest();
  // The objective of a site's replica: the mean loss over the whole batch (sync), or over the
  // site's share of it (the sites train apart between exchanges).
  const int64_t objective = strategy->whole_batch() ? run.accum : run.accum / run.sites;
  run.loss_scale = 1.0f / float(objective);

  const std::string& out = options.out_dir;
  const std::string ck_dir = options.checkpoint_dir.empty() ? out : options.checkpoint_dir;
  MetricsLog metrics;
  if (leader) {
    ATOLL_RETURN_IF_ERROR(MakeDirs(out));
    ATOLL_RETURN_IF_ERROR(WriteFileAtomic(out + "/config.toml", RunConfigToToml(cfg)));
    ATOLL_RETURN_IF_ERROR(metrics.Open(out + "/metrics.jsonl", start, out + "/events.jsonl"));
    LogStart(cfg, run, start);
  }

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
  for (int64_t s = start; s < tc.steps; ++s) {
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
    bool faulty = false;  // a rank that repeats its fault, named by the peer check
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
    const bool last = s + 1 == tc.steps;
    ATOLL_RETURN_IF_ERROR(strategy->AfterStep(s + 1, run.model->params(), last));
    seal_at_rest();  // after the strategy's exchanges, which may move the parameters
    const double dt = NowSeconds() - t0;
    steps_s += dt;
    tokens += uint64_t(tc.batch_size) * uint64_t(seq);
    m.tokens = tokens;
    m.step_ms = dt * 1e3;
    m.tokens_per_s = double(tc.batch_size) * seq / dt;
    strategy->Fill(&m);
    if (faulty) {  // on every rank of every site alike, the step's line written
      if (leader) {
        ATOLL_RETURN_IF_ERROR(metrics.Append(m));
        progress.Finish();
      }
      const auto e = std::find_if(m.sdc.begin(), m.sdc.end(),
                                  [](const std::string& x) { return HasFaultyRank({x}); });
      return Status::Internal(fmt::format(
          "step {}: a rank (or site) computes wrong results that its own replay repeats ({}); "
          "stopping: restart without its host from a checkpoint written no later than the last "
          "step the other ranks confirmed (a running world cannot leave a rank out yet)",
          s + 1, e != m.sdc.end() ? *e : std::string("on another site")));
    }
    // A site lost after the step's sums is seen before its validation moves (sync).
    if (last) ATOLL_RETURN_IF_ERROR(strategy->AgreeOnLive());
    if (run.num_val_windows > 0 && run.site == strategy->lead_site() &&
        (last || (tc.eval_every > 0 && (s + 1) % tc.eval_every == 0))) {
      ATOLL_ASSIGN_OR_RETURN(const double val_loss, Validate(run));
      if (leader) m.val_loss = val_loss;
    }
    if (leader) {
      ATOLL_RETURN_IF_ERROR(metrics.Append(m));
      if (options.progress) progress.Update(m);
    }
    if (tc.checkpoint_every > 0 && (s + 1) % tc.checkpoint_every == 0) {
      ATOLL_RETURN_IF_ERROR(check_at_rest());  // on every site: it may repair across them
      ATOLL_RETURN_IF_ERROR(
          SaveOnLeadSite(run, *strategy, fmt::format("{}/checkpoint-{}", ck_dir, s + 1), s + 1));
    }
    if (options.die_after_step == s + 1 && leader) {
      LogWarning("site {}: dying after step {} (fault injection)", run.site, s + 1);
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
  if (leader && run.sdc != nullptr && tc.steps > start)
    LogSdcCost(run.sdc->cost(), (run.trace != nullptr ? run.trace->seconds() : 0.0) + snapshot_s,
               replays_s, replayed, steps_s, tc.steps - start);
  if (run.faults != nullptr)
    for (const std::string& spec : run.faults->Unfired(start))
      LogWarning("fault {} never fired (this rank computed no such step, layer or micro-batch)",
                 spec);
  if (const std::string summary = strategy->Summary(); !summary.empty()) LogInfo("{}", summary);
  const std::string final_dir = ck_dir + "/checkpoint";
  ATOLL_RETURN_IF_ERROR(check_at_rest());
  ATOLL_RETURN_IF_ERROR(SaveOnLeadSite(run, *strategy, final_dir, tc.steps));
  return final_dir;
}

}  // namespace atl
