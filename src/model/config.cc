#include "model/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>

namespace atl {

namespace {
struct BlockTensor {
  ParamKind kind;
  const char* suffix;
};
constexpr BlockTensor kBlock[] = {
    {ParamKind::kLn1W, "ln_1.weight"},
    {ParamKind::kLn1B, "ln_1.bias"},
    {ParamKind::kAttnW, "attn.c_attn.weight"},
    {ParamKind::kAttnB, "attn.c_attn.bias"},
    {ParamKind::kAttnProjW, "attn.c_proj.weight"},
    {ParamKind::kAttnProjB, "attn.c_proj.bias"},
    {ParamKind::kLn2W, "ln_2.weight"},
    {ParamKind::kLn2B, "ln_2.bias"},
    {ParamKind::kFcW, "mlp.c_fc.weight"},
    {ParamKind::kFcB, "mlp.c_fc.bias"},
    {ParamKind::kFcProjW, "mlp.c_proj.weight"},
    {ParamKind::kFcProjB, "mlp.c_proj.bias"},
};

std::vector<int64_t> BlockShape(ParamKind k, int64_t C) {
  switch (k) {
    case ParamKind::kLn1W:
    case ParamKind::kLn1B:
    case ParamKind::kLn2W:
    case ParamKind::kLn2B:
    case ParamKind::kAttnProjB:
    case ParamKind::kFcProjB:
      return {C};
    case ParamKind::kAttnW:
      return {C, 3 * C};
    case ParamKind::kAttnB:
      return {3 * C};
    case ParamKind::kAttnProjW:
      return {C, C};
    case ParamKind::kFcW:
      return {C, 4 * C};
    case ParamKind::kFcB:
      return {4 * C};
    case ParamKind::kFcProjW:
      return {4 * C, C};
    default:
      return {};
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
  const size_t per_block =
      2 * C + (3 * C * C + 3 * C) + (C * C + C) + 2 * C + (4 * C * C + 4 * C) + (4 * C * C + C);
  return size_t(cfg.vocab_size) * C + size_t(cfg.seq_len) * C + size_t(cfg.n_layer) * per_block +
         2 * C;
}

size_t ParamOffset(const GPTConfig& cfg, ParamKind k, int layer) {
  const size_t C = size_t(cfg.n_embd);
  const size_t wte = size_t(cfg.vocab_size) * C, wpe = size_t(cfg.seq_len) * C;
  const size_t per_block = (NumParameters(cfg) - wte - wpe - 2 * C) / size_t(cfg.n_layer);
  switch (k) {
    case ParamKind::kWte:
      return 0;
    case ParamKind::kWpe:
      return wte;
    case ParamKind::kLnfW:
      return wte + wpe + size_t(cfg.n_layer) * per_block;
    case ParamKind::kLnfB:
      return wte + wpe + size_t(cfg.n_layer) * per_block + C;
    default:
      break;
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

bool ModelShard::SplitByTensorParallel(ParamKind k) {
  return k == ParamKind::kWte || k == ParamKind::kAttnW || k == ParamKind::kAttnB ||
         k == ParamKind::kAttnProjW || k == ParamKind::kFcW || k == ParamKind::kFcB ||
         k == ParamKind::kFcProjW;
}

VocabRange ShardVocab(const GPTConfig& cfg, const ModelShard& s) {
  const int chunk = (cfg.vocab_size + s.tp_size - 1) / s.tp_size;
  return {std::min(cfg.vocab_size, s.tp_rank * chunk),
          std::min(cfg.vocab_size, (s.tp_rank + 1) * chunk)};
}

std::string ValidateShard(const GPTConfig& cfg, const ModelShard& s) {
  if (s.tp_size < 1 || s.tp_rank < 0 || s.tp_rank >= s.tp_size)
    return fmt::format("tensor-parallel rank {} of {} is out of range", s.tp_rank, s.tp_size);
  if (cfg.n_head % s.tp_size != 0)
    return fmt::format("model.n_head ({}) must be divisible by parallel.tp ({})", cfg.n_head,
                       s.tp_size);
  const VocabRange vocab = ShardVocab(cfg, s);
  if (vocab.begin >= vocab.end)
    return fmt::format(
        "model.vocab_size ({}) is too small to split across {} tensor-parallel "
        "ranks",
        cfg.vocab_size, s.tp_size);
  const int end = s.end(cfg);
  if (s.layer_begin < 0 || end > cfg.n_layer || s.layer_begin >= end)
    return fmt::format("layer range [{}, {}) is not a non-empty part of the {} layers",
                       s.layer_begin, end, cfg.n_layer);
  return "";
}

std::vector<ParamTensor> ShardLayout(const GPTConfig& cfg, const ModelShard& shard) {
  const int tp = shard.tp_size, end = shard.end(cfg);
  std::vector<ParamTensor> out;
  size_t offset = 0;
  for (ParamTensor t : ParameterLayout(cfg)) {
    bool held;
    switch (t.kind) {
      case ParamKind::kWte:
        held = shard.first_stage() || shard.last_stage(cfg);
        break;
      case ParamKind::kWpe:
        held = shard.first_stage();
        break;
      case ParamKind::kLnfW:
      case ParamKind::kLnfB:
        held = shard.last_stage(cfg);
        break;
      default:
        held = t.layer >= shard.layer_begin && t.layer < end;
        break;
    }
    if (!held) continue;
    if (t.kind == ParamKind::kWte && tp > 1) {
      const VocabRange vocab = ShardVocab(cfg, shard);
      t.shape[0] = vocab.end - vocab.begin;
      t.numel = size_t(t.shape[0] * t.shape[1]);
    } else if (ModelShard::SplitByTensorParallel(t.kind) && tp > 1) {
      // Column-parallel tensors split their last dimension, row-parallel ones their first.
      const bool rows = t.kind == ParamKind::kAttnProjW || t.kind == ParamKind::kFcProjW;
      t.shape[rows ? 0 : t.shape.size() - 1] /= tp;
      t.numel /= size_t(tp);
    }
    t.offset = offset;
    offset += t.numel;
    out.push_back(std::move(t));
  }
  return out;
}

template <class T>
void CopyShard(const GPTConfig& cfg, const ModelShard& shard, T* whole, T* shard_buf,
               bool to_shard) {
  const auto full = ParameterLayout(cfg);
  const auto local = ShardLayout(cfg, shard);
  const size_t tp = size_t(shard.tp_size), r = size_t(shard.tp_rank);
  // Copies n elements: whole[w] <-> shard_buf[s].
  auto copy = [&](size_t w, size_t s, size_t n) {
    if (to_shard)
      std::memcpy(shard_buf + s, whole + w, n * sizeof(T));
    else
      std::memcpy(whole + w, shard_buf + s, n * sizeof(T));
  };
  size_t fi = 0;
  for (const ParamTensor& t : local) {
    while (full[fi].name != t.name) ++fi;
    const ParamTensor& f = full[fi];
    if (t.numel == f.numel) {
      copy(f.offset, t.offset, t.numel);
      continue;
    }
    // Split: rows [r * rows_local, ...) of a row-parallel weight are contiguous; column-parallel
    // tensors take a column block of each row, and c_attn a block of each of q, k and v.
    const size_t out_cols = size_t(f.shape.back());
    const size_t rows = f.shape.size() == 2 ? size_t(f.shape[0]) : 1;
    switch (t.kind) {
      case ParamKind::kWte:
        copy(f.offset + size_t(ShardVocab(cfg, shard).begin) * out_cols, t.offset, t.numel);
        break;
      case ParamKind::kAttnProjW:
      case ParamKind::kFcProjW:
        copy(f.offset + r * t.numel, t.offset, t.numel);
        break;
      case ParamKind::kAttnW:
      case ParamKind::kAttnB: {
        const size_t C = out_cols / 3, Cl = C / tp;
        for (size_t i = 0; i < rows; ++i)
          for (size_t part = 0; part < 3; ++part)
            copy(f.offset + i * out_cols + part * C + r * Cl, t.offset + i * 3 * Cl + part * Cl,
                 Cl);
        break;
      }
      default: {  // kFcW, kFcB
        const size_t Fl = out_cols / tp;
        for (size_t i = 0; i < rows; ++i)
          copy(f.offset + i * out_cols + r * Fl, t.offset + i * Fl, Fl);
        break;
      }
    }
  }
}

template void CopyShard<float>(const GPTConfig&, const ModelShard&, float*, float*, bool);
template void CopyShard<double>(const GPTConfig&, const ModelShard&, double*, double*, bool);

}  // namespace atl
