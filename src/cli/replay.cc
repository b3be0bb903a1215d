// atoll replay: re-execute an asynchronous run from its operation log (train/replay.h).
#include "train/replay.h"

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "cli/commands.h"
#include "core/log.h"
#include "core/status.h"

namespace atl::cli {

namespace {

struct ReplayArgs {
  std::string run;
  std::string work;
  bool quiet = false;
};

// 0: bitwise identical; 1: different (or the replay diverged); 2: bad input.
int RunReplay(const ReplayArgs& a) {
  ReplayOptions o;
  o.run_dir = a.run;
  o.work_dir = a.work;
  o.progress = !a.quiet;
  const double t0 = NowSeconds();
  auto r = Replay(o);
  ExitIfError(r.status());
  const double dt = NowSeconds() - t0;
  if (r->identical) {
    std::printf(
        "replayed %lld updates of %d sites in %.1f s: final parameters bitwise identical to "
        "%s/checkpoint (xxh3 %016llx)\n",
        static_cast<long long>(r->updates), r->sites, dt, a.run.c_str(),
        static_cast<unsigned long long>(r->replayed_hash));
    return 0;
  }
  std::printf(
      "replayed %lld updates of %d sites: final parameters DIFFER from %s/checkpoint (xxh3 "
      "%016llx replayed, %016llx in the checkpoint; first difference at parameter %zu)%s\n",
      static_cast<long long>(r->updates), r->sites, a.run.c_str(),
      static_cast<unsigned long long>(r->replayed_hash),
      static_cast<unsigned long long>(r->checkpoint_hash), r->first_difference,
      r->elsewhere.empty() ? "" : (": not bitwise here because " + r->elsewhere).c_str());
  return 1;
}

}  // namespace

void AddReplayCommand(CLI::App& app) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Re-execute an asynchronous run from its operation log and check it bitwise");
  cmd->footer(
      "Reads DIR/config.toml, DIR/ops.jsonl (the coordinator's operation log: every update the\n"
      "parameter server applied or refused, in order) and DIR/checkpoint (the run's final\n"
      "parameters), where DIR is the `atoll launch --out` of a run with world.strategy = "
      "\"async\".\n"
      "Every site is run again in this process (one thread each) and its pushes are served in\n"
      "the logged order; each re-executed update must match the logged checksum.\n"
      "The data (data.dir in DIR/config.toml) must be the run's: checked against the checkpoint's\n"
      "manifest. Bitwise identity needs the run's build on the same kind of CPU: the op log names\n"
      "them, and a replay elsewhere says so.\n"
      "Exit status: 0 when the final parameters are bitwise identical to the checkpoint's, 1 when\n"
      "they differ or an update diverged (named), 2 for a bad run directory or other data.\n"
      "Example:\n"
      "  atoll launch --config configs/world-demo.toml --set world.strategy=async --out runs/a\n"
      "  atoll replay --run runs/a");
  cmd->add_option("--run", args->run, "The run directory (atoll launch --out)")
      ->required()
      ->check(CLI::ExistingDirectory);
  cmd->add_option("--work", args->work,
                  "Scratch directory for the re-executed sites (default: DIR/replay)");
  cmd->add_flag("--quiet,-q", args->quiet, "No progress output");
  cmd->callback([args] {
    const int rc = RunReplay(*args);
    std::fflush(stdout);
    if (rc != 0) std::exit(rc);
  });
}

}  // namespace atl::cli
