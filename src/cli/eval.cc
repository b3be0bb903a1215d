// atoll eval: the loss (and optionally its gradient) of a checkpoint on a token file.
//
// Computed in double: the checkpoint's float parameters are widened exactly and the model runs
// as GPT<double>, so the result can be compared with a float64 PyTorch reference to 1e-5 in the
// loss and 1e-4 in the gradients without atoll's own float rounding in the way.
#include <fmt/format.h>
#include <omp.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/log.h"
#include "core/status.h"
#include "data/dataset.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "train/evaluate.h"
#include "train/hf_import.h"
#include "train/safetensors.h"

namespace atl::cli {

namespace {

struct EvalArgs {
  std::string checkpoint;
  std::string tokens;
  std::string grads_out;
  std::string grads_dtype = "F64";
  std::string logits_out;
  int batch = 8;
  int64_t max_windows = 0;
  int threads = 0;
};

Status WriteGrads(const std::string& path, const GPT<double>& model, const std::string& dtype) {
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.SetMetadata("what", "gradient of the mean eval loss");
  const auto layout = ParameterLayout(model.config());
  std::vector<float> narrow;
  if (dtype == "F32") narrow.assign(model.grads(), model.grads() + model.num_params());
  for (const auto& t : layout) {
    if (dtype == "F32") {
      w.AddFloats(t.name, t.shape, narrow.data() + t.offset);
    } else {
      w.Add(t.name, SafetensorsDType::kF64, t.shape, model.grads() + t.offset);
    }
  }
  return w.Write(path);
}

// The logits of the file's first window (its first seq_len tokens), [1, seq_len, vocab] F32.
Status WriteLogits(const std::string& path, GPT<double>& model, const Sampler& sampler) {
  const int T = model.config().seq_len, V = model.config().vocab_size;
  std::vector<int32_t> inputs(static_cast<size_t>(T)), targets(static_cast<size_t>(T));
  sampler.EvalWindow(0, inputs.data(), targets.data());
  model.Forward(inputs.data(), nullptr, 1, T);
  const std::vector<float> logits(model.logits(), model.logits() + size_t(T) * size_t(V));
  SafetensorsWriter w;
  w.SetMetadata("format", "pt");
  w.SetMetadata("what", "logits of the first window");
  w.AddFloats("logits", {1, T, V}, logits.data());
  return w.Write(path);
}

Status RunEval(const EvalArgs& a) {
  if (a.batch < 1) return Status::InvalidArgument(fmt::format("--batch {}: must be >= 1", a.batch));
  if (a.grads_dtype != "F32" && a.grads_dtype != "F64")
    return Status::InvalidArgument(
        fmt::format("--grads-dtype {}: expected F32 or F64", a.grads_dtype));
  if (a.threads > 0) omp_set_num_threads(a.threads);
  ATOLL_ASSIGN_OR_RETURN(Checkpoint ck, LoadWeights(a.checkpoint));
  auto tokens = TokenFile::Open(a.tokens);
  if (!tokens.ok()) return tokens.status().WithContext("--tokens");
  const GPTConfig& mc = ck.config.model;
  if (tokens->size() <= size_t(mc.seq_len))
    return Status::InvalidArgument(
        fmt::format("--tokens {}: {} tokens, fewer than one window of seq_len + 1 = {}", a.tokens,
                    tokens->size(), mc.seq_len + 1));
  ATOLL_RETURN_IF_ERROR(CheckTokenRange(tokens->tokens(), mc.vocab_size, a.tokens));
  Sampler sampler(tokens->tokens(), 0, mc.seq_len);
  size_t windows = sampler.NumEvalWindows();
  if (a.max_windows > 0) windows = std::min(windows, size_t(a.max_windows));
  const int batch = int(std::min<size_t>(size_t(a.batch), windows));

  GPT<double> model(mc, batch);
  for (size_t i = 0; i < model.num_params(); ++i) model.params()[i] = double(ck.params[i]);
  const double t0 = NowSeconds();
  const double loss = EvalLoss(model, sampler, windows, batch, !a.grads_out.empty());
  LogInfo("eval: {} windows of {} tokens in {:.1f}s", windows, mc.seq_len + 1, NowSeconds() - t0);
  if (!a.grads_out.empty()) ATOLL_RETURN_IF_ERROR(WriteGrads(a.grads_out, model, a.grads_dtype));
  if (!a.logits_out.empty()) ATOLL_RETURN_IF_ERROR(WriteLogits(a.logits_out, model, sampler));
  std::printf("{\"loss\": %.17g}\n", loss);
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

void AddEvalCommand(CLI::App& app) {
  auto args = std::make_shared<EvalArgs>();
  CLI::App* cmd =
      app.add_subcommand("eval", "Loss (and its gradient) of a checkpoint on a token file");
  cmd->footer(
      "Prints {\"loss\": L} on stdout: the mean next-token cross-entropy over the file's\n"
      "consecutive, non-overlapping windows of seq_len + 1 tokens (the incomplete tail is\n"
      "ignored), computed in float64. --grads-out writes dL/dparam for every parameter as\n"
      "safetensors with the checkpoint's (Hugging Face) tensor names; --logits-out writes the\n"
      "logits of the first window (its first seq_len tokens) as \"logits\" [1, seq_len, vocab].\n"
      "Example: atoll eval --checkpoint runs/s1/checkpoint --tokens .cache/data/sotu/val.bin");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory: atoll's, or a Hugging Face GPT-2 model (config.json and "
                  "model.safetensors)")
      ->required();
  cmd->add_option("--tokens", args->tokens, "Token file (e.g. .cache/data/sotu/val.bin)")
      ->required();
  cmd->add_option("--grads-out", args->grads_out, "Write the loss's gradient here (safetensors)");
  cmd->add_option("--grads-dtype", args->grads_dtype, "F64 (default) or F32");
  cmd->add_option("--logits-out", args->logits_out,
                  "Write the first window's logits here (safetensors, F32)");
  cmd->add_option("--batch", args->batch, "Windows per forward pass (default 8)");
  cmd->add_option("--max-windows", args->max_windows, "Use only the first N windows (0: all)");
  cmd->add_option("--threads", args->threads, "OpenMP threads (0: OMP_NUM_THREADS or all cores)");
  cmd->callback([args] { ExitIfError(RunEval(*args)); });
}

}  // namespace atl::cli
