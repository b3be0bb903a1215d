// atoll plan: how far a training run scales, before it is built.
//   plan frontier   the data-movement model's sweep from 1e24 to 1e34 FLOP (Erdil &
//                   Schneider-Joseph) for one GPU, network and set of scaling rules
//   plan run        one model across D datacenters joined by WAN links (sync or DiLoCo)
//   plan scaling    WAN traffic and communication time against model size and datacenters
//   plan goodput    failures, silent corruption, checkpoints and restarts: the kept fraction
//   plan calibrate  fit this machine's constants from atoll's measured steps
// Every command prints a table, or JSON with --json. docs/PLANNER.md explains every number.
#include <cstdio>
#include <filesystem>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/file.h"
#include "plan/calibrate.h"
#include "plan/frontier.h"
#include "plan/goodput.h"
#include "plan/hardware.h"
#include "plan/scaling.h"
#include "plan/units.h"
#include "plan/world.h"

namespace atl::cli {
namespace {

using namespace atl::plan;

void Print(const std::string& text) { std::fputs(text.c_str(), stdout); }
void PrintJson(const nlohmann::json& j) { Print(j.dump(2) + "\n"); }

std::string Join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

// Options shared by the commands that evaluate the data-movement model.
struct ModelArgs {
  std::string gpu = "H100";
  std::string network = "default";
  std::string hardware_file;
  std::string batch = "default";
  bool sparse = false;
  double months = 3;
  std::string pipeline = "1f1b";
  int64_t seq_len = 2048;
  bool no_overlap_tp = false, no_overlap_dp = false, no_overlap_pp = false;
  bool overlap_dp = false;        // --overlap-dp: with --combine reference
  std::string combine = "atoll";  // atoll | reference (plan/step.h)
  bool json = false;
};

void AddModelOptions(CLI::App* c, ModelArgs* a) {
  c->add_option("--gpu", a->gpu, "GPU: " + Join(GpuNames()))->capture_default_str();
  std::string nets;
  for (const auto& n : NetworkVariantNames()) nets += "\n  " + n + ": " + DescribeNetworkVariant(n);
  c->add_option("--network", a->network, "Network variant:" + nets)->capture_default_str();
  c->add_option("--hardware", a->hardware_file,
                "TOML file overriding any GPU or network value (configs/hardware/*.toml)");
  c->add_option("--batch", a->batch,
                "Critical batch rule: default (sqrt(E) (C/3e23)^(1/6) x 4Mi tokens), fixed (4Mi), "
                "deepseek (sqrt(E) 0.292 C^0.3271)")
      ->capture_default_str();
  c->add_flag("--sparse", a->sparse, "Mixture of experts with the paper's sparsity rule");
  c->add_option("--months", a->months, "Training time limit")->capture_default_str();
  c->add_option("--pipeline", a->pipeline,
                "Pipeline schedule: 1f1b (interleaved), zero-bubble, or both (each layout tried "
                "with each)")
      ->capture_default_str();
  c->add_option("--seq-len", a->seq_len, "Tokens per sequence")->capture_default_str();
  c->add_flag("--no-overlap-tp", a->no_overlap_tp, "Do not hide TP bandwidth behind matmuls");
  c->add_flag("--no-overlap-dp", a->no_overlap_dp, "Do not hide DP bandwidth behind matmuls");
  c->add_flag("--no-overlap-pp", a->no_overlap_pp, "Do not hide PP bandwidth behind matmuls");
  c->add_option("--combine", a->combine,
                "How a step's parts add up: atoll (levels in sequence, all overlapped traffic "
                "behind the pipeline's matmuls) or reference (the Epoch notebook's "
                "training_results, with its committed settings: DP not overlapped unless "
                "--overlap-dp; docs/PLANNER.md)")
      ->capture_default_str();
  c->add_flag("--overlap-dp", a->overlap_dp,
              "With --combine reference: hide DP behind the pipeline (the notebook's overlap_DP = "
              "1)");
  c->add_flag("--json", a->json, "Print JSON instead of a table");
}

Status ResolveModel(const ModelArgs& a, Hardware* hw, ShapeRules* rules, SearchOptions* search) {
  ATOLL_ASSIGN_OR_RETURN(*hw, MakeHardware(a.gpu, a.network));
  if (!a.hardware_file.empty()) ATOLL_RETURN_IF_ERROR(ApplyHardwareOverrides(a.hardware_file, hw));
  ATOLL_ASSIGN_OR_RETURN(rules->batch, ParseBatchRule(a.batch));
  rules->sparse = a.sparse;
  if (a.seq_len < 1) return Status::InvalidArgument("--seq-len must be >= 1");
  rules->seq_len = a.seq_len;
  if (!(a.months > 0)) return Status::InvalidArgument("--months must be positive");
  search->both_schedules = a.pipeline == "both";
  if (a.pipeline == "1f1b" || a.pipeline == "both") {
    search->zero_bubble = false;
  } else if (a.pipeline == "zero-bubble" || a.pipeline == "zb") {
    search->zero_bubble = true;
  } else {
    return Status::InvalidArgument(fmt::format(
        "--pipeline: unknown schedule '{}' (expected 1f1b, zero-bubble or both)", a.pipeline));
  }
  search->eval.overlap_tp = !a.no_overlap_tp;
  search->eval.overlap_dp = !a.no_overlap_dp;
  search->eval.overlap_pp = !a.no_overlap_pp;
  if (a.combine == "reference") {
    search->eval.combine = Combine::kReference;
    // The notebook as committed: overlap_TP = overlap_PP = 1, overlap_DP = 0.
    search->eval.overlap_dp = a.overlap_dp;
    if (a.no_overlap_dp && a.overlap_dp)
      return Status::InvalidArgument("--overlap-dp and --no-overlap-dp contradict each other");
  } else if (a.combine != "atoll") {
    return Status::InvalidArgument(
        fmt::format("--combine: unknown '{}' (expected atoll or reference)", a.combine));
  } else if (a.overlap_dp) {
    return Status::InvalidArgument(
        "--overlap-dp goes with --combine reference (atoll's default "
        "already overlaps DP; --no-overlap-dp turns it off)");
  }
  return Status::Ok();
}

// ---- plan frontier ----------------------------------------------------------------------------
struct FrontierArgs {
  ModelArgs model;
  std::string min_flop = "1e24", max_flop = "1e34";
};

void RunFrontierCommand(const FrontierArgs& a) {
  FrontierSettings s;
  ExitIfError(ResolveModel(a.model, &s.hardware, &s.rules, &s.search).WithContext("plan frontier"));
  s.months = a.model.months;
  auto lo = ParseCount(a.min_flop), hi = ParseCount(a.max_flop);
  ExitIfError(lo.status().WithContext("plan frontier: --min-flop"));
  ExitIfError(hi.status().WithContext("plan frontier: --max-flop"));
  if (!(*lo < *hi)) ExitIfError(Status::InvalidArgument("plan frontier: --min-flop >= --max-flop"));
  s.min_flop = *lo;
  s.max_flop = *hi;
  FrontierResult r = RunFrontier(s);
  a.model.json ? PrintJson(FrontierJson(r, s)) : Print(FrontierReport(r, s));
}

// ---- plan run ---------------------------------------------------------------------------------
struct RunArgs {
  ModelArgs model;
  std::string params = "1T";
  int64_t datacenters = 1;
  std::string wan_bandwidth = "400Gbps";
  std::string wan_latency = "20ms";
  std::string strategy = "sync";
  int64_t inner_steps = 100;
  int bits = 16;
  bool streaming = false;
  std::string gpus_per_dc = "0";
};

void RunWorldCommand(const RunArgs& a) {
  WorldSettings s;
  ExitIfError(ResolveModel(a.model, &s.hardware, &s.rules, &s.search).WithContext("plan run"));
  s.months = a.model.months;
  auto params = ParseCount(a.params);
  ExitIfError(params.status().WithContext("plan run: --params"));
  s.params = *params;
  auto bw = ParseBitsPerSecond(a.wan_bandwidth);
  ExitIfError(bw.status().WithContext("plan run: --wan-bandwidth"));
  s.wan_bits_per_s = *bw;
  auto lat = ParseSeconds(a.wan_latency);
  ExitIfError(lat.status().WithContext("plan run: --wan-latency"));
  s.wan_latency_s = *lat;
  auto strategy = ParseWorldStrategy(a.strategy);
  ExitIfError(strategy.status().WithContext("plan run: --strategy"));
  s.strategy = *strategy;
  auto g = ParseCount(a.gpus_per_dc);
  ExitIfError(g.status().WithContext("plan run: --gpus-per-dc"));
  s.gpus_per_dc = static_cast<int64_t>(*g);
  s.datacenters = a.datacenters;
  s.inner_steps = a.inner_steps;
  s.wan_bits = a.bits;
  s.streaming = a.streaming;
  auto r = RunWorld(s);
  ExitIfError(r.status().WithContext("plan run"));
  a.model.json ? PrintJson(WorldJson(*r, s)) : Print(WorldReport(*r, s));
}

// ---- plan scaling -----------------------------------------------------------------------------
struct ScalingArgs {
  std::vector<std::string> params = {"100B", "1T", "10T", "100T", "1P"};
  std::vector<int64_t> datacenters = {2, 4, 8, 16, 32, 64};
  std::string wan_bandwidth = "400Gbps";
  std::string wan_latency = "20ms";
  int bits = 16;
  int64_t inner_steps = 100;
  int64_t replicas_per_dc = 64;
  bool json = false;
};

void RunScalingCommand(const ScalingArgs& a) {
  ScalingSettings s;
  s.params.clear();
  for (const auto& p : a.params) {
    auto v = ParseCount(p);
    ExitIfError(v.status().WithContext("plan scaling: --params"));
    s.params.push_back(*v);
  }
  for (int64_t d : a.datacenters) {
    if (d < 2) ExitIfError(Status::InvalidArgument("plan scaling: --datacenters must be >= 2"));
  }
  s.datacenters = a.datacenters;
  auto bw = ParseBitsPerSecond(a.wan_bandwidth);
  ExitIfError(bw.status().WithContext("plan scaling: --wan-bandwidth"));
  auto lat = ParseSeconds(a.wan_latency);
  ExitIfError(lat.status().WithContext("plan scaling: --wan-latency"));
  if (!(*bw > 0)) ExitIfError(Status::InvalidArgument("plan scaling: --wan-bandwidth must be > 0"));
  if (a.bits != 4 && a.bits != 8 && a.bits != 16) {
    ExitIfError(Status::InvalidArgument("plan scaling: --bits must be 16, 8 or 4"));
  }
  if (a.inner_steps < 1 || a.replicas_per_dc < 1) {
    ExitIfError(
        Status::InvalidArgument("plan scaling: --inner-steps and --replicas-per-dc must be >= 1"));
  }
  s.wan_bits_per_s = *bw;
  s.wan_latency_s = *lat;
  s.wan_bits = a.bits;
  s.inner_steps = a.inner_steps;
  s.replicas_per_dc = a.replicas_per_dc;
  ScalingResult r = RunScaling(s);
  a.json ? PrintJson(ScalingJson(r, s)) : Print(ScalingReport(r, s));
}

// ---- plan goodput -----------------------------------------------------------------------------
struct GoodputArgs {
  GoodputSettings s;
  std::string sdc_delay = "30min", checkpoint_cost = "20s", checkpoint_interval = "0";
  std::string restart = "120s", restart_per_1k = "7.5s", replica_cost = "2s";
  std::string replica_interval = "0", replica_restart = "30s", persistent_interval = "1h";
  std::string recovery = "checkpoint";
  std::string startup;  // bench/startup.sh's JSON
  int gpus_per_site = 8;
  bool json = false;
};

void RunGoodputCommand(GoodputArgs a) {
  struct Duration {
    const std::string* text;
    double* out;
    const char* flag;
  };
  for (const Duration& d :
       {Duration{&a.sdc_delay, &a.s.sdc_detection_delay_s, "--sdc-delay"},
        Duration{&a.checkpoint_cost, &a.s.checkpoint_cost_s, "--checkpoint-cost"},
        Duration{&a.checkpoint_interval, &a.s.checkpoint_interval_s, "--checkpoint-interval"},
        Duration{&a.restart, &a.s.restart_base_s, "--restart"},
        Duration{&a.restart_per_1k, &a.s.restart_per_1k_gpus_s, "--restart-per-1k-gpus"},
        Duration{&a.replica_cost, &a.s.replica_cost_s, "--replica-cost"},
        Duration{&a.replica_interval, &a.s.replica_interval_s, "--replica-interval"},
        Duration{&a.replica_restart, &a.s.replica_restart_base_s, "--replica-restart"},
        Duration{&a.persistent_interval, &a.s.persistent_interval_s, "--persistent-interval"}}) {
    auto v = ParseSeconds(*d.text);
    ExitIfError(v.status().WithContext(fmt::format("plan goodput: {}", d.flag)));
    *d.out = *v;
  }
  if (!a.startup.empty()) {
    auto text = ReadFile(a.startup);
    ExitIfError(text.status().WithContext("plan goodput: --startup"));
    const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded())
      ExitIfError(Status::InvalidArgument(fmt::format(
          "plan goodput: --startup {}: not JSON (bench/startup.sh writes it)", a.startup)));
    auto m = ParseMeasuredStartup(j);
    ExitIfError(m.status().WithContext(fmt::format("plan goodput: --startup {}", a.startup)));
    if (a.gpus_per_site < 1)
      ExitIfError(Status::InvalidArgument("plan goodput: --gpus-per-site must be >= 1"));
    ApplyMeasuredStartup(*m, a.gpus_per_site, &a.s);
  }
  if (a.recovery == "checkpoint") {
    a.s.recovery = Recovery::kCheckpoint;
  } else if (a.recovery == "replica") {
    a.s.recovery = Recovery::kReplica;
  } else {
    ExitIfError(Status::InvalidArgument(fmt::format(
        "plan goodput: --recovery must be checkpoint or replica, got '{}'", a.recovery)));
  }
  auto r = RunGoodput(a.s);
  ExitIfError(r.status().WithContext("plan goodput"));
  a.json ? PrintJson(GoodputJson(*r, a.s)) : Print(GoodputReport(*r, a.s));
}

// ---- plan calibrate ---------------------------------------------------------------------------
struct CalibrateArgs {
  std::vector<std::string> metrics;
  int64_t n_layer = 0, n_head = 0, n_embd = 0, seq_len = 0, vocab_size = 0, micro = 0;
  int skip = 2;
  bool json = false;
  std::string save;  // "" : don't; else the file (the flag alone: the default path)
  int threads = 1;
};

void RunCalibrateCommand(const CalibrateArgs& a) {
  ShapeOverrides o;
  auto set = [](int64_t v, std::optional<int64_t>* out) {
    if (v > 0) *out = v;
  };
  set(a.n_layer, &o.n_layer);
  set(a.n_head, &o.n_head);
  set(a.n_embd, &o.n_embd);
  set(a.seq_len, &o.seq_len);
  set(a.vocab_size, &o.vocab_size);
  set(a.micro, &o.micro_batch_tokens);
  if (a.skip < 0) ExitIfError(Status::InvalidArgument("plan calibrate: --skip must be >= 0"));
  std::vector<CalibrationRun> runs;
  for (const auto& path : a.metrics) {
    auto run = LoadCalibrationRun(path, o, a.skip);
    ExitIfError(run.status().WithContext("plan calibrate"));
    runs.push_back(*run);
  }
  auto fit = FitCalibration(&runs);
  ExitIfError(fit.status().WithContext("plan calibrate"));
  a.json ? PrintJson(CalibrationJson(runs, *fit)) : Print(CalibrationReport(runs, *fit));
  if (!a.save.empty()) {
    if (a.threads < 1)
      ExitIfError(Status::InvalidArgument("plan calibrate: --threads must be >= 1"));
    nlohmann::json j = CalibrationJson(runs, *fit);
    j["threads"] = a.threads;  // what atoll train scales its prediction from (train/predict.h)
    // Seconds per FLOP, per matmul, per parameter (0 where the fit left one out).
    j["coef"] = nlohmann::json::array();
    for (int i = 0; i < 3; ++i)
      j["coef"].push_back(fit->used[size_t(i)] ? fit->coef[size_t(i)] : 0.0);
    ExitIfError(MakeDirs(std::filesystem::path(a.save).parent_path().string().empty()
                             ? "."
                             : std::filesystem::path(a.save).parent_path().string()));
    ExitIfError(WriteFileAtomic(a.save, j.dump(2) + "\n").WithContext("plan calibrate --save"));
    std::fprintf(stderr, "plan calibrate: saved %s (atoll train predicts its steps from it)\n",
                 a.save.c_str());
  }
}

}  // namespace

void AddPlanCommands(CLI::App& app) {
  CLI::App* plan = app.add_subcommand(
      "plan", "Plan a training run: scaling frontier, datacenters, goodput, calibration");
  plan->require_subcommand(1);

  auto fr = std::make_shared<FrontierArgs>();
  CLI::App* f = plan->add_subcommand(
      "frontier",
      "Sweep compute from 1e24 to 1e34 FLOP: shape, batch, GPUs, layout, utilization and time per "
      "budget; where utilization falls (crossover_flop) and the largest run that finishes");
  // The sweep is the reference notebook's (docs/PLANNER.md 1.7): its combination, both pipeline
  // schedules; --combine atoll is ours.
  fr->model.combine = "reference";
  fr->model.pipeline = "both";
  AddModelOptions(f, &fr->model);
  f->add_option("--min-flop", fr->min_flop, "Smallest budget (FLOP)")->capture_default_str();
  f->add_option("--max-flop", fr->max_flop, "Largest budget (FLOP)")->capture_default_str();
  f->callback([fr] { RunFrontierCommand(*fr); });

  auto run = std::make_shared<RunArgs>();
  CLI::App* r =
      plan->add_subcommand("run",
                           "One model over D datacenters joined by WAN links: step-time breakdown, "
                           "utilization, wall time, WAN bytes, WAN bandwidth needed");
  AddModelOptions(r, &run->model);
  r->add_option("--params", run->params, "Model parameters (e.g. 100T, 1.5e12)")
      ->capture_default_str();
  r->add_option("--datacenters", run->datacenters, "Number of datacenters D")
      ->capture_default_str();
  r->add_option("--wan-bandwidth", run->wan_bandwidth,
                "WAN bandwidth per datacenter, each direction (e.g. 400Gbps, 50GB/s)")
      ->capture_default_str();
  r->add_option("--wan-latency", run->wan_latency, "WAN latency between datacenters (e.g. 20ms)")
      ->capture_default_str();
  r->add_option("--strategy", run->strategy, "sync (all-reduce every step) or diloco")
      ->capture_default_str();
  r->add_option("--inner-steps", run->inner_steps, "DiLoCo inner steps H between exchanges")
      ->capture_default_str();
  r->add_option("--bits", run->bits, "Bits per gradient word on the WAN: 16, 8 or 4")
      ->capture_default_str();
  r->add_flag("--streaming", run->streaming, "DiLoCo: overlap the exchange with inner steps");
  r->add_option("--gpus-per-dc", run->gpus_per_dc,
                "GPUs per datacenter (0: the fewest E x 2^i that finish in time)")
      ->capture_default_str();
  r->callback([run] { RunWorldCommand(*run); });

  auto sc = std::make_shared<ScalingArgs>();
  CLI::App* s = plan->add_subcommand(
      "scaling",
      "WAN traffic and communication time against model size and datacenter count "
      "for ring, hierarchical and DiLoCo exchanges, and whether they grow linearly");
  s->add_option("--params", sc->params, "Model sizes")->delimiter(',')->capture_default_str();
  s->add_option("--datacenters", sc->datacenters, "Datacenter counts")
      ->delimiter(',')
      ->capture_default_str();
  s->add_option("--wan-bandwidth", sc->wan_bandwidth, "WAN bandwidth per datacenter, each way")
      ->capture_default_str();
  s->add_option("--wan-latency", sc->wan_latency, "WAN latency")->capture_default_str();
  s->add_option("--bits", sc->bits, "Bits per gradient word: 16, 8 or 4")->capture_default_str();
  s->add_option("--inner-steps", sc->inner_steps, "DiLoCo H")->capture_default_str();
  s->add_option("--replicas-per-dc", sc->replicas_per_dc,
                "Data-parallel replicas per datacenter in the flat ring")
      ->capture_default_str();
  s->add_flag("--json", sc->json, "Print JSON instead of tables");
  s->callback([sc] { RunScalingCommand(*sc); });

  auto gp = std::make_shared<GoodputArgs>();
  CLI::App* g = plan->add_subcommand(
      "goodput",
      "Simulate failures, silent corruption, checkpoints and restarts (defaults: "
      "Llama 3, 466 interruptions in 54 days on 16,384 H100s); compare with Young/Daly");
  g->add_option("--gpus", gp->s.gpus, "GPUs in the run")->capture_default_str();
  g->add_option("--days", gp->s.days, "Wall-clock days simulated")->capture_default_str();
  g->add_option("--failure-rate", gp->s.failure_rate_per_gpu_hour,
                "Hard failures per GPU-hour (Llama 3: 460 / (16384 x 54 x 24))")
      ->capture_default_str();
  g->add_option("--sdc-rate", gp->s.sdc_rate_per_gpu_hour,
                "Silent data corruptions per GPU-hour (Llama 3: 6 in 54 days)")
      ->capture_default_str();
  g->add_option("--sdc-delay", gp->sdc_delay, "Time until a corruption is detected")
      ->capture_default_str();
  g->add_option("--checkpoint-cost", gp->checkpoint_cost, "Stall per checkpoint")
      ->capture_default_str();
  g->add_option("--checkpoint-interval", gp->checkpoint_interval,
                "Checkpoint every (0: Daly's optimum)")
      ->capture_default_str();
  g->add_option("--restart", gp->restart, "Restart time, fixed part")->capture_default_str();
  g->add_option("--restart-per-1k-gpus", gp->restart_per_1k, "Restart time per 1000 GPUs")
      ->capture_default_str();
  g->add_option("--replica-cost", gp->replica_cost, "Stall per in-memory replica refresh")
      ->capture_default_str();
  g->add_option("--replica-interval", gp->replica_interval, "Refresh every (0: Daly's optimum)")
      ->capture_default_str();
  g->add_option("--replica-restart", gp->replica_restart, "Restart from a replica, fixed part")
      ->capture_default_str();
  g->add_option("--persistent-interval", gp->persistent_interval,
                "Replica mode: persistent checkpoint every (for SDC roll-back)")
      ->capture_default_str();
  g->add_option("--recovery", gp->recovery, "Headline recovery: checkpoint or replica")
      ->capture_default_str();
  g->add_option("--startup", gp->startup,
                "Restart constants atoll measured (bench/startup.sh's JSON): they replace "
                "--restart, --restart-per-1k-gpus and --replica-restart")
      ->check(CLI::ExistingFile);
  g->add_option("--gpus-per-site", gp->gpus_per_site,
                "With --startup: GPUs (ranks) per site, to scale the measured constants")
      ->capture_default_str();
  g->add_option("--trials", gp->s.trials, "Monte Carlo trials per interval")->capture_default_str();
  g->add_option("--seed", gp->s.seed, "Seed of the failure draws")->capture_default_str();
  g->add_flag("--json", gp->json, "Print JSON instead of a table");
  g->callback([gp] { RunGoodputCommand(*gp); });

  auto cal = std::make_shared<CalibrateArgs>();
  CLI::App* c = plan->add_subcommand(
      "calibrate",
      "Fit this machine's constants (effective FLOP/s, per-matmul overhead) from "
      "RUN/metrics.jsonl files and print predicted vs measured step time per run");
  c->add_option("--metrics", cal->metrics, "RUN/metrics.jsonl (repeat for several runs)")
      ->required();
  c->add_option("--n-layer", cal->n_layer, "Override the model shape: layers");
  c->add_option("--n-head", cal->n_head, "... heads");
  c->add_option("--n-embd", cal->n_embd, "... width");
  c->add_option("--seq-len", cal->seq_len, "... sequence length (n_positions)");
  c->add_option("--vocab-size", cal->vocab_size, "... vocabulary");
  c->add_option("--micro-batch-tokens", cal->micro, "Tokens per forward/backward");
  c->add_option("--skip", cal->skip, "Warm-up steps to ignore")->capture_default_str();
  c->add_flag("--json", cal->json, "Print JSON instead of a table");
  c->add_option("--save", cal->save,
                "Also save the fit for atoll train's step-time prediction (e.g. "
                ".cache/calibration.json, where atoll train looks)");
  c->add_option("--threads", cal->threads,
                "OpenMP threads the runs had (train.threads): the prediction scales from it")
      ->capture_default_str();
  c->callback([cal] { RunCalibrateCommand(*cal); });
}

}  // namespace atl::cli
