// The checks of a run's config (train/config.h): every key's range, and how the keys fit
// together (batch and micro-batches, the mesh, the world and its strategies).
#include <fmt/format.h>

#include <cmath>

#include "model/backend.h"
#include "train/config.h"
#include "train/sdc/faults.h"
#include "world/codec.h"

namespace atl {

Status ParseAttentionSettings(const TrainConfig& t, kernels::AttentionBlockRows* rows,
                              bool* automatic, kernels::AttentionBackwardKind* kind) {
  *automatic = t.attention_rows == "auto";
  *rows = {};
  if (!*automatic && !kernels::ParseAttentionBlockRows(t.attention_rows, rows))
    return Status::InvalidArgument(
        fmt::format("train.attention_rows: must be auto or Q/K with query and key rows 64 or 128 "
                    "(64/64, 128/64, 64/128, 128/128), got \"{}\"",
                    t.attention_rows));
  if (!kernels::ParseAttentionBackwardKind(t.attention_backward, kind))
    return Status::InvalidArgument(fmt::format(
        "train.attention_backward: must be split or fused, got \"{}\"", t.attention_backward));
  return Status::Ok();
}

Status ValidateRunConfig(const RunConfig& c) {
  auto bad = [](std::string_view key, const std::string& why) {
    return Status::InvalidArgument(fmt::format("{}: {}", key, why));
  };
  const GPTConfig& m = c.model;
  if (std::string why = ValidateConfig(m); !why.empty()) return Status::InvalidArgument(why);
  if (m.seq_len > 16384) return bad("model.seq_len", fmt::format("{} > 16384", m.seq_len));
  if (m.n_layer > 1024) return bad("model.n_layer", fmt::format("{} > 1024", m.n_layer));
  if (m.n_embd > 65536) return bad("model.n_embd", fmt::format("{} > 65536", m.n_embd));

  const TrainConfig& t = c.train;
  // Steps fold into the RNG counter below 2^40 (core/rng.cc).
  if (t.steps < 1 || t.steps >= (int64_t{1} << 40))
    return bad("train.steps", fmt::format("must be in [1, 2^40), got {}", t.steps));
  if (t.seed < 0) return bad("train.seed", fmt::format("must be >= 0, got {}", t.seed));
  if (t.batch_size < 1)
    return bad("train.batch_size", fmt::format("must be >= 1, got {}", t.batch_size));
  if (t.micro_batch_size < 1)
    return bad("train.micro_batch_size", fmt::format("must be >= 1, got {}", t.micro_batch_size));
  if (t.batch_size % t.micro_batch_size != 0)
    return bad("train.batch_size", fmt::format("{} is not divisible by train.micro_batch_size {}",
                                               t.batch_size, t.micro_batch_size));
  auto finite = [](double v) { return std::isfinite(v); };
  if (!finite(t.lr) || t.lr <= 0) return bad("train.lr", fmt::format("must be > 0, got {}", t.lr));
  if (!finite(t.min_lr) || t.min_lr < 0 || t.min_lr > t.lr)
    return bad("train.min_lr",
               fmt::format("must be in [0, train.lr = {}], got {}", t.lr, t.min_lr));
  // warmup_steps > steps is allowed: a short run (--set train.steps=5) stays in warmup.
  if (t.warmup_steps < 0)
    return bad("train.warmup_steps", fmt::format("must be >= 0, got {}", t.warmup_steps));
  if (!finite(t.weight_decay) || t.weight_decay < 0)
    return bad("train.weight_decay", fmt::format("must be >= 0, got {}", t.weight_decay));
  if (!finite(t.beta1) || t.beta1 < 0 || t.beta1 >= 1)
    return bad("train.beta1", fmt::format("must be in [0, 1), got {}", t.beta1));
  if (!finite(t.beta2) || t.beta2 < 0 || t.beta2 >= 1)
    return bad("train.beta2", fmt::format("must be in [0, 1), got {}", t.beta2));
  if (!finite(t.eps) || t.eps <= 0)
    return bad("train.eps", fmt::format("must be > 0, got {}", t.eps));
  if (!finite(t.grad_clip) || t.grad_clip < 0)
    return bad("train.grad_clip", fmt::format("must be >= 0 (0: off), got {}", t.grad_clip));
  if (t.eval_every < 0)
    return bad("train.eval_every", fmt::format("must be >= 0, got {}", t.eval_every));
  if (t.eval_batches < 0)
    return bad("train.eval_batches", fmt::format("must be >= 0, got {}", t.eval_batches));
  if (t.checkpoint_every < -1)
    return bad(
        "train.checkpoint_every",
        fmt::format("must be >= -1 (-1: none, 0: at the end only), got {}", t.checkpoint_every));
  if (t.threads < 0 || t.threads > 4096)
    return bad("train.threads", fmt::format("must be in [0, 4096], got {}", t.threads));
  if (c.data.dir.empty()) return bad("data.dir", "must not be empty");
  if (Device d; !ParseDevice(t.device, &d))
    return bad("train.device", fmt::format("must be cpu or cuda, got \"{}\"", t.device));
  if (t.precision != "fp32" && t.precision != "bf16")
    return bad("train.precision", fmt::format("must be fp32 or bf16, got \"{}\"", t.precision));
  if (t.precision == "bf16" && t.device != "cuda")
    return bad("train.precision",
               "bf16 needs train.device = cuda (the CPU computes in fp32; bf16 products are the "
               "GPU's tensor cores)");
  {
    kernels::AttentionBlockRows rows;
    bool automatic = false;
    kernels::AttentionBackwardKind kind{};
    ATOLL_RETURN_IF_ERROR(ParseAttentionSettings(t, &rows, &automatic, &kind));
  }
  if (t.device == "cuda" && c.model.n_head > 0 && c.model.n_embd / c.model.n_head > 128)
    return bad("train.device",
               fmt::format("the GPU's attention takes head sizes up to 128; model.n_embd / "
                           "model.n_head = {}",
                           c.model.n_embd / c.model.n_head));

  const ParallelConfig& p = c.parallel;
  for (auto [key, v] :
       {std::pair{"parallel.dp", p.dp}, {"parallel.tp", p.tp}, {"parallel.pp", p.pp}})
    if (v < 1 || v > 65536) return bad(key, fmt::format("must be in [1, 65536], got {}", v));
  if (c.model.n_head % p.tp != 0)
    return bad("parallel.tp", fmt::format("must divide model.n_head = {} (heads are split across "
                                          "tensor-parallel ranks), got {}",
                                          c.model.n_head, p.tp));
  if (p.pp > c.model.n_layer)
    return bad("parallel.pp", fmt::format("must be at most model.n_layer = {} (a stage holds at "
                                          "least one block), got {}",
                                          c.model.n_layer, p.pp));
  if (p.comm != "mpi" && p.comm != "nccl")
    return bad("parallel.comm", fmt::format("must be \"mpi\" or \"nccl\", got \"{}\"", p.comm));
  if (p.comm == "nccl" && c.train.device != "cuda")
    return bad("parallel.comm", "nccl needs train.device = cuda (it moves GPU memory)");
  if (p.schedule != "1f1b" && p.schedule != "gpipe")
    return bad("parallel.schedule",
               fmt::format("must be \"1f1b\" or \"gpipe\", got \"{}\"", p.schedule));
  if (p.zero && p.reproducible && p.pp > 1)
    return bad("parallel.zero", "parallel.zero with parallel.reproducible needs parallel.pp = 1");
  if (!finite(p.bucket_mb) || p.bucket_mb <= 0 || p.bucket_mb > 4096)
    return bad("parallel.bucket_mb", fmt::format("must be in (0, 4096], got {}", p.bucket_mb));
  if (t.batch_size % p.dp != 0 || (t.batch_size / p.dp) % t.micro_batch_size != 0)
    return bad("parallel.dp",
               fmt::format("train.batch_size {} must split into parallel.dp = {} equal shares of "
                           "whole micro-batches of train.micro_batch_size {}",
                           t.batch_size, p.dp, t.micro_batch_size));

  const WorldConfig& w = c.world;
  if (w.sites < 1 || w.sites > 1024)
    return bad("world.sites", fmt::format("must be in [1, 1024], got {}", w.sites));
  if (w.ranks_per_site < 1 || w.ranks_per_site > 65536)
    return bad("world.ranks_per_site",
               fmt::format("must be in [1, 65536], got {}", w.ranks_per_site));
  if (w.strategy != "sync" && w.strategy != "diloco" && w.strategy != "streaming" &&
      w.strategy != "async")
    return bad("world.strategy", fmt::format("must be one of sync, diloco, streaming, async; got "
                                             "\"{}\"",
                                             w.strategy));
  if (w.balance && w.sites > 1 && w.strategy == "async")
    return bad("world.balance",
               "shares by speed are for world.strategy = sync, diloco and streaming (async sites "
               "push at their own pace and wait for nobody)");
  if (w.balance && p.pp > 1)
    return bad("world.balance",
               fmt::format("needs parallel.pp = 1 (got {}): a share of any size breaks the "
                           "pipeline schedule",
                           p.pp));
  if (auto codec = ParseCodec(w.codec); !codec.ok())
    return bad("world.codec",
               fmt::format("must be one of none, bf16, int8, int4; got \"{}\"", w.codec));
  if (w.quorum < 0 || w.quorum > w.sites)
    return bad(
        "world.quorum",
        fmt::format("must be in [0, world.sites = {}] (0: a majority), got {}", w.sites, w.quorum));
  if (w.diloco.inner_steps < 1 || w.diloco.inner_steps > 1000000)
    return bad("world.diloco.inner_steps",
               fmt::format("must be in [1, 1000000], got {}", w.diloco.inner_steps));
  if (!finite(w.diloco.outer_lr) || w.diloco.outer_lr <= 0 || w.diloco.outer_lr > 10)
    return bad("world.diloco.outer_lr",
               fmt::format("must be in (0, 10], got {}", w.diloco.outer_lr));
  if (!finite(w.diloco.outer_momentum) || w.diloco.outer_momentum < 0 ||
      w.diloco.outer_momentum >= 1)
    return bad("world.diloco.outer_momentum",
               fmt::format("must be in [0, 1), got {}", w.diloco.outer_momentum));
  if (w.strategy == "streaming" &&
      (w.streaming.fragments < 1 || w.streaming.fragments > w.diloco.inner_steps))
    return bad("world.streaming.fragments",
               fmt::format("must be in [1, world.diloco.inner_steps = {}], got {}",
                           w.diloco.inner_steps, w.streaming.fragments));
  if (w.strategy == "streaming" &&
      (w.streaming.overlap_steps < 0 ||
       w.streaming.overlap_steps >= w.diloco.inner_steps / w.streaming.fragments))
    return bad(
        "world.streaming.overlap_steps",
        fmt::format("must be in [0, world.diloco.inner_steps / world.streaming.fragments "
                    "= {}) so a fragment's exchange ends before the next begins, got {}",
                    w.diloco.inner_steps / w.streaming.fragments, w.streaming.overlap_steps));
  if (!finite(w.streaming.alpha) || w.streaming.alpha < 0 || w.streaming.alpha > 1)
    return bad("world.streaming.alpha",
               fmt::format("must be in [0, 1], got {}", w.streaming.alpha));
  if (w.async.max_staleness < 0 || w.async.max_staleness > 1000000)
    return bad("world.async.max_staleness",
               fmt::format("must be in [0, 1000000], got {}", w.async.max_staleness));
  if (!finite(w.heartbeat_s) || w.heartbeat_s < 0.01 || w.heartbeat_s > 3600)
    return bad("world.heartbeat_s", fmt::format("must be in [0.01, 3600], got {}", w.heartbeat_s));
  if (w.dead_after_beats < 2 || w.dead_after_beats > 1000)
    return bad("world.dead_after_beats",
               fmt::format("must be in [2, 1000] (sites beat twice per interval), got {}",
                           w.dead_after_beats));
  if (std::string why = ValidateLink(w.link); !why.empty()) return bad("world.link", why);
  for (const auto& [pair, profile] : w.pairs) {
    int a = 0, b = 0;
    if (!ParseSitePair(pair, &a, &b) || b >= w.sites)
      return bad(fmt::format("world.link.{}", pair),
                 fmt::format("names a site outside world.sites = {}", w.sites));
    if (std::string why = ValidateLink(profile); !why.empty())
      return bad(fmt::format("world.link.{}", pair), why);
  }
  const SdcConfig& d = c.sdc;
  if (d.moments_every < 0)
    return bad("sdc.moments_every", fmt::format("must be >= 0, got {}", d.moments_every));
  if (!finite(d.guard_threshold) || d.guard_threshold < 1 || d.guard_threshold > 1e6)
    return bad("sdc.guard_threshold",
               fmt::format("must be in [1, 1e6], got {}", d.guard_threshold));
  if (d.guard_window < 4 || d.guard_window > 100000)
    return bad("sdc.guard_window", fmt::format("must be in [4, 100000], got {}", d.guard_window));
  if (d.on_alarm != "warn" && d.on_alarm != "stop" && d.on_alarm != "redo")
    return bad("sdc.on_alarm", fmt::format("must be warn, stop or redo, got \"{}\"", d.on_alarm));
  if (d.audit_every < 0)
    return bad("sdc.audit_every", fmt::format("must be >= 0, got {}", d.audit_every));
  if (d.checksums && c.train.precision == "bf16")
    return bad("sdc.checksums",
               "cannot check bf16 products (train.precision = bf16): the checksums' error bound "
               "is float32's, and bf16 operands are 2^15 times coarser");
  if (d.on_faulty != "stop" && d.on_faulty != "exclude")
    return bad("sdc.on_faulty", fmt::format("must be stop or exclude, got \"{}\"", d.on_faulty));
  if (d.on_faulty == "exclude" && (w.sites < 2 || w.strategy != "sync"))
    return bad("sdc.on_faulty",
               "exclude needs world.strategy = \"sync\" over world.sites > 1 (the other sites "
               "take over the excluded site's micro-batches); a single site cannot leave a rank "
               "out");
  if (c.faults.seed < 0)
    return bad("faults.seed", fmt::format("must be >= 0, got {}", c.faults.seed));
  ATOLL_ASSIGN_OR_RETURN(const std::vector<FaultSpec> faults, ParseFaults(c.faults.inject));
  for (const FaultSpec& f : faults) {
    const char* where = f.site >= w.sites                                   ? "site"
                        : f.rank >= p.dp * p.tp * p.pp                      ? "rank"
                        : f.layer >= m.n_layer                              ? "layer"
                        : f.kind != FaultKind::kBadCore && f.step > t.steps ? "step"
                                                                            : nullptr;
    if (f.kind == FaultKind::kWan && w.sites < 2)
      return bad("faults.inject", "a wan fault needs world.sites > 1 (a payload between sites)");
    if (where != nullptr)
      return bad("faults.inject",
                 fmt::format("a {} fault's {} is outside the run (world.sites {}, {} ranks per "
                             "site, model.n_layer {}, train.steps {})",
                             FaultKindName(f.kind), where, w.sites, p.dp * p.tp * p.pp, m.n_layer,
                             t.steps));
  }
  if (w.sites > 1) {
    if (p.dp * p.tp * p.pp != w.ranks_per_site)
      return bad("world.ranks_per_site",
                 fmt::format("{} must equal parallel.dp * parallel.tp * parallel.pp = {}",
                             w.ranks_per_site, p.dp * p.tp * p.pp));
    if (p.tp > 1 || p.pp > 1)
      return bad("world.sites", "several sites need parallel.tp = parallel.pp = 1 for now");
    if (p.zero) return bad("world.sites", "several sites need parallel.zero = false for now");
    const int64_t replicas = w.sites * p.dp;
    if (t.batch_size % replicas != 0 || (t.batch_size / replicas) % t.micro_batch_size != 0)
      return bad("world.sites",
                 fmt::format("train.batch_size {} must split into world.sites * parallel.dp = {} "
                             "equal shares of whole micro-batches of train.micro_batch_size {}",
                             t.batch_size, replicas, t.micro_batch_size));
  }
  return Status::Ok();
}

Status ValidateParallel(const RunConfig& c, int world_size) {
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(c));
  const ParallelConfig& p = c.parallel;
  if (p.dp * p.tp * p.pp != world_size)
    return Status::InvalidArgument(fmt::format(
        "parallel.dp * parallel.tp * parallel.pp = {} * {} * {} = {}, but {} ranks are running "
        "(mpirun -n {}): they must be equal",
        p.dp, p.tp, p.pp, p.dp * p.tp * p.pp, world_size, world_size));
  return Status::Ok();
}

}  // namespace atl
