#include "train/checkpoint.h"

#include <fmt/format.h>

#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "core/file.h"
#include "core/hash.h"
#include "core/json_int.h"
#include "model/config.h"
#include "train/safetensors.h"

namespace atl {

namespace {

using Json = nlohmann::ordered_json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kConfigFile = "config.json";
constexpr const char* kManifestFile = "manifest.json";
constexpr const char* kExpAvg = "exp_avg.";
constexpr const char* kExpAvgSq = "exp_avg_sq.";

std::string Join(const std::string& dir, const char* file) { return dir + "/" + file; }

uint64_t TensorHash(const void* data, size_t bytes) { return Hash64(data, bytes); }

// The manifest's own checksum covers its canonical dump without the "checksum" key.
uint64_t ManifestHash(Json j) {
  j.erase("checksum");
  return Hash64(j.dump());
}

// Reads the tensors of `layout` (names prefixed by `prefix`) from a verified safetensors file
// into `out`, checking that nothing is missing, extra, mistyped, misshaped or corrupted.
Status ReadTensors(const std::string& path, const std::vector<ParamTensor>& layout,
                   const std::vector<std::string>& prefixes, const Json& checksums,
                   std::vector<std::vector<float>*> outs) {
  ATOLL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  // The metadata is not covered by tensor checksums; it must be exactly what the writer puts.
  const std::map<std::string, std::string> expected_metadata = {{"format", "pt"}};
  if (file.metadata() != expected_metadata)
    return Status::Corruption(fmt::format("{}: __metadata__ is not {{\"format\": \"pt\"}}", path));
  if (file.tensors().size() != layout.size() * prefixes.size())
    return Status::Corruption(fmt::format("{}: holds {} tensors, the config's layout needs {}",
                                          path, file.tensors().size(),
                                          layout.size() * prefixes.size()));
  if (!checksums.is_object())
    return Status::Corruption(fmt::format("manifest.json: no tensor checksums for {}", path));
  for (size_t p = 0; p < prefixes.size(); ++p) {
    std::vector<float>& out = *outs[p];
    out.assign(layout.empty() ? 0 : layout.back().offset + layout.back().numel, 0.0f);
    for (const ParamTensor& pt : layout) {
      const std::string name = prefixes[p] + pt.name;
      const TensorView* t = file.Find(name);
      if (t == nullptr)
        return Status::Corruption(fmt::format("{}: tensor {} is missing", path, name));
      if (t->dtype != SafetensorsDType::kF32)
        return Status::Corruption(fmt::format("{}: tensor {}: dtype {}, expected F32", path, name,
                                              SafetensorsDTypeName(t->dtype)));
      if (t->shape != pt.shape)
        return Status::Corruption(fmt::format("{}: tensor {}: shape [{}], expected [{}]", path,
                                              name, fmt::join(t->shape, ", "),
                                              fmt::join(pt.shape, ", ")));
      const uint64_t got = TensorHash(t->data, t->size);
      uint64_t want = 0;
      if (!checksums.contains(name) || !checksums[name].is_string() ||
          !HexToHash(checksums[name].get<std::string>(), &want))
        return Status::Corruption(
            fmt::format("{}: tensor {}: no valid checksum in manifest.json", path, name));
      if (got != want)
        return Status::Corruption(fmt::format(
            "{}: tensor {}: checksum mismatch (xxh3 {} in the file, {} in manifest.json): the "
            "file is corrupted",
            path, name, HashToHex(got), HashToHex(want)));
      std::memcpy(out.data() + pt.offset, t->data, t->size);
    }
  }
  return Status::Ok();
}

template <class T>
StatusOr<T> Field(const Json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key))
    return Status::Corruption(fmt::format("{}: missing field {}", where, key));
  try {
    if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
      return JsonInt<T>(j[key]);  // never a float cast past T's range
    else
      return j[key].get<T>();
  } catch (const std::exception&) {
    return Status::Corruption(
        fmt::format("{}: field {} has the wrong type or is out of range", where, key));
  }
}

StatusOr<uint64_t> HexField(const Json& j, const char* key, const std::string& where) {
  ATOLL_ASSIGN_OR_RETURN(std::string hex, Field<std::string>(j, key, where));
  uint64_t h = 0;
  if (!HexToHash(hex, &h))
    return Status::Corruption(
        fmt::format("{}: field {} is not a 16-digit hex checksum", where, key));
  return h;
}

}  // namespace

std::string HuggingFaceConfigJson(const GPTConfig& m) {
  Json j;
  j["architectures"] = {"GPT2LMHeadModel"};
  j["model_type"] = "gpt2";
  j["activation_function"] = "gelu_new";
  j["vocab_size"] = m.vocab_size;
  j["n_positions"] = m.seq_len;
  j["n_ctx"] = m.seq_len;
  j["n_embd"] = m.n_embd;
  j["n_layer"] = m.n_layer;
  j["n_head"] = m.n_head;
  j["n_inner"] = nullptr;  // 4 * n_embd
  j["layer_norm_epsilon"] = 1e-5;
  j["initializer_range"] = 0.02;
  // atoll trains without dropout.
  j["attn_pdrop"] = 0.0;
  j["embd_pdrop"] = 0.0;
  j["resid_pdrop"] = 0.0;
  j["scale_attn_weights"] = true;
  j["scale_attn_by_inverse_layer_idx"] = false;
  j["reorder_and_upcast_attn"] = false;
  j["tie_word_embeddings"] = true;
  j["bos_token_id"] = 50256;
  j["eos_token_id"] = 50256;
  j["torch_dtype"] = "float32";
  j["use_cache"] = true;
  return j.dump(2) + "\n";
}

Status WriteCheckpoint(const std::string& dir, const CheckpointSource& src) {
  namespace fs = std::filesystem;
  const RunConfig& cfg = *src.config;
  const auto layout = ParameterLayout(cfg.model);
  const std::string tmp = dir + ".tmp";
  std::error_code ec;
  fs::remove_all(tmp, ec);
  ATOLL_RETURN_IF_ERROR(MakeDirs(tmp));

  Json model_sums = Json::object(), opt_sums = Json::object();
  SafetensorsWriter model, opt;
  model.SetMetadata("format", "pt");  // transformers refuses safetensors without it
  opt.SetMetadata("format", "pt");
  for (const ParamTensor& t : layout) {
    const float* p = src.params + t.offset;
    model.AddFloats(t.name, t.shape, p);
    model_sums[t.name] = HashToHex(TensorHash(p, t.numel * sizeof(float)));
  }
  for (const auto& [prefix, buffer] :
       {std::pair{kExpAvg, src.exp_avg}, std::pair{kExpAvgSq, src.exp_avg_sq}}) {
    for (const ParamTensor& t : layout) {
      const float* p = buffer + t.offset;
      opt.AddFloats(prefix + t.name, t.shape, p);
      opt_sums[prefix + t.name] = HashToHex(TensorHash(p, t.numel * sizeof(float)));
    }
  }
  ATOLL_RETURN_IF_ERROR(model.Write(Join(tmp, kModelFile)));
  ATOLL_RETURN_IF_ERROR(opt.Write(Join(tmp, kOptimizerFile)));
  const std::string hf_config = HuggingFaceConfigJson(cfg.model);
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(Join(tmp, kConfigFile), hf_config));

  Json m;
  m["format"] = "atoll-checkpoint";
  m["format_version"] = kCheckpointFormatVersion;
  m["step"] = src.cursor.next_step;
  m["seed"] = cfg.train.seed;
  m["data"] = {
      {"next_step", src.cursor.next_step},
      {"tokens_seen", src.cursor.tokens_seen},
      {"dir", cfg.data.dir},
      {"train",
       {{"file", "train.bin"},
        {"tokens", src.cursor.train_tokens},
        {"xxh3", HashToHex(src.cursor.train_checksum)}}},
      {"val",
       {{"file", "val.bin"},
        {"tokens", src.cursor.val_tokens},
        {"xxh3", HashToHex(src.cursor.val_checksum)}}},
  };
  m["rng"] = {
      {"algorithm", "philox4x32-10"},
      {"kind", "counter-based"},
      {"seed", cfg.train.seed},
      {"state",
       "none: every draw is a pure function of (seed, step, purpose, index); the seed "
       "and data.next_step suffice to resume"},
  };
  m["mesh"] = {{"dp", cfg.parallel.dp}, {"tp", cfg.parallel.tp}, {"pp", cfg.parallel.pp}};
  m["optimizer"] = {{"name", "adamw"}, {"steps", src.optimizer_steps}};
  m["files"] = {
      {kModelFile, {{"tensors", model_sums}}},
      {kOptimizerFile, {{"tensors", opt_sums}}},
      {kConfigFile, {{"xxh3", HashToHex(Hash64(hf_config))}}},
  };
  m["config"] = Json::parse(RunConfigToJson(cfg).dump());
  m["checksum"] = HashToHex(ManifestHash(m));
  ATOLL_RETURN_IF_ERROR(WriteFileAtomic(Join(tmp, kManifestFile), m.dump(2) + "\n"));
  ATOLL_RETURN_IF_ERROR(SyncDir(tmp));
  const auto parent = fs::path(dir).parent_path();
  if (!parent.empty()) ATOLL_RETURN_IF_ERROR(MakeDirs(parent.string()));
  return ReplaceDir(tmp, dir);
}

StatusOr<Checkpoint> ParseManifest(std::string_view text, const std::string& manifest_path,
                                   Json* files) {
  Json m;
  try {
    m = Json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    return Status::Corruption(fmt::format("{}: not valid JSON: {}", manifest_path, e.what()));
  }
  ATOLL_ASSIGN_OR_RETURN(uint64_t self, HexField(m, "checksum", manifest_path));
  if (ManifestHash(m) != self)
    return Status::Corruption(
        fmt::format("{}: checksum mismatch: the manifest is corrupted", manifest_path));
  ATOLL_ASSIGN_OR_RETURN(int version, Field<int>(m, "format_version", manifest_path));
  if (version != kCheckpointFormatVersion)
    return Status::InvalidArgument(fmt::format("{}: format_version {}, this atoll reads {}",
                                               manifest_path, version, kCheckpointFormatVersion));
  Checkpoint ck;
  if (!m.contains("config"))
    return Status::Corruption(fmt::format("{}: missing field config", manifest_path));
  {
    auto cfg = RunConfigFromJson(nlohmann::json::parse(m["config"].dump()));
    if (!cfg.ok()) return Status::Corruption(cfg.status().message()).WithContext(manifest_path);
    ck.config = *cfg;
  }
  const std::string data_where = manifest_path + ": data";
  const Json& data = m.contains("data") ? m["data"] : Json();
  ATOLL_ASSIGN_OR_RETURN(ck.cursor.next_step, Field<int64_t>(data, "next_step", data_where));
  ATOLL_ASSIGN_OR_RETURN(ck.cursor.tokens_seen, Field<uint64_t>(data, "tokens_seen", data_where));
  for (auto [key, sum, count] :
       {std::tuple{"train", &ck.cursor.train_checksum, &ck.cursor.train_tokens},
        std::tuple{"val", &ck.cursor.val_checksum, &ck.cursor.val_tokens}}) {
    const Json& f = data.contains(key) ? data[key] : Json();
    ATOLL_ASSIGN_OR_RETURN(*sum, HexField(f, "xxh3", data_where + "." + key));
    ATOLL_ASSIGN_OR_RETURN(*count, Field<uint64_t>(f, "tokens", data_where + "." + key));
  }
  if (ck.cursor.next_step < 0 || ck.cursor.next_step > ck.config.train.steps)
    return Status::Corruption(fmt::format("{}: data.next_step {} outside [0, train.steps = {}]",
                                          manifest_path, ck.cursor.next_step,
                                          ck.config.train.steps));
  const Json& opt = m.contains("optimizer") ? m["optimizer"] : Json();
  ATOLL_ASSIGN_OR_RETURN(ck.optimizer_steps,
                         Field<int64_t>(opt, "steps", manifest_path + ": optimizer"));
  *files = m.contains("files") ? m["files"] : Json();
  return ck;
}

StatusOr<Checkpoint> LoadCheckpoint(const std::string& dir, bool with_optimizer) {
  const std::string manifest_path = Join(dir, kManifestFile);
  if (!FileExists(dir))
    return Status::NotFound(fmt::format("checkpoint {}: no such directory", dir));
  auto text = ReadFile(manifest_path);
  if (!text.ok())
    return text.status().WithContext(
        fmt::format("checkpoint {} (not a checkpoint directory?)", dir));
  Json files;
  ATOLL_ASSIGN_OR_RETURN(Checkpoint ck, ParseManifest(*text, manifest_path, &files));
  auto tensor_sums = [&](const char* file) -> Json {
    if (!files.is_object() || !files.contains(file) || !files[file].contains("tensors"))
      return Json();
    return files[file]["tensors"];
  };
  // config.json is derived from the model shape; still, a reader (transformers) trusts it.
  {
    ATOLL_ASSIGN_OR_RETURN(std::string hf, ReadFile(Join(dir, kConfigFile)));
    const Json& c = files.contains(kConfigFile) ? files[kConfigFile] : Json();
    ATOLL_ASSIGN_OR_RETURN(uint64_t want,
                           HexField(c, "xxh3", manifest_path + ": files.config.json"));
    if (Hash64(hf) != want)
      return Status::Corruption(
          fmt::format("{}: checksum mismatch: the file is corrupted", Join(dir, kConfigFile)));
  }
  const auto layout = ParameterLayout(ck.config.model);
  ATOLL_RETURN_IF_ERROR(
      ReadTensors(Join(dir, kModelFile), layout, {""}, tensor_sums(kModelFile), {&ck.params}));
  if (with_optimizer) {
    ATOLL_RETURN_IF_ERROR(ReadTensors(Join(dir, kOptimizerFile), layout, {kExpAvg, kExpAvgSq},
                                      tensor_sums(kOptimizerFile), {&ck.exp_avg, &ck.exp_avg_sq}));
  }
  return ck;
}

}  // namespace atl
