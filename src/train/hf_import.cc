#include "train/hf_import.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <vector>

#include "core/file.h"
#include "model/config.h"
#include "train/safetensors.h"

namespace atl {

namespace {

using Json = nlohmann::json;

constexpr std::string_view kPrefix = "transformer.";

// IEEE binary16 to float, exactly (every half is a float).
float HalfToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: man * 2^-24 (exact), with its sign (-0 too)
    const float f = std::ldexp(float(man), -24);
    return sign != 0 ? -f : f;
  }
  float f;
  const uint32_t bits =
      exp == 31 ? sign | 0x7f800000u | man << 13 : sign | (exp - 15 + 127) << 23 | man << 13;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

// A float tensor's elements as floats (F64 rounded to nearest; the others exactly).
void ToFloats(const TensorView& t, float* out) {
  const size_t n = t.numel();
  for (size_t i = 0; i < n; ++i) {
    const uint8_t* p = t.data + i * SafetensorsDTypeSize(t.dtype);
    switch (t.dtype) {
      case SafetensorsDType::kF32:
        std::memcpy(&out[i], p, 4);
        break;
      case SafetensorsDType::kF64: {
        double d;
        std::memcpy(&d, p, 8);
        out[i] = float(d);
        break;
      }
      case SafetensorsDType::kF16: {
        uint16_t h;
        std::memcpy(&h, p, 2);
        out[i] = HalfToFloat(h);
        break;
      }
      case SafetensorsDType::kBF16: {
        uint16_t b;
        std::memcpy(&b, p, 2);
        const uint32_t bits = uint32_t(b) << 16;
        std::memcpy(&out[i], &bits, 4);
        break;
      }
      case SafetensorsDType::kBool:
      case SafetensorsDType::kU8:
      case SafetensorsDType::kI8:
      case SafetensorsDType::kI16:
      case SafetensorsDType::kU16:
      case SafetensorsDType::kI32:
      case SafetensorsDType::kU32:
      case SafetensorsDType::kI64:
      case SafetensorsDType::kU64:
        std::abort();  // not a float dtype: every caller refuses those first (SafetensorsFloat)
    }
  }
}

// The model shape of a GPT2Config, refusing what atoll's GPT does not compute.
StatusOr<GPTConfig> ReadConfig(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  Json c;
  try {
    c = Json::parse(text);
  } catch (const std::exception& e) {
    return Status::Corruption(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
  if (!c.is_object()) return Status::Corruption(fmt::format("{}: not a JSON object", path));
  const auto refuse = [&](const char* key, const std::string& why) {
    return Status::InvalidArgument(fmt::format("{}: {} = {}: {}", path, key,
                                               c.contains(key) ? c[key].dump() : "(absent)", why));
  };
  if (!c.contains("model_type") || c["model_type"] != "gpt2")
    return refuse("model_type", "atoll reads GPT-2 models (model_type \"gpt2\") only");
  GPTConfig m;
  for (const auto& [key, field] : {std::pair{"n_layer", &m.n_layer},
                                   {"n_head", &m.n_head},
                                   {"n_embd", &m.n_embd},
                                   {"vocab_size", &m.vocab_size},
                                   {"n_positions", &m.seq_len}}) {
    if (!c.contains(key) || !c[key].is_number_integer() || c[key].get<int64_t>() < 1 ||
        c[key].get<int64_t>() > (int64_t{1} << 30))
      return refuse(key, "a positive integer is needed");
    *field = c[key].get<int>();
  }
  // What GPT2Config defaults to is what atoll computes; other values change the math.
  const auto is = [&](const char* key, const Json& want) {
    return !c.contains(key) || c[key].is_null() || c[key] == want;
  };
  if (!is("activation_function", "gelu_new") && c["activation_function"] != "gelu_pytorch_tanh")
    return refuse("activation_function", "atoll's GELU is the tanh approximation (gelu_new)");
  if (!is("n_inner", 4 * m.n_embd))
    return refuse("n_inner", fmt::format("atoll's MLP is 4 n_embd = {} wide", 4 * m.n_embd));
  if (c.contains("layer_norm_epsilon") && !c["layer_norm_epsilon"].is_null() &&
      (!c["layer_norm_epsilon"].is_number() ||
       std::abs(c["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12))
    return refuse("layer_norm_epsilon", "atoll's LayerNorm uses 1e-5");
  if (!is("tie_word_embeddings", true))
    return refuse("tie_word_embeddings", "atoll's LM head is wte (tied)");
  if (!is("scale_attn_weights", true))
    return refuse("scale_attn_weights", "atoll scales the scores by 1/sqrt(head size)");
  if (!is("scale_attn_by_inverse_layer_idx", false))
    return refuse("scale_attn_by_inverse_layer_idx", "atoll does not scale by the layer");
  if (!is("add_cross_attention", false))
    return refuse("add_cross_attention", "atoll's GPT has no cross-attention");
  if (const std::string why = ValidateConfig(m); !why.empty())
    return Status::InvalidArgument(fmt::format("{}: {}", path, why));
  return m;
}

}  // namespace

StatusOr<Checkpoint> LoadHuggingFaceWeights(const std::string& dir) {
  if (!FileExists(dir)) return Status::NotFound(fmt::format("{}: no such directory", dir));
  ATOLL_ASSIGN_OR_RETURN(GPTConfig model, ReadConfig(dir + "/config.json"));
  const std::string path = dir + "/model.safetensors";
  if (!FileExists(path)) {
    if (FileExists(dir + "/model.safetensors.index.json"))
      return Status::InvalidArgument(
          fmt::format("{}: a sharded checkpoint (model.safetensors.index.json): atoll reads one "
                      "model.safetensors; save it whole with model.save_pretrained(DIR, "
                      "max_shard_size=\"100GB\")",
                      dir));
    if (FileExists(dir + "/pytorch_model.bin"))
      return Status::InvalidArgument(fmt::format(
          "{}: pytorch_model.bin alone: atoll reads safetensors, not pickles; convert with "
          "model.save_pretrained(DIR, safe_serialization=True)",
          dir));
    return Status::NotFound(fmt::format("{}: no model.safetensors", dir));
  }
  ATOLL_ASSIGN_OR_RETURN(SafetensorsFile file, SafetensorsFile::Open(path));
  Checkpoint ck;
  ck.config.model = model;
  const auto layout = ParameterLayout(model);
  ck.params.assign(NumParameters(model), 0.0f);
  std::set<std::string> used;
  for (const ParamTensor& pt : layout) {
    const std::string bare = pt.name.substr(kPrefix.size());
    const TensorView *with = file.Find(pt.name), *without = file.Find(bare);
    if (with != nullptr && without != nullptr)
      return Status::Corruption(
          fmt::format("{}: holds both {} and {}: which one is meant?", path, pt.name, bare));
    const TensorView* t = with != nullptr ? with : without;
    // safetensors' own save_model keeps one name of tied tensors, the first in order: the head's.
    if (t == nullptr && pt.name == "transformer.wte.weight") t = file.Find("lm_head.weight");
    if (t == nullptr)
      return Status::Corruption(
          fmt::format("{}: tensor {} (or {}) is missing", path, bare, pt.name));
    if (t->shape != pt.shape)
      return Status::Corruption(
          fmt::format("{}: tensor {}: shape [{}], config.json's model needs [{}]", path, t->name,
                      fmt::join(t->shape, ", "), fmt::join(pt.shape, ", ")));
    if (!SafetensorsFloat(t->dtype))
      return Status::Corruption(fmt::format("{}: tensor {}: dtype {}, not F32, F16, BF16 or F64",
                                            path, t->name, SafetensorsDTypeName(t->dtype)));
    float* out = ck.params.data() + pt.offset;
    ToFloats(*t, out);
    for (size_t i = 0; i < pt.numel; ++i)
      if (!std::isfinite(out[i]))
        return Status::Corruption(
            fmt::format("{}: tensor {}: element {} is {}", path, t->name, i, out[i]));
    used.insert(t->name);
  }
  const ParamTensor& wte = layout.front();  // transformer.wte.weight
  for (const TensorView& t : file.tensors()) {
    if (used.count(t.name) != 0) continue;
    std::string_view bare = t.name;
    if (bare.starts_with(kPrefix)) bare.remove_prefix(kPrefix.size());
    if (bare.ends_with(".attn.bias") || bare.ends_with(".attn.masked_bias"))
      continue;  // the causal mask's buffers (older transformers saved them: F32, U8 or BOOL)
    if (t.name == "lm_head.weight" && t.shape == wte.shape && SafetensorsFloat(t.dtype)) {
      std::vector<float> head(t.numel());
      ToFloats(t, head.data());
      if (std::memcmp(head.data(), ck.params.data() + wte.offset, wte.numel * sizeof(float)) != 0)
        return Status::InvalidArgument(fmt::format(
            "{}: lm_head.weight differs from wte.weight: an untied LM head, which atoll's GPT "
            "does not have",
            path));
      continue;
    }
    return Status::InvalidArgument(
        fmt::format("{}: tensor {} is not part of GPT-2 as atoll computes it", path, t.name));
  }
  return ck;
}

StatusOr<Checkpoint> LoadWeights(const std::string& dir) {
  if (!FileExists(dir)) return Status::NotFound(fmt::format("{}: no such directory", dir));
  if (FileExists(dir + "/manifest.json")) return LoadCheckpoint(dir, /*with_optimizer=*/false);
  if (FileExists(dir + "/config.json")) return LoadHuggingFaceWeights(dir);
  return Status::NotFound(
      fmt::format("{}: neither an atoll checkpoint (manifest.json) nor a Hugging Face GPT-2 model "
                  "(config.json and model.safetensors)",
                  dir));
}

}  // namespace atl
