// atoll sdc-campaign: the fault-injection campaign (train/sdc/campaign.h).
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/file.h"
#include "core/log.h"
#include "core/status.h"
#include "train/sdc/campaign.h"

namespace atl::cli {

namespace {

struct CampaignArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  int64_t injections = 192;
  std::string kinds = "gemm_fwd,gemm_bwd,activation,grad,param,moment";
  std::string bits = "0-31";
  uint64_t seed = 1;
  int64_t first_step = 10;
  int64_t clean_steps = 0;
  double harm = 1e-3;
  bool quiet = false;
};

Status RunCampaignCommand(const CampaignArgs& a) {
  CampaignOptions o;
  // The campaign's defaults, under the user's overrides: replay alarmed steps (to localize and
  // recover), validate only at the end (the harm measure).
  std::vector<std::string> sets = {"sdc.on_alarm=redo", "train.eval_every=0"};
  sets.insert(sets.end(), a.sets.begin(), a.sets.end());
  ATOLL_ASSIGN_OR_RETURN(o.cfg, LoadRunConfig(a.config, sets));
  ATOLL_ASSIGN_OR_RETURN(o.kinds, ParseFaultKinds(a.kinds));
  ATOLL_ASSIGN_OR_RETURN(o.bits, ParseBits(a.bits));
  o.injections = a.injections;
  o.seed = a.seed;
  o.first_step = a.first_step;
  o.clean_steps = a.clean_steps;
  o.harm = a.harm;
  o.dir = a.out;
  const double t0 = NowSeconds();
  if (!a.quiet)
    o.progress = [t0](int64_t done, int64_t total, const std::string& what) {
      std::fprintf(stderr, "[%lld/%lld %.0fs] %s\n", static_cast<long long>(done),
                   static_cast<long long>(total), NowSeconds() - t0, what.c_str());
    };
  // The runs' own warnings (every flip, every detection) are in their logs and the outcomes.
  SetLogLevel(LogLevel::kError);
  auto r = RunCampaign(o);
  SetLogLevel(LogLevel::kInfo);
  ATOLL_RETURN_IF_ERROR(r.status());
  const std::string tables = CampaignTables(*r);
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(a.out + "/tables.md", tables));
  std::fputs(tables.c_str(), stdout);
  if (!a.quiet)
    std::fprintf(stderr, "%lld injections in %.0f s; %s/injections.jsonl, tables.md, bits.csv\n",
                 static_cast<long long>(r->outcomes.size()), NowSeconds() - t0, a.out.c_str());
  return Status::Ok();
}

}  // namespace

void AddSdcCommand(CLI::App& app) {
  auto args = std::make_shared<CampaignArgs>();
  CLI::App* cmd = app.add_subcommand(
      "sdc-campaign",
      "Inject bit flips into many short training runs and measure the corruption detectors");
  cmd->footer(
      "Trains the config once clean, then once per injection with one bit flip ([faults], see\n"
      "`atoll train --help`): injection i flips bit i mod B of the B --bits at site i / B of\n"
      "--kinds (cycling), at a drawn step from --first-step on, on a drawn rank (the\n"
      "parallel.dp x tp x pp ranks run as threads of this process; with world.sites > 1, a\n"
      "drawn site too: the sites of a sync world run as threads, their leaders joined by the\n"
      "WAN transport on loopback, and --kinds may add wan). Each run's sdc events are\n"
      "scored against the flip: detected (by which detector, how many steps later), localized\n"
      "(the event names the rank, micro-batch, block and op, or the tensor), recovered (final\n"
      "parameters bitwise those of the clean run) and harm (the final validation loss's\n"
      "relative change; a missed flip above --harm is a harmful miss). Events before a flip, and "
      "in the clean runs, are false positives.\n"
      "Defaults under --set: sdc.on_alarm=redo, train.eval_every=0.\n"
      "Writes OUT/injections.jsonl (an outcome per line, as they finish), OUT/tables.md (also\n"
      "printed) and OUT/bits.csv (detection rate per bit: bench/plot_sdc.py draws it).\n"
      "Examples:\n"
      "  atoll sdc-campaign --config configs/tiny.toml --out runs/sdc --injections 192\n"
      "  atoll sdc-campaign --config configs/tiny.toml --set parallel.dp=2 --out runs/sdc-dp2\n"
      "  atoll sdc-campaign --config configs/tiny.toml --set sdc.on_alarm=warn --kinds grad \\\n"
      "      --injections 32 --out runs/sdc-guard\n"
      "  atoll sdc-campaign --config configs/tiny.toml --set world.sites=2 \\\n"
      "      --set world.ranks_per_site=1 --kinds grad,param,wan --out runs/sdc-sites");
  cmd->add_option("--config", args->config, "TOML config file (e.g. configs/tiny.toml)")
      ->required()
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", args->out, "Campaign directory")->required();
  cmd->add_option("--injections", args->injections, "Runs with one flip each")
      ->capture_default_str();
  cmd->add_option("--kinds", args->kinds,
                  "Injection sites, comma-separated: gemm_fwd, gemm_bwd, activation, grad, "
                  "param, moment, wan (world.sites > 1)")
      ->capture_default_str();
  cmd->add_option("--bits", args->bits,
                  "Bits flipped, cycled: ranges and bits, comma-separated (31 sign, 23-30 "
                  "exponent, 0-22 mantissa)")
      ->capture_default_str();
  cmd->add_option("--seed", args->seed, "Keys the drawn steps, ranks, layers, elements")
      ->capture_default_str();
  cmd->add_option("--first-step", args->first_step,
                  "Earliest step struck (1-based; the guard warms up over the first 8)")
      ->capture_default_str();
  cmd->add_option("--clean-steps", args->clean_steps,
                  "Also train this many steps clean, counting false positives (0: only the "
                  "reference run)")
      ->capture_default_str();
  cmd->add_option("--harm", args->harm,
                  "Relative change of the final validation loss that makes a flip harmful")
      ->capture_default_str();
  cmd->add_flag("--quiet,-q", args->quiet, "No progress output");
  cmd->callback([args] { ExitIfError(RunCampaignCommand(*args)); });
}

}  // namespace atl::cli
