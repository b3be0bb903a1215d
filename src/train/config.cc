#include "train/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "core/file.h"
#include "world/codec.h"

namespace atl {

namespace {

// The fields of a link profile, as keys of [world.link] and of its per-pair tables.
struct LinkField {
  const char* name;
  double LinkProfile::*field;
};
constexpr LinkField kLinkFields[] = {{"latency_ms", &LinkProfile::latency_ms},
                                     {"bandwidth_mbps", &LinkProfile::bandwidth_mbps},
                                     {"jitter_ms", &LinkProfile::jitter_ms}};

// Parses a site pair "A-B" (A < B); false if it is not one.
bool ParsePair(std::string_view text, int* a, int* b) {
  const size_t dash = text.find('-');
  if (dash == std::string_view::npos || dash == 0 || dash + 1 == text.size()) return false;
  auto num = [](std::string_view t, int* out) {
    if (t.empty() || t.size() > 6) return false;
    int v = 0;
    for (char c : t) {
      if (c < '0' || c > '9') return false;
      v = v * 10 + (c - '0');
    }
    *out = v;
    return true;
  };
  return num(text.substr(0, dash), a) && num(text.substr(dash + 1), b) && *a < *b;
}

std::string PairName(int a, int b) { return fmt::format("{}-{}", a, b); }

// Sets field `name` of a pair's profile ("world.link.<pair>.<name>" in errors).
Status SetPairField(WorldConfig* w, std::string_view pair, std::string_view name, double v) {
  int a = 0, b = 0;
  if (!ParsePair(pair, &a, &b))
    return Status::InvalidArgument(fmt::format(
        "world.link.{}: a per-pair link table must be named \"A-B\" with site indices A < B",
        pair));
  for (const LinkField& f : kLinkFields) {
    if (name == f.name) {
      LinkProfile& p = w->pairs.try_emplace(PairName(a, b), w->link).first->second;
      p.*f.field = v;
      return Status::Ok();
    }
  }
  return Status::InvalidArgument(fmt::format(
      "world.link.{}.{}: unknown key (known: latency_ms, bandwidth_mbps, jitter_ms)", pair, name));
}

std::string TypeName(toml::node_type t) {
  std::ostringstream os;
  os << t;
  return os.str();
}

// "string \"abc\"", "integer 3", "table {...}": what a value is, for error messages.
std::string Describe(const toml::node& n) {
  std::ostringstream os;
  n.visit([&](const auto& x) { os << x; });
  std::string s = os.str();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return fmt::format("{} {}", TypeName(n.type()), s);
}

// Assigns a TOML value to a key, checking its type. `where` names the key in errors.
Status AssignFromToml(const ConfigKey& key, const toml::node& n) {
  const std::string where = key.path();
  return std::visit(
      [&](auto* p) -> Status {
        using V = std::remove_pointer_t<decltype(p)>;
        if constexpr (std::is_same_v<V, bool>) {
          if (!n.is_boolean())
            return Status::InvalidArgument(
                fmt::format("{}: expected true or false, got {}", where, Describe(n)));
          *p = n.as_boolean()->get();
        } else if constexpr (std::is_same_v<V, std::string>) {
          if (!n.is_string())
            return Status::InvalidArgument(
                fmt::format("{}: expected a string, got {}", where, Describe(n)));
          *p = n.as_string()->get();
        } else if constexpr (std::is_same_v<V, double>) {
          if (n.is_floating_point()) {
            *p = n.as_floating_point()->get();
          } else if (n.is_integer()) {
            *p = double(n.as_integer()->get());
          } else {
            return Status::InvalidArgument(
                fmt::format("{}: expected a number, got {}", where, Describe(n)));
          }
        } else {
          if (!n.is_integer())
            return Status::InvalidArgument(
                fmt::format("{}: expected an integer, got {}", where, Describe(n)));
          const int64_t v = n.as_integer()->get();
          if (v < int64_t(std::numeric_limits<V>::min()) ||
              v > int64_t(std::numeric_limits<V>::max()))
            return Status::InvalidArgument(fmt::format("{}: {} is out of range", where, v));
          *p = V(v);
        }
        return Status::Ok();
      },
      key.value);
}

const ConfigKey* FindKey(const std::vector<ConfigKey>& keys, std::string_view section,
                         std::string_view name) {
  for (const auto& k : keys)
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

Status UnknownKey(std::string_view section, std::string_view name) {
  return Status::InvalidArgument(fmt::format("{}.{}: unknown key", section, name));
}

bool IsKnownSection(std::string_view s) {
  return s == "model" || s == "train" || s == "data" || s == "parallel" || s == "world";
}

// A float as TOML: the shortest text that reads back to the same double, always with a '.' or
// an exponent so it stays a float.
std::string TomlFloat(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

std::vector<ConfigKey> ConfigKeys(RunConfig& c) {
  return {
      {"model", "n_layer", &c.model.n_layer, "transformer blocks"},
      {"model", "n_head", &c.model.n_head, "attention heads per block"},
      {"model", "n_embd", &c.model.n_embd, "embedding width (divisible by n_head)"},
      {"model", "seq_len", &c.model.seq_len, "context length (rows of wpe)"},
      {"model", "vocab_size", &c.model.vocab_size, "token vocabulary (GPT-2: 50257)"},
      {"train", "steps", &c.train.steps, "optimizer steps"},
      {"train", "seed", &c.train.seed, "seed of every random draw"},
      {"train", "batch_size", &c.train.batch_size, "sequences per optimizer step"},
      {"train", "micro_batch_size", &c.train.micro_batch_size, "sequences per forward/backward"},
      {"train", "lr", &c.train.lr, "peak learning rate"},
      {"train", "min_lr", &c.train.min_lr, "learning rate at the last step (cosine)"},
      {"train", "warmup_steps", &c.train.warmup_steps, "linear warmup steps"},
      {"train", "weight_decay", &c.train.weight_decay, "decoupled weight decay (2-D weights)"},
      {"train", "beta1", &c.train.beta1, "Adam first-moment decay"},
      {"train", "beta2", &c.train.beta2, "Adam second-moment decay"},
      {"train", "eps", &c.train.eps, "Adam epsilon"},
      {"train", "grad_clip", &c.train.grad_clip, "global gradient-norm clip (0: off)"},
      {"train", "eval_every", &c.train.eval_every, "validation every N steps (0: at end only)"},
      {"train", "eval_batches", &c.train.eval_batches, "validation batches (0: none)"},
      {"train", "checkpoint_every", &c.train.checkpoint_every, "checkpoint every N steps (0: end)"},
      {"train", "threads", &c.train.threads, "OpenMP threads (0: OMP_NUM_THREADS or all cores)"},
      {"data", "dir", &c.data.dir, "directory with train.bin and val.bin"},
      {"parallel", "dp", &c.parallel.dp, "data-parallel replicas (dp * tp * pp = MPI ranks)"},
      {"parallel", "tp", &c.parallel.tp, "tensor-parallel ranks (divides model.n_head)"},
      {"parallel", "pp", &c.parallel.pp, "pipeline stages (at most model.n_layer)"},
      {"parallel", "schedule", &c.parallel.schedule, "pipeline schedule: 1f1b or gpipe"},
      {"parallel", "zero", &c.parallel.zero,
       "ZeRO-1: shard the optimizer state over the dp replicas"},
      {"parallel", "reproducible", &c.parallel.reproducible,
       "bitwise-identical parameters for any dp (fixed-point gradient sums)"},
      {"parallel", "bucket_mb", &c.parallel.bucket_mb, "gradient all-reduce bucket size, MiB"},
      {"parallel", "overlap", &c.parallel.overlap,
       "start bucket reductions during backward (false: all after it)"},
      {"world", "sites", &c.world.sites, "sites (datacenters) joined by WAN links"},
      {"world", "ranks_per_site", &c.world.ranks_per_site, "MPI ranks per site (dp * tp * pp)"},
      {"world", "strategy", &c.world.strategy,
       "how sites agree: sync, diloco, streaming or async"},
      {"world", "heartbeat_s", &c.world.heartbeat_s, "coordinator heartbeat interval, s"},
      {"world", "quorum", &c.world.quorum, "fewest live sites a round needs (0: a majority)"},
      {"world", "codec", &c.world.codec, "sent across sites: none, bf16, int8 or int4"},
      {"world", "diloco.inner_steps", &c.world.diloco.inner_steps,
       "H: inner steps per outer step (diloco, streaming) or per push (async)"},
      {"world", "diloco.outer_lr", &c.world.diloco.outer_lr, "outer Nesterov learning rate"},
      {"world", "diloco.outer_momentum", &c.world.diloco.outer_momentum,
       "outer Nesterov momentum"},
      {"world", "streaming.fragments", &c.world.streaming.fragments,
       "P: parameter fragments synced in turn"},
      {"world", "streaming.overlap_steps", &c.world.streaming.overlap_steps,
       "tau: inner steps a fragment's exchange overlaps"},
      {"world", "streaming.alpha", &c.world.streaming.alpha,
       "merge factor: local = alpha * local + (1 - alpha) * global"},
      {"world", "async.max_staleness", &c.world.async.max_staleness,
       "S: updates more than S versions behind are refused"},
      {"world", "link.latency_ms", &c.world.link.latency_ms, "one-way WAN latency, ms"},
      {"world", "link.bandwidth_mbps", &c.world.link.bandwidth_mbps,
       "WAN bandwidth, Mbit/s (0: unlimited)"},
      {"world", "link.jitter_ms", &c.world.link.jitter_ms, "WAN latency jitter, +- ms"},
  };
}

StatusOr<RunConfig> ParseRunConfig(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return Status::InvalidArgument(
        fmt::format("{}:{}:{}: {}", source, b.line, b.column, e.description()));
  }
  RunConfig cfg;
  auto keys = ConfigKeys(cfg);
  for (const auto& [section_key, section_node] : root) {
    const std::string_view section = section_key.str();
    const toml::table* table = section_node.as_table();
    if (table == nullptr && !IsKnownSection(section))
      return Status::InvalidArgument(
          fmt::format("{}: {}: a key outside any section; keys belong in [model], [train], "
                      "[data] or [parallel]",
                      source, section));
    if (!IsKnownSection(section))
      return Status::InvalidArgument(
          fmt::format("{}: unknown section [{}] (known: model, train, data, parallel, world)",
                      source, section));
    if (table == nullptr)
      return Status::InvalidArgument(fmt::format("{}: {} must be a table [{}], got {}", source,
                                                 section, section, TypeName(section_node.type())));
    for (const auto& [name_key, value] : *table) {
      if (section == "world" && name_key.str() == "link" && value.is_table()) {
        // [world.link]: the default profile, and per-pair tables [world.link."A-B"] (applied
        // after the defaults, which they start from).
        std::vector<std::pair<std::string, const toml::table*>> pairs;
        for (const auto& [k, v] : *value.as_table()) {
          if (v.is_table()) {
            pairs.emplace_back(std::string(k.str()), v.as_table());
            continue;
          }
          const ConfigKey* key = FindKey(keys, "world", fmt::format("link.{}", k.str()));
          if (key == nullptr) return UnknownKey("world.link", k.str()).WithContext(source);
          ATOLL_RETURN_IF_ERROR(AssignFromToml(*key, v).WithContext(source));
        }
        for (const auto& [pair, t] : pairs) {
          for (const auto& [k, v] : *t) {
            if (!v.is_number())
              return Status::InvalidArgument(
                  fmt::format("{}: world.link.{}.{}: expected a number, got {}", source, pair,
                              k.str(), Describe(v)));
            ATOLL_RETURN_IF_ERROR(
                SetPairField(&cfg.world, pair, k.str(), v.value_or(0.0)).WithContext(source));
          }
        }
        continue;
      }
      if (section == "world" && value.is_table()) {
        // [world.diloco], [world.streaming], [world.async]: keys "diloco.inner_steps", ...
        for (const auto& [k, v] : *value.as_table()) {
          const std::string name = fmt::format("{}.{}", name_key.str(), k.str());
          const ConfigKey* key = FindKey(keys, "world", name);
          if (key == nullptr || v.is_table())
            return UnknownKey("world", name).WithContext(source);
          ATOLL_RETURN_IF_ERROR(AssignFromToml(*key, v).WithContext(source));
        }
        continue;
      }
      const ConfigKey* key = FindKey(keys, section, name_key.str());
      if (key == nullptr) return UnknownKey(section, name_key.str()).WithContext(source);
      ATOLL_RETURN_IF_ERROR(AssignFromToml(*key, value).WithContext(source));
    }
  }
  return cfg;
}

Status ApplyConfigOverride(RunConfig* cfg, std::string_view assignment) {
  const size_t eq = assignment.find('=');
  const std::string_view path = assignment.substr(0, eq);
  const size_t dot = path.find('.');
  if (eq == std::string_view::npos || dot == std::string_view::npos || dot == 0 ||
      dot + 1 == path.size())
    return Status::InvalidArgument(
        fmt::format("--set {}: expected section.key=value, e.g. train.steps=100", assignment));
  const std::string_view section = path.substr(0, dot), name = path.substr(dot + 1);
  std::string_view text = assignment.substr(eq + 1);
  auto keys = ConfigKeys(*cfg);
  if (!IsKnownSection(section))
    return Status::InvalidArgument(fmt::format("--set {}: unknown section {}", path, section));
  if (section == "world" && name.starts_with("link.") &&
      name.find('.', 5) != std::string_view::npos) {  // world.link.A-B.field=value
    const std::string_view rest = name.substr(5);
    const size_t dot = rest.find('.');
    double v = 0;
    try {
      const std::string doc = fmt::format("v = {}", text);
      const toml::table t = toml::parse(std::string_view(doc), std::string_view("--set"));
      if (!t.get("v")->is_number()) throw std::invalid_argument("not a number");
      v = t.get("v")->value_or(0.0);
    } catch (const std::exception&) {
      return Status::InvalidArgument(fmt::format("{}: cannot read '{}' as a number", path, text));
    }
    return SetPairField(&cfg->world, rest.substr(0, dot), rest.substr(dot + 1), v)
        .WithContext("--set");
  }
  const ConfigKey* key = FindKey(keys, section, name);
  if (key == nullptr) return UnknownKey(section, name).WithContext("--set");
  if (std::holds_alternative<std::string*>(key->value)) {
    // Any text; surrounding quotes, if given, are not part of the value.
    if (text.size() >= 2 && (text.front() == '"' || text.front() == '\'') &&
        text.back() == text.front())
      text = text.substr(1, text.size() - 2);
    *std::get<std::string*>(key->value) = std::string(text);
    return Status::Ok();
  }
  // Numbers are read as TOML, so `1_000`, `3e-4` and `0x10` mean what they mean in a file.
  toml::table t;
  try {
    const std::string doc = fmt::format("v = {}", text);
    t = toml::parse(std::string_view(doc), std::string_view("--set"));
  } catch (const toml::parse_error&) {
    return Status::InvalidArgument(
        fmt::format("{}: cannot read '{}' as a {}", key->path(), text,
                    std::holds_alternative<double*>(key->value) ? "number"
                    : std::holds_alternative<bool*>(key->value) ? "boolean (true or false)"
                                                                : "integer"));
  }
  return AssignFromToml(*key, *t.get("v")).WithContext("--set");
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
  if (t.checkpoint_every < 0)
    return bad("train.checkpoint_every", fmt::format("must be >= 0, got {}", t.checkpoint_every));
  if (t.threads < 0 || t.threads > 4096)
    return bad("train.threads", fmt::format("must be in [0, 4096], got {}", t.threads));
  if (c.data.dir.empty()) return bad("data.dir", "must not be empty");

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
  if (auto codec = ParseCodec(w.codec); !codec.ok())
    return bad("world.codec", fmt::format("must be one of none, bf16, int8, int4; got \"{}\"",
                                          w.codec));
  if (w.quorum < 0 || w.quorum > w.sites)
    return bad("world.quorum",
               fmt::format("must be in [0, world.sites = {}] (0: a majority), got {}", w.sites,
                           w.quorum));
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
    return bad("world.streaming.overlap_steps",
               fmt::format("must be in [0, world.diloco.inner_steps / world.streaming.fragments "
                           "= {}) so a fragment's exchange ends before the next begins, got {}",
                           w.diloco.inner_steps / w.streaming.fragments,
                           w.streaming.overlap_steps));
  if (!finite(w.streaming.alpha) || w.streaming.alpha < 0 || w.streaming.alpha > 1)
    return bad("world.streaming.alpha",
               fmt::format("must be in [0, 1], got {}", w.streaming.alpha));
  if (w.async.max_staleness < 0 || w.async.max_staleness > 1000000)
    return bad("world.async.max_staleness",
               fmt::format("must be in [0, 1000000], got {}", w.async.max_staleness));
  if (!finite(w.heartbeat_s) || w.heartbeat_s < 0.01 || w.heartbeat_s > 3600)
    return bad("world.heartbeat_s", fmt::format("must be in [0.01, 3600], got {}", w.heartbeat_s));
  if (std::string why = ValidateLink(w.link); !why.empty()) return bad("world.link", why);
  for (const auto& [pair, profile] : w.pairs) {
    int a = 0, b = 0;
    if (!ParsePair(pair, &a, &b) || b >= w.sites)
      return bad(fmt::format("world.link.{}", pair),
                 fmt::format("names a site outside world.sites = {}", w.sites));
    if (std::string why = ValidateLink(profile); !why.empty())
      return bad(fmt::format("world.link.{}", pair), why);
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

LinkProfile WorldConfig::Link(int a, int b) const {
  if (a > b) std::swap(a, b);
  auto it = pairs.find(PairName(a, b));
  return it != pairs.end() ? it->second : link;
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

StatusOr<RunConfig> LoadRunConfig(const std::string& path,
                                  const std::vector<std::string>& overrides) {
  RunConfig cfg;
  if (!path.empty()) {
    auto text = ReadFile(path);
    if (!text.ok()) return text.status().WithContext("reading config");
    ATOLL_ASSIGN_OR_RETURN(cfg, ParseRunConfig(*text, path));
  }
  for (const auto& o : overrides) ATOLL_RETURN_IF_ERROR(ApplyConfigOverride(&cfg, o));
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  return cfg;
}

std::string RunConfigToToml(const RunConfig& in) {
  RunConfig cfg = in;
  std::string out = "# atoll effective config (file + --set overrides)\n";
  std::string_view section;
  for (const auto& k : ConfigKeys(cfg)) {
    if (k.section != section) {
      section = k.section;
      out += fmt::format("{}[{}]\n", out.size() > 60 ? "\n" : "", section);
    }
    std::string v = std::visit(
        [](auto* p) -> std::string {
          using V = std::remove_pointer_t<decltype(p)>;
          if constexpr (std::is_same_v<V, std::string>) {
            std::ostringstream os;
            os << toml::value<std::string>(*p);
            return os.str();
          } else if constexpr (std::is_same_v<V, double>) {
            return TomlFloat(*p);
          } else {
            return fmt::format("{}", *p);
          }
        },
        k.value);
    out += fmt::format("{} = {}\n", k.name, v);
  }
  for (const auto& [pair, p] : cfg.world.pairs)  // still inside [world]
    out += fmt::format("link.\"{}\" = {{ latency_ms = {}, bandwidth_mbps = {}, jitter_ms = {} }}\n",
                       pair, TomlFloat(p.latency_ms), TomlFloat(p.bandwidth_mbps),
                       TomlFloat(p.jitter_ms));
  return out;
}

nlohmann::json RunConfigToJson(const RunConfig& in) {
  RunConfig cfg = in;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& k : ConfigKeys(cfg)) {
    std::visit([&](auto* p) { j[std::string(k.section)][std::string(k.name)] = *p; }, k.value);
  }
  nlohmann::json pairs = nlohmann::json::object();
  for (const auto& [pair, p] : cfg.world.pairs)
    pairs[pair] = {{"latency_ms", p.latency_ms},
                   {"bandwidth_mbps", p.bandwidth_mbps},
                   {"jitter_ms", p.jitter_ms}};
  j["world"]["link.pairs"] = pairs;
  return j;
}

StatusOr<RunConfig> RunConfigFromJson(const nlohmann::json& j) {
  RunConfig cfg;
  auto keys = ConfigKeys(cfg);
  if (!j.is_object()) return Status::InvalidArgument("config: expected a JSON object");
  for (const auto& [section, table] : j.items()) {
    if (!table.is_object())
      return Status::InvalidArgument(fmt::format("config.{}: expected an object", section));
    for (const auto& [name, v] : table.items()) {
      if (section == "world" && name == "link.pairs") {
        if (!v.is_object())
          return Status::InvalidArgument("config.world.link.pairs: expected an object");
        for (const auto& [pair, fields] : v.items()) {
          if (!fields.is_object())
            return Status::InvalidArgument(
                fmt::format("config.world.link.pairs.{}: expected an object", pair));
          for (const auto& [field, x] : fields.items()) {
            if (!x.is_number())
              return Status::InvalidArgument(
                  fmt::format("config.world.link.pairs.{}.{}: expected a number", pair, field));
            ATOLL_RETURN_IF_ERROR(
                SetPairField(&cfg.world, pair, field, x.get<double>()).WithContext("config"));
          }
        }
        continue;
      }
      const ConfigKey* key = FindKey(keys, section, name);
      if (key == nullptr) return UnknownKey(section, name).WithContext("config");
    }
  }
  for (const auto& k : keys) {
    const std::string s(k.section), n(k.name);
    // Keys added to [parallel] and [world] after manifests were first written take defaults.
    if ((s == "parallel" || s == "world") && (!j.contains(s) || !j[s].contains(n))) continue;
    if (!j.contains(s) || !j[s].contains(n))
      return Status::InvalidArgument(fmt::format("config: missing key {}", k.path()));
    const nlohmann::json& v = j[s][n];
    Status st = std::visit(
        [&](auto* p) -> Status {
          using V = std::remove_pointer_t<decltype(p)>;
          const bool ok = std::is_same_v<V, std::string> ? v.is_string()
                          : std::is_same_v<V, double>    ? v.is_number()
                          : std::is_same_v<V, bool>      ? v.is_boolean()
                                                         : v.is_number_integer();
          if (!ok)
            return Status::InvalidArgument(fmt::format("config: {} has the wrong type", k.path()));
          *p = v.get<V>();
          return Status::Ok();
        },
        k.value);
    ATOLL_RETURN_IF_ERROR(st);
  }
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  return cfg;
}

}  // namespace atl
