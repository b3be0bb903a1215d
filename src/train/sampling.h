// Text generation from a trained GPT: temperature, top-k, and a counter-based draw per token.
//
// The token at position i of the output is drawn with RandomBits(seed, i, kSampling, 0): the
// same seed, prompt and settings give the same text on any machine and thread count.
//
// Thread-safety: SampleToken is a pure function; Generate uses the model (one call at a time).
#pragma once

#include <cstdint>
#include <vector>

#include "model/gpt.h"

namespace atl {

struct SamplingOptions {
  int max_new_tokens = 64;
  double temperature = 1.0;  // 0: greedy (argmax)
  int top_k = 40;            // keep the k most likely tokens; 0: all
  uint64_t seed = 0;
  int stop_token = -1;  // stop (without emitting it) when drawn; -1: never
};

// Draws a token id from logits[0..vocab) at `temperature` among the top_k most likely (ties
// broken by the lower id), with the uniform draw `u` in [0, 1). temperature 0 or top_k 1:
// argmax.
int SampleToken(const float* logits, int vocab, double temperature, int top_k, double u);

// A uniform double in [0, 1) from the counter-based RNG (53 bits).
double SamplingUniform(uint64_t seed, uint64_t index);

// Appends up to max_new_tokens tokens to `prompt` (which must be non-empty and hold ids below
// the model's vocab); returns only the new tokens. The context is the last seq_len tokens.
std::vector<int> Generate(GPT<float>& model, const std::vector<int>& prompt,
                          const SamplingOptions& options);

}  // namespace atl
