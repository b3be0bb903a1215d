#include "train/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "core/rng.h"

namespace atl {

double SamplingUniform(uint64_t seed, uint64_t index) {
  return double(RandomBits(seed, index, RngPurpose::kSampling, 0) >> 11) * 0x1.0p-53;
}

int SampleToken(const float* logits, int vocab, double temperature, int top_k, double u) {
  std::vector<int> ids(static_cast<size_t>(vocab));
  std::iota(ids.begin(), ids.end(), 0);
  auto more_likely = [&](int a, int b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  };
  if (temperature <= 0 || top_k == 1) return *std::min_element(ids.begin(), ids.end(), more_likely);
  const int k = (top_k <= 0 || top_k > vocab) ? vocab : top_k;
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), more_likely);
  const double top = double(logits[ids[0]]);
  std::vector<double> p(static_cast<size_t>(k));
  double sum = 0;
  for (int i = 0; i < k; ++i) {
    p[size_t(i)] = std::exp((double(logits[ids[size_t(i)]]) - top) / temperature);
    sum += p[size_t(i)];
  }
  double target = u * sum, acc = 0;
  for (int i = 0; i < k; ++i) {
    acc += p[size_t(i)];
    if (target < acc) return ids[size_t(i)];
  }
  return ids[size_t(k - 1)];
}

std::vector<int> Generate(GPT<float>& model, const std::vector<int>& prompt,
                          const SamplingOptions& o) {
  const int seq = model.config().seq_len, vocab = model.config().vocab_size;
  std::vector<int> all = prompt, out;
  std::vector<int32_t> ctx;
  for (int i = 0; i < o.max_new_tokens; ++i) {
    const size_t len = std::min(all.size(), size_t(seq));
    ctx.assign(all.end() - std::ptrdiff_t(len), all.end());
    model.Forward(ctx.data(), nullptr, 1, int(len));
    const float* last = model.logits() + (len - 1) * size_t(vocab);
    const int tok =
        SampleToken(last, vocab, o.temperature, o.top_k, SamplingUniform(o.seed, uint64_t(i)));
    if (tok == o.stop_token) break;
    all.push_back(tok);
    out.push_back(tok);
  }
  return out;
}

}  // namespace atl
