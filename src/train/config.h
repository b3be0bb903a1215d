// The run configuration: what `atoll train` reads from a TOML file and `--set` overrides.
//
// Sections [model], [train], [data], [parallel] (the mesh of one site: dp x tp x pp ranks) and
// [world] (sites joined by WAN links: world.sites, ranks_per_site, strategy, and a [world.link]
// table of latency_ms / bandwidth_mbps / jitter_ms with per-pair overrides [world.link."0-2"]).
// Every key has a default (the `small` preset), so a config file may name only what it changes. An
// unknown section or key, a value of the wrong type, or a value out of range is an error that names
// the key ("train.lr:
// ...").
//
// `--set section.key=value` overrides one key after the file is read; the value is typed by the
// key (an integer key takes a TOML integer, a float key a TOML float or integer, a string key any
// text), so `--set train.lr=3e-4 --set data.dir=/tmp/d` need no quoting.
//
// The effective configuration (file + overrides) is written into the run directory as TOML and
// into each checkpoint's manifest as JSON; both read back to the same values, bit for bit.
//
// Thread-safety: values and pure functions.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "core/status.h"
#include "kernels/attention_blocks.h"
#include "model/config.h"
#include "world/link.h"

namespace atl {

struct TrainConfig {
  int64_t steps = 300;           // optimizer steps
  int64_t seed = 1337;           // keys every random draw (init, data sampling)
  int64_t batch_size = 16;       // sequences per optimizer step
  int64_t micro_batch_size = 8;  // sequences per forward/backward (accumulation = batch / micro)
  double lr = 3e-3;              // peak learning rate, reached after warmup
  double min_lr = 3e-4;          // cosine decays to this at the last step
  int64_t warmup_steps = 30;     // linear warmup
  double weight_decay = 0.1;     // decoupled (AdamW), on 2-D weights only
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;    // global-norm clipping threshold; 0 disables
  int64_t eval_every = 100;  // validation loss every N steps (and at the end); 0: only at end
  int64_t eval_batches = 8;  // validation batches of micro_batch_size windows; 0: no eval
  // also write DIR/checkpoint-<step> every N steps; 0: the final one only; -1: none at all
  // (benchmarks, throwaway runs)
  int64_t checkpoint_every = 0;
  int64_t threads = 0;  // OpenMP threads; 0: OMP_NUM_THREADS if set, else all cores
  // "cpu" or "cuda": where each rank's model runs. A CUDA rank uses the GPU of ordinal (local
  // rank modulo the GPUs it sees): OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID or LOCAL_RANK.
  std::string device = "cpu";
  // "fp32", or "bf16" (train.device = cuda only): the GPU's matrix products on bf16 operands,
  // accumulated and written in float; parameters, gradients, activations and the optimizer's
  // state stay float (kernels/cuda/ops.h SetBf16Matmul).
  std::string precision = "fp32";
  // The GPU's tensor-core attention (bf16, heads up to 64; kernels/attention_blocks.h), a question
  // of speed alone: "auto" (each rank times the block-row settings at the run's shape when it
  // starts and takes the fastest) or "Q/K", the forward's and dQ's query rows and the dK/dV
  // kernel's key rows, 64 or 128 each. Every setting gives the same bits.
  std::string attention_rows = "auto";
  // How that attention's backward computes dQ: "split" (a kernel of its own) or "fused" (from the
  // dK/dV kernel's partial sums, added in a fixed order: dQ's bits are another order of sums).
  std::string attention_backward = "split";
  // Start from these weights instead of a random initialization: an atoll checkpoint or a
  // Hugging Face GPT-2 directory (train/hf_import.h), whose model shape must be [model]'s; the
  // optimizer starts afresh at step 0. Ignored by --resume (the checkpoint's weights win).
  std::string init_from;

  int64_t accumulation_steps() const { return batch_size / micro_batch_size; }
  bool operator==(const TrainConfig&) const = default;
};

struct DataConfig {
  std::string dir = ".cache/data/sotu";  // holds train.bin and val.bin (`atoll data prepare`)
  bool operator==(const DataConfig&) const = default;
};

// The mesh of one site and how data-parallel gradients are reduced (train/trainer.h).
struct ParallelConfig {
  int64_t dp = 1;                 // data-parallel replicas; dp * tp * pp = MPI world size
  int64_t tp = 1;                 // tensor-parallel ranks (Megatron: heads and MLP columns split)
  int64_t pp = 1;                 // pipeline stages (blocks split into consecutive stages)
  std::string schedule = "1f1b";  // pipeline schedule: "1f1b" or "gpipe"
  bool zero = false;              // ZeRO-1: optimizer state sharded over the dp replicas
  bool reproducible = false;      // bitwise-identical parameters for any dp (fixed-point reduction)
  double bucket_mb = 4.0;         // data-parallel all-reduce bucket size, MiB
  bool overlap = true;            // start each bucket's reduction during backward (false: after it)
  // "nccl": GPU ranks' tensor-parallel all-reduces, and their data-parallel gradients in the
  // normal mode (not reproducible, zero or sdc.checksums), over NCCL in GPU memory
  std::string comm = "mpi";
  bool operator==(const ParallelConfig&) const = default;
};

// Sites joined by WAN links (world/): how many, their ranks, how their replicas agree, and the
// emulated links between their leaders.
struct WorldConfig {
  int64_t sites = 1;           // 1: a single site, no coordinator or WAN
  int64_t ranks_per_site = 1;  // MPI ranks per site: parallel.dp * tp * pp
  // "sync": hierarchical all-reduce every step; "diloco": H inner steps, then an outer Nesterov
  // step on the averaged pseudo-gradient; "streaming": DiLoCo by fragments, each exchange
  // overlapped with inner steps; "async": parameter-server updates with bounded staleness.
  std::string strategy = "sync";
  double heartbeat_s = 1.0;      // coordinator heartbeat interval (sites beat twice per interval)
  int64_t dead_after_beats = 3;  // a site silent for this many intervals is declared dead
  int64_t quorum = 0;            // fewest live sites an exchange may complete with; 0: a majority
  std::string codec = "none";    // what crosses sites (not sync): none, bf16, int8, int4
  // Each site's share of a step's micro-batches follows its measured speed (its compute time per
  // micro-batch: sync, the agreed steps'; diloco, streaming: the paces voted at the last merged
  // exchange, so the sites' rounds take about the same wall time); false: equal shares. Not for
  // async. Needs parallel.pp = 1.
  bool balance = false;
  struct DiLoCo {
    int64_t inner_steps = 100;    // H: inner (AdamW) steps between outer steps / async pushes
    double outer_lr = 0.7;        // outer Nesterov SGD learning rate
    double outer_momentum = 0.9;  // ... and momentum
    bool operator==(const DiLoCo&) const = default;
  } diloco;
  struct Streaming {
    int64_t fragments = 4;      // P: parameter fragments, synced on a staggered schedule
    int64_t overlap_steps = 5;  // tau: inner steps each fragment's exchange overlaps
    double alpha = 0.5;         // merge: local = alpha * local + (1 - alpha) * global
    bool operator==(const Streaming&) const = default;
  } streaming;
  struct Async {
    int64_t max_staleness = 8;  // S: an update more than S versions behind is refused
    bool operator==(const Async&) const = default;
  } async;
  LinkProfile link;  // [world.link]: every pair of sites, both directions
  // [world.link."A-B"] (A < B, site indices): overrides for the pair, both directions.
  std::map<std::string, LinkProfile> pairs;
  // The profile of the link between sites a and b.
  LinkProfile Link(int a, int b) const;
  bool operator==(const WorldConfig&) const = default;
};

// [faults]: bit flips injected on purpose (train/sdc/faults.h), for silent-data-corruption
// experiments. Empty: none.
struct FaultsConfig {
  std::string inject;  // specs joined by ';', e.g. "param:step=5,bit=30;gemm_fwd:step=9,layer=1"
  int64_t seed = 1;    // keys the draws of unset layers, GEMMs, elements and bits
  bool operator==(const FaultsConfig&) const = default;
};

// [sdc]: silent-data-corruption detectors (train/sdc/monitor.h).
struct SdcConfig {
  bool guard = true;          // robust outlier checks on loss, norms, updates, activations
  bool fingerprints = true;   // compare data-parallel replicas' parameter hashes every step
  int64_t moments_every = 1;  // ... and their AdamW moments every N steps (0: never)
  bool checksums = false;     // GEMM column checksums (train/sdc/checksum.h)
  bool memory = true;         // seal parameters and moments after each update (train/sdc/memory.h)
  double guard_threshold = 10;  // an outlier is this many robust deviations off the median
  int64_t guard_window = 32;    // clean steps the guard's medians are over
  // "warn": log and report; "stop": end the run (exit 1); "redo": roll the step back, replay it
  // and go on with the replay's result (train/sdc/audit.h)
  std::string on_alarm = "warn";
  int64_t audit_every = 0;  // also replay every N-th step without an alarm (0: never)
  // A rank the replays find computing wrong results: "stop" the run, or "exclude" its site (sync
  // over several sites with a coordinator: the site leaves, the others take over its share).
  std::string on_faulty = "stop";
  bool operator==(const SdcConfig&) const = default;
};

struct RunConfig {
  GPTConfig model{.vocab_size = 50257, .seq_len = 128, .n_layer = 4, .n_head = 4, .n_embd = 192};
  TrainConfig train;
  DataConfig data;
  ParallelConfig parallel;
  WorldConfig world;
  FaultsConfig faults;
  SdcConfig sdc;
  bool operator==(const RunConfig&) const = default;
};

// One configurable key: where it lives and a pointer to its value in a RunConfig.
struct ConfigKey {
  std::string_view section;
  std::string_view name;
  std::variant<int*, int64_t*, double*, std::string*, bool*> value;
  std::string_view help;
  std::string path() const { return std::string(section) + "." + std::string(name); }
};

// Every key of `cfg`, in the order they are serialized.
std::vector<ConfigKey> ConfigKeys(RunConfig& cfg);

// Parses TOML text (`source` names it in errors) over the defaults. Does not validate ranges.
StatusOr<RunConfig> ParseRunConfig(std::string_view toml_text, const std::string& source);

// Applies one "section.key=value" override.
Status ApplyConfigOverride(RunConfig* cfg, std::string_view assignment);

// Checks types' ranges and the relations between keys; the error names the key.
Status ValidateRunConfig(const RunConfig& cfg);

// train.attention_rows and train.attention_backward read into *rows (the default for "auto",
// with *automatic true) and *kind; InvalidArgument naming the key when one does not parse.
// ValidateRunConfig checks them with this, and the GPU's setup (train/gpu_setup.cc) reads them.
Status ParseAttentionSettings(const TrainConfig& t, kernels::AttentionBlockRows* rows,
                              bool* automatic, kernels::AttentionBackwardKind* kind);

// A site pair "A-B" (A < B, the name of a [world.link."A-B"] table); false if `text` is not one.
bool ParseSitePair(std::string_view text, int* a, int* b);

// The checks that need the MPI world size: dp * tp * pp == world_size, and tp, pp not yet above 1.
// Errors are kInvalidArgument (exit 2) naming the keys.
Status ValidateParallel(const RunConfig& cfg, int world_size);

// Reads `path` (or starts from the defaults if `path` is empty), applies `overrides` in order and
// validates. Errors are kInvalidArgument / kNotFound (exit code 2).
StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                  const std::vector<std::string>& overrides);

// The effective config as TOML text (reads back to the same values) and as a JSON object
// {"model": {...}, "train": {...}, "data": {...}, "parallel": {...}}.
std::string RunConfigToToml(const RunConfig& cfg);
nlohmann::json RunConfigToJson(const RunConfig& cfg);
// Reads the JSON form back. Unknown, missing or mistyped keys are errors (a manifest's config must
// be complete; a missing "parallel" section, from manifests written before it existed, means the
// defaults); the result is validated.
StatusOr<RunConfig> RunConfigFromJson(const nlohmann::json& j);

}  // namespace atl
