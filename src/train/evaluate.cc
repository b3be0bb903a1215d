#include "train/evaluate.h"

#include <fmt/format.h>

#include <vector>

namespace atl {

template <class T>
double EvalLoss(GPT<T>& model, const Sampler& sampler, size_t num_windows, int batch,
                bool with_grads) {
  const int seq = sampler.seq_len();
  std::vector<int32_t> inputs(size_t(batch) * seq), targets(size_t(batch) * seq);
  if (with_grads) model.ZeroGrad();
  double total = 0.0;
  for (size_t first = 0; first < num_windows; first += size_t(batch)) {
    const int b = int(std::min<size_t>(size_t(batch), num_windows - first));
    for (int i = 0; i < b; ++i)
      sampler.EvalWindow(first + size_t(i), inputs.data() + size_t(i) * seq,
                         targets.data() + size_t(i) * seq);
    const T loss = model.Forward(inputs.data(), targets.data(), b, seq);
    total += double(loss) * double(b);
    if (with_grads) model.Backward(T(double(b) / double(num_windows)));
  }
  return total / double(num_windows);
}

template double EvalLoss<float>(GPT<float>&, const Sampler&, size_t, int, bool);
template double EvalLoss<double>(GPT<double>&, const Sampler&, size_t, int, bool);

Status CheckTokenRange(std::span<const uint16_t> tokens, int vocab_size, const std::string& what) {
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (tokens[i] >= vocab_size)
      return Status::InvalidArgument(
          fmt::format("{}: token {} at position {} is outside model.vocab_size {}", what, tokens[i],
                      i, vocab_size));
  }
  return Status::Ok();
}

}  // namespace atl
