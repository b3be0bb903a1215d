// atoll sample: generate text from a checkpoint.
#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "core/status.h"
#include "data/tokenizer.h"
#include "model/gpt.h"
#include "train/checkpoint.h"
#include "train/hf_import.h"
#include "train/sampling.h"

namespace atl::cli {

namespace {

struct SampleArgs {
  std::string checkpoint;
  std::string prompt;
  int tokens = 64;
  double temperature = 1.0;
  int top_k = 40;
  uint64_t seed = 0;
  bool keep_going = false;
};

Status RunSample(const SampleArgs& a) {
  if (a.tokens < 0)
    return Status::InvalidArgument(fmt::format("--tokens {}: must be >= 0", a.tokens));
  if (!(a.temperature >= 0))
    return Status::InvalidArgument(fmt::format("--temperature {}: must be >= 0", a.temperature));
  if (a.top_k < 0) return Status::InvalidArgument(fmt::format("--top-k {}: must be >= 0", a.top_k));
  ATOLL_ASSIGN_OR_RETURN(Checkpoint ck, LoadWeights(a.checkpoint));
  auto tok = Tokenizer::Load(DefaultEncoderDir());
  if (!tok.ok())
    return tok.status().WithContext(
        "loading the GPT-2 tokenizer (scripts/setup.sh fetches it; ATOLL_CACHE_DIR overrides "
        ".cache)");
  std::vector<int> prompt = tok->Encode(a.prompt);
  if (prompt.empty()) prompt.push_back(Tokenizer::kEndOfText);
  const int vocab = ck.config.model.vocab_size;
  for (int id : prompt)
    if (id >= vocab)
      return Status::InvalidArgument(
          fmt::format("--prompt: token {} is outside the model's vocab_size {}", id, vocab));
  GPT<float> model(ck.config.model, 1);
  std::copy(ck.params.begin(), ck.params.end(), model.params());
  SamplingOptions o;
  o.max_new_tokens = a.tokens;
  o.temperature = a.temperature;
  o.top_k = a.top_k;
  o.seed = a.seed;
  o.stop_token = a.keep_going ? -1 : Tokenizer::kEndOfText;
  const std::vector<int> out = Generate(model, prompt, o);
  std::printf("%s%s\n", a.prompt.c_str(), tok->Decode(out).c_str());
  std::fflush(stdout);
  return Status::Ok();
}

}  // namespace

void AddSampleCommand(CLI::App& app) {
  auto args = std::make_shared<SampleArgs>();
  CLI::App* cmd = app.add_subcommand("sample", "Generate text from a checkpoint");
  cmd->footer(
      "Prints the prompt followed by the generated text. Deterministic: the same checkpoint,\n"
      "prompt, settings and --seed give the same text. Generation stops at <|endoftext|>\n"
      "unless --keep-going.\n"
      "Example: atoll sample --checkpoint runs/s1/checkpoint --prompt \"The state of the Union\"");
  cmd->add_option("--checkpoint", args->checkpoint,
                  "Checkpoint directory: atoll's, or a Hugging Face GPT-2 model (config.json and "
                  "model.safetensors)")
      ->required();
  cmd->add_option("--prompt", args->prompt, "Text to continue (empty: start a new document)");
  cmd->add_option("--tokens", args->tokens, "Tokens to generate (default 64)");
  cmd->add_option("--temperature", args->temperature, "Softmax temperature; 0: greedy (default 1)");
  cmd->add_option("--top-k", args->top_k,
                  "Sample among the k most likely tokens; 0: all (default 40)");
  cmd->add_option("--seed", args->seed, "Seed of the token draws (default 0)");
  cmd->add_flag("--keep-going", args->keep_going, "Do not stop at <|endoftext|>");
  cmd->callback([args] { ExitIfError(RunSample(*args)); });
}

}  // namespace atl::cli
