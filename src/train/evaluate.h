// The evaluation loss, as `atoll eval` and the trainer's validation loss define it: the mean
// next-token cross-entropy over the consecutive, non-overlapping windows of seq_len + 1 tokens
// of a token file (Sampler::EvalWindow), optionally with its gradient.
//
// Windows are processed in batches; each batch's mean loss is weighted by its window count and
// the weighted sum divided by the total in double, so the result is the mean over all windows x
// positions whatever the batch size (up to the rounding of T). With gradients, each batch's
// backward uses loss_scale = windows_in_batch / total, so grads() end up holding the gradient of
// that one mean loss.
//
// Thread-safety: uses the model; one call at a time.
#pragma once

#include <cstddef>

#include "core/status.h"
#include "data/dataset.h"
#include "model/gpt.h"

namespace atl {

// REQUIRES: 1 <= batch <= the model's max_batch; 1 <= num_windows <= sampler.NumEvalWindows();
// sampler.seq_len() <= the model's seq_len. With with_grads, grads are zeroed first.
template <class T>
double EvalLoss(GPT<T>& model, const Sampler& sampler, size_t num_windows, int batch,
                bool with_grads);

// Checks that every token of `tokens` is below vocab_size (an id the model has an embedding
// for); the error names the file (`what`), the position and the id.
Status CheckTokenRange(std::span<const uint16_t> tokens, int vocab_size, const std::string& what);

}  // namespace atl
