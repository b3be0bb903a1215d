// atoll train: train a GPT on this machine (see train/trainer.h).
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "comm/mpi.h"
#include "core/status.h"
#include "train/checkpoint.h"
#include "train/config.h"
#include "train/trainer.h"

namespace atl::cli {

namespace {

struct TrainArgs {
  std::string config;
  std::vector<std::string> sets;
  std::string out;
  std::string resume;
  bool quiet = false;
  bool mpi = false;
};

// Started by mpirun / srun (OpenMPI or PMIx set these), or asked for with --mpi.
bool UnderMpi(bool flag) {
  return flag || std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ||
         std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_RANK") != nullptr;
}

Status RunTrain(const TrainArgs& a) {
  std::unique_ptr<Checkpoint> ck;
  RunConfig cfg;
  if (!a.resume.empty()) {
    auto loaded = LoadCheckpoint(a.resume, /*with_optimizer=*/true);
    if (!loaded.ok()) return loaded.status().WithContext("--resume");
    ck = std::make_unique<Checkpoint>(std::move(loaded).value());
  }
  if (!a.config.empty()) {
    ATOLL_ASSIGN_OR_RETURN(cfg, LoadRunConfig(a.config, a.sets));
  } else if (ck != nullptr) {
    // The checkpoint's own config, with the overrides on top (e.g. --set train.steps=2000).
    cfg = ck->config;
    for (const auto& o : a.sets) ATOLL_RETURN_IF_ERROR(ApplyConfigOverride(&cfg, o));
    ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  } else {
    return Status::InvalidArgument("train: --config FILE is required (or --resume CHECKPOINT)");
  }
  // MPI only under mpirun: a single process never initializes it.
  std::unique_ptr<MpiCommunicator> world;
  if (UnderMpi(a.mpi)) {
    ATOLL_ASSIGN_OR_RETURN(world, MpiCommunicator::CreateWorld(nullptr, nullptr));
  }
  TrainOptions options;
  options.out_dir = a.out;
  options.resume = ck.get();
  options.resume_path = a.resume;
  options.progress = !a.quiet && (world == nullptr || world->rank() == 0);
  options.comm = world.get();
  ATOLL_ASSIGN_OR_RETURN(std::string path, Train(cfg, options));
  if (world == nullptr || world->rank() == 0) {
    std::printf("%s\n", path.c_str());
    std::fflush(stdout);
  }
  return Status::Ok();
}

}  // namespace

void AddTrainCommand(CLI::App& app) {
  auto args = std::make_shared<TrainArgs>();
  CLI::App* cmd = app.add_subcommand("train", "Train a GPT on this machine");
  cmd->footer(
      "Writes OUT/metrics.jsonl (one JSON object per step), OUT/config.toml (the effective\n"
      "config), OUT/checkpoint (the final checkpoint; its path is printed on stdout) and, with\n"
      "train.checkpoint_every > 0, OUT/checkpoint-<step>. A progress bar goes to stderr.\n"
      "Config keys (section.key, all optional; see configs/*.toml):\n"
      "  [model] n_layer n_head n_embd seq_len vocab_size\n"
      "  [train] steps seed batch_size micro_batch_size lr min_lr warmup_steps weight_decay\n"
      "          beta1 beta2 eps grad_clip eval_every eval_batches checkpoint_every threads\n"
      "  [data]  dir\n"
      "  [parallel] dp tp pp schedule zero reproducible bucket_mb overlap   (dp * tp * pp = ranks)\n"
      "Examples:\n"
      "  atoll train --config configs/small.toml --out runs/s1 --set train.steps=200\n"
      "  atoll train --resume runs/s1/checkpoint-100 --out runs/s1\n"
      "  mpirun -n 2 atoll train --config configs/small.toml --set parallel.dp=2 --out runs/dp2\n"
      "  mpirun -n 8 atoll train --config configs/small.toml --set parallel.dp=2 \\\n"
      "      --set parallel.tp=2 --set parallel.pp=2 --out runs/mesh");
  cmd->add_option("--config", args->config, "TOML config file (e.g. configs/small.toml)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--set", args->sets, "Override a config key: section.key=value (repeatable)");
  cmd->add_option("--out", args->out, "Run directory")->required();
  cmd->add_option("--resume", args->resume,
                  "Continue from a checkpoint directory (its config unless --config is given); "
                  "bitwise the same as not stopping")
      ->check(CLI::ExistingDirectory);
  cmd->add_flag("--quiet,-q", args->quiet, "No progress output");
  cmd->add_flag("--mpi", args->mpi,
                "Initialize MPI (automatic under mpirun/srun: OMPI_COMM_WORLD_SIZE, PMIX_RANK)");
  cmd->callback([args] { ExitIfError(RunTrain(*args)); });
}

}  // namespace atl::cli
