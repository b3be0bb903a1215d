#include "train/config.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cmath>
#include <limits>
#include <sstream>

#include "core/file.h"
#include "core/json_int.h"
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

std::string PairName(int a, int b) { return fmt::format("{}-{}", a, b); }

// Sets field `name` of a pair's profile ("world.link.<pair>.<name>" in errors).
Status SetPairField(WorldConfig* w, std::string_view pair, std::string_view name, double v) {
  int a = 0, b = 0;
  if (!ParseSitePair(pair, &a, &b))
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
  return s == "model" || s == "train" || s == "data" || s == "parallel" || s == "world" ||
         s == "faults" || s == "sdc";
}

// A float as TOML: the shortest text that reads back to the same double, always with a '.' or
// an exponent so it stays a float.
std::string TomlFloat(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return s;
}

}  // namespace

bool ParseSitePair(std::string_view text, int* a, int* b) {
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
      {"train", "checkpoint_every", &c.train.checkpoint_every,
       "checkpoint every N steps (0: at the end only; -1: none, not even at the end)"},
      {"train", "threads", &c.train.threads, "OpenMP threads (0: OMP_NUM_THREADS or all cores)"},
      {"train", "device", &c.train.device, "cpu or cuda (a rank's GPU: local rank modulo GPUs)"},
      {"train", "precision", &c.train.precision,
       "fp32, or bf16 on cuda: matrix products on bf16 operands, float sums and state"},
      {"train", "attention_rows", &c.train.attention_rows,
       "cuda, bf16: the tensor-core attention's block rows, auto (the fastest, timed at start) or "
       "Q/K (64 or 128 each); the same bits in every setting"},
      {"train", "attention_backward", &c.train.attention_backward,
       "cuda, bf16: dQ by a kernel of its own (split) or from the dK/dV kernel (fused: other "
       "bits)"},
      {"train", "init_from", &c.train.init_from,
       "start from these weights: an atoll checkpoint or a Hugging Face GPT-2 directory (its "
       "shape must be [model]'s; the optimizer starts afresh)"},
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
      {"parallel", "comm", &c.parallel.comm,
       "mpi, or nccl: GPU ranks all-reduce tensor-parallel activations in GPU memory"},
      {"world", "sites", &c.world.sites, "sites (datacenters) joined by WAN links"},
      {"world", "ranks_per_site", &c.world.ranks_per_site, "MPI ranks per site (dp * tp * pp)"},
      {"world", "strategy", &c.world.strategy, "how sites agree: sync, diloco, streaming or async"},
      {"world", "heartbeat_s", &c.world.heartbeat_s, "coordinator heartbeat interval, s"},
      {"world", "dead_after_beats", &c.world.dead_after_beats,
       "a site silent for this many heartbeat intervals is declared dead"},
      {"world", "quorum", &c.world.quorum, "fewest live sites a round needs (0: a majority)"},
      {"world", "codec", &c.world.codec, "sent across sites: none, bf16, int8 or int4"},
      {"world", "balance", &c.world.balance,
       "shares of each step's micro-batches by the sites' measured speed (sync, diloco, "
       "streaming)"},
      {"world", "diloco.inner_steps", &c.world.diloco.inner_steps,
       "H: inner steps per outer step (diloco, streaming) or per push (async)"},
      {"world", "diloco.outer_lr", &c.world.diloco.outer_lr, "outer Nesterov learning rate"},
      {"world", "diloco.outer_momentum", &c.world.diloco.outer_momentum, "outer Nesterov momentum"},
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
      {"faults", "inject", &c.faults.inject,
       "bit flips to inject, KIND:KEY=VALUE,... joined by ';' (train/sdc/faults.h)"},
      {"faults", "seed", &c.faults.seed, "seed of the faults' unset layers, elements and bits"},
      {"sdc", "guard", &c.sdc.guard, "outlier checks on loss, gradient norm, updates, activations"},
      {"sdc", "fingerprints", &c.sdc.fingerprints,
       "compare data-parallel replicas' parameter hashes every step"},
      {"sdc", "memory", &c.sdc.memory,
       "hash parameters and moments after each update, check them before the next step, repair "
       "from a replica"},
      {"sdc", "checksums", &c.sdc.checksums,
       "check every block GEMM's column sums against (1ᵀA)·W, forward and backward"},
      {"sdc", "moments_every", &c.sdc.moments_every,
       "compare the replicas' AdamW moments every N steps (0: never)"},
      {"sdc", "guard_threshold", &c.sdc.guard_threshold,
       "an outlier is this many robust deviations from the median"},
      {"sdc", "guard_window", &c.sdc.guard_window, "clean steps the guard's medians cover"},
      {"sdc", "on_alarm", &c.sdc.on_alarm,
       "warn (log and report), stop (end the run) or redo (roll back, replay the step, go on)"},
      {"sdc", "audit_every", &c.sdc.audit_every,
       "replay every N-th step and compare it bitwise with the first run (0: only on an alarm)"},
      {"sdc", "on_faulty", &c.sdc.on_faulty,
       "a rank the replays find faulty: stop (end the run) or exclude (sync over sites: its site "
       "leaves, the others take over its micro-batches)"},
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
      return Status::InvalidArgument(fmt::format(
          "{}: unknown section [{}] (known: model, train, data, parallel, world, faults, sdc)",
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
          if (key == nullptr || v.is_table()) return UnknownKey("world", name).WithContext(source);
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

LinkProfile WorldConfig::Link(int a, int b) const {
  if (a > b) std::swap(a, b);
  auto it = pairs.find(PairName(a, b));
  return it != pairs.end() ? it->second : link;
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
  // [world]'s per-pair link tables, written while [world] is the open section.
  auto pairs = [&] {
    for (const auto& [pair, p] : cfg.world.pairs)
      out += fmt::format(
          "link.\"{}\" = {{ latency_ms = {}, bandwidth_mbps = {}, jitter_ms = {} }}\n", pair,
          TomlFloat(p.latency_ms), TomlFloat(p.bandwidth_mbps), TomlFloat(p.jitter_ms));
  };
  for (const auto& k : ConfigKeys(cfg)) {
    if (k.section != section) {
      if (section == "world") pairs();
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
  if (section == "world") pairs();
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
    // Keys added to [parallel], [world], [faults] and [sdc] after manifests were first written take
    // defaults, as do [train]'s added since (a manifest without them was written by a run that
    // trained with their defaults: on the CPU, which has none of the GPU's settings).
    const bool late = s == "parallel" || s == "world" || s == "faults" || s == "sdc" ||
                      (s == "train" && (n == "device" || n == "precision" ||
                                        n == "attention_rows" || n == "attention_backward" ||
                                        n == "init_from"));
    if (late && (!j.contains(s) || !j[s].contains(n))) continue;
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
          if constexpr (std::is_integral_v<V> && !std::is_same_v<V, bool>) {
            try {
              *p = JsonInt<V>(v);  // an int64 that does not fit an int is refused, not wrapped
            } catch (const std::exception&) {
              return Status::InvalidArgument(
                  fmt::format("config: {} = {} is out of range", k.path(), v.dump()));
            }
          } else {
            *p = v.get<V>();
          }
          return Status::Ok();
        },
        k.value);
    ATOLL_RETURN_IF_ERROR(st);
  }
  ATOLL_RETURN_IF_ERROR(ValidateRunConfig(cfg));
  return cfg;
}

}  // namespace atl
