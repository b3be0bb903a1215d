#include "model/config.h"

#include <fmt/format.h>

namespace atl {

namespace {
struct BlockTensor {
  ParamKind kind;
  const char* suffix;
};
constexpr BlockTensor kBlock[] = {
    {ParamKind::kLn1W, "ln_1.weight"},        {ParamKind::kLn1B, "ln_1.bias"},
    {ParamKind::kAttnW, "attn.c_attn.weight"}, {ParamKind::kAttnB, "attn.c_attn.bias"},
    {ParamKind::kAttnProjW, "attn.c_proj.weight"}, {ParamKind::kAttnProjB, "attn.c_proj.bias"},
    {ParamKind::kLn2W, "ln_2.weight"},        {ParamKind::kLn2B, "ln_2.bias"},
    {ParamKind::kFcW, "mlp.c_fc.weight"},     {ParamKind::kFcB, "mlp.c_fc.bias"},
    {ParamKind::kFcProjW, "mlp.c_proj.weight"}, {ParamKind::kFcProjB, "mlp.c_proj.bias"},
};

std::vector<int64_t> BlockShape(ParamKind k, int64_t C) {
  switch (k) {
    case ParamKind::kLn1W: case ParamKind::kLn1B: case ParamKind::kLn2W: case ParamKind::kLn2B:
    case ParamKind::kAttnProjB: case ParamKind::kFcProjB: return {C};
    case ParamKind::kAttnW: return {C, 3 * C};
    case ParamKind::kAttnB: return {3 * C};
    case ParamKind::kAttnProjW: return {C, C};
    case ParamKind::kFcW: return {C, 4 * C};
    case ParamKind::kFcB: return {4 * C};
    case ParamKind::kFcProjW: return {4 * C, C};
    default: return {};
  }
}
}  // namespace

std::vector<ParamTensor> ParameterLayout(const GPTConfig& cfg) {
  const int64_t C = cfg.n_embd;
  std::vector<ParamTensor> out;
  size_t offset = 0;
  auto add = [&](std::string name, ParamKind kind, int layer, std::vector<int64_t> shape) {
    size_t n = 1;
    for (int64_t d : shape) n *= size_t(d);
    out.push_back({std::move(name), kind, layer, std::move(shape), offset, n});
    offset += n;
  };
  add("transformer.wte.weight", ParamKind::kWte, -1, {cfg.vocab_size, C});
  add("transformer.wpe.weight", ParamKind::kWpe, -1, {cfg.seq_len, C});
  for (int l = 0; l < cfg.n_layer; ++l) {
    for (const auto& t : kBlock) {
      add(fmt::format("transformer.h.{}.{}", l, t.suffix), t.kind, l, BlockShape(t.kind, C));
    }
  }
  add("transformer.ln_f.weight", ParamKind::kLnfW, -1, {C});
  add("transformer.ln_f.bias", ParamKind::kLnfB, -1, {C});
  return out;
}

size_t NumParameters(const GPTConfig& cfg) {
  const size_t C = size_t(cfg.n_embd);
  const size_t per_block = 2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) +
                           (4 * C * C + C);
  return size_t(cfg.vocab_size) * C + size_t(cfg.seq_len) * C + size_t(cfg.n_layer) * per_block +
         2 * C;
}

size_t ParamOffset(const GPTConfig& cfg, ParamKind k, int layer) {
  const size_t C = size_t(cfg.n_embd);
  const size_t wte = size_t(cfg.vocab_size) * C, wpe = size_t(cfg.seq_len) * C;
  const size_t per_block = (NumParameters(cfg) - wte - wpe - 2 * C) / size_t(cfg.n_layer);
  switch (k) {
    case ParamKind::kWte: return 0;
    case ParamKind::kWpe: return wte;
    case ParamKind::kLnfW: return wte + wpe + size_t(cfg.n_layer) * per_block;
    case ParamKind::kLnfB: return wte + wpe + size_t(cfg.n_layer) * per_block + C;
    default: break;
  }
  size_t off = wte + wpe + size_t(layer) * per_block;
  for (const auto& t : kBlock) {
    if (t.kind == k) return off;
    size_t n = 1;
    for (int64_t d : BlockShape(t.kind, int64_t(C))) n *= size_t(d);
    off += n;
  }
  return off;
}

std::string ValidateConfig(const GPTConfig& cfg) {
  if (cfg.vocab_size <= 0 || cfg.vocab_size > 65536)
    return fmt::format("model.vocab_size must be in [1, 65536] (tokens are uint16), got {}",
                       cfg.vocab_size);
  if (cfg.seq_len <= 0) return fmt::format("model.seq_len must be positive, got {}", cfg.seq_len);
  if (cfg.n_layer <= 0) return fmt::format("model.n_layer must be positive, got {}", cfg.n_layer);
  if (cfg.n_head <= 0) return fmt::format("model.n_head must be positive, got {}", cfg.n_head);
  if (cfg.n_embd <= 0) return fmt::format("model.n_embd must be positive, got {}", cfg.n_embd);
  if (cfg.n_embd % cfg.n_head != 0)
    return fmt::format("model.n_embd ({}) must be divisible by model.n_head ({})", cfg.n_embd,
                       cfg.n_head);
  return "";
}

}  // namespace atl
