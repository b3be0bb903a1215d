// GPT-2 forward and backward over the kernels of kernels/ops.h (see gpt.h).
#include "model/gpt.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "core/rng.h"
#include "kernels/ops.h"

namespace atl {

namespace k = kernels;

namespace {

// Runs f; when profiling, adds its wall time to times' entry for op (entries in first-use order).
template <class Times, class F>
void Timed(bool profiling, Times& times, const char* op, F&& f) {
  if (!profiling) {
    f();
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  f();
  const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  for (auto& e : times) {
    if (std::strcmp(e.op, op) == 0) {
      e.seconds += dt;
      ++e.calls;
      return;
    }
  }
  times.push_back({op, dt, 1});
}

// Zeroes several buffers in one OpenMP region (static chunks; values, so any split is exact).
template <class T>
void ZeroBuffers(std::initializer_list<std::pair<T*, size_t>> buffers) {
#pragma omp parallel
  for (const std::pair<T*, size_t>& buffer : buffers) {
    T* p = buffer.first;
    const int64_t n = int64_t(buffer.second);
#pragma omp for schedule(static) nowait
    for (int64_t i = 0; i < n; ++i) p[i] = T(0);
  }
}

}  // namespace

// One kernel call, timed under `op` when profiling is on.
#define ATL_OP(op, ...) Timed(a.profiling, a.times, op, [&] { __VA_ARGS__; })

// Forward activations for every layer (backward needs them), and one layer's worth of gradient
// buffers that backward reuses from the top layer down. All sized for (max_batch, seq_len) once.
template <class T>
struct GPT<T>::Activations {
  Activations(const GPTConfig& c, int max_batch) {
    const size_t N = size_t(max_batch) * c.seq_len, C = c.n_embd, L = c.n_layer;
    const size_t att = size_t(max_batch) * c.n_head * c.seq_len * c.seq_len;
    rows = N;
    att_per_layer = att;
    inputs.resize(N);
    targets.resize(N);
    encoded.resize(N * C);
    ln1.resize(L * N * C);
    ln1_mean.resize(L * N);
    ln1_rstd.resize(L * N);
    qkv.resize(L * N * 3 * C);
    atty.resize(L * N * C);
    att_probs.resize(L * att);
    residual2.resize(L * N * C);
    ln2.resize(L * N * C);
    ln2_mean.resize(L * N);
    ln2_rstd.resize(L * N);
    fch.resize(L * N * 4 * C);
    fch_gelu.resize(L * N * 4 * C);
    residual3.resize(L * N * C);
    lnf.resize(N * C);
    lnf_mean.resize(N);
    lnf_rstd.resize(N);
    logits.resize(N * size_t(c.vocab_size));
    lse.resize(N);
    losses.resize(N);

    dresidual.resize(N * C);
    dln.resize(N * C);
    dln1.resize(N * C);
    datty.resize(N * C);
    dqkv.resize(N * 3 * C);
    datt_scratch.resize(att);
    dfch_gelu.resize(N * 4 * C);
    dfch.resize(N * 4 * C);
    classifier_scratch.resize(
        std::max(k::ClassifierForwardScratch(int(N), c.vocab_size),
                 k::ClassifierBackwardScratch(int(N), c.n_embd, c.vocab_size)));
  }

  size_t rows, att_per_layer;
  std::vector<int32_t> inputs, targets;
  std::vector<T> encoded;                  // [N, C]
  std::vector<T> ln1, ln1_mean, ln1_rstd;  // [L, N, C], [L, N], [L, N]
  std::vector<T> qkv;                      // [L, N, 3C]
  std::vector<T> atty;                     // [L, N, C]
  std::vector<T> att_probs;                // [L, B, NH, T, T]
  std::vector<T> residual2;                // [L, N, C]  residual + attn.c_proj
  std::vector<T> ln2, ln2_mean, ln2_rstd;  // [L, N, C], [L, N], [L, N]
  std::vector<T> fch, fch_gelu;            // [L, N, 4C]
  std::vector<T> residual3;                // [L, N, C]  residual2 + mlp.c_proj
  std::vector<T> lnf, lnf_mean, lnf_rstd;  // [N, C], [N], [N]
  std::vector<T> logits;                   // [N, V]
  std::vector<T> lse, losses;              // [N]

  std::vector<T> dresidual;  // [N, C] gradient of the residual stream, carried down the layers
  std::vector<T> dln, dln1;  // [N, C] gradients of LayerNorm outputs (ln_f / ln_2, ln_1)
  std::vector<T> datty;      // [N, C]
  std::vector<T> dqkv;       // [N, 3C]
  std::vector<T> datt_scratch;
  std::vector<T> dfch_gelu, dfch;  // [N, 4C]
  std::vector<T> classifier_scratch;

  bool profiling = false;
  std::vector<OpTime> times;
};

template <class T>
GPT<T>::GPT(const GPTConfig& cfg, int max_batch)
    : cfg_(cfg), max_batch_(max_batch), num_params_(NumParameters(cfg)) {
  const std::string err = ValidateConfig(cfg);
  if (!err.empty()) throw std::invalid_argument("GPT: " + err);
  if (max_batch <= 0)
    throw std::invalid_argument(fmt::format("GPT: max_batch must be positive, got {}", max_batch));
  k::InitBackend();
  params_.assign(num_params_, T(0));
  grads_.assign(num_params_, T(0));
  acts_ = std::make_unique<Activations>(cfg, max_batch);
}

template <class T>
GPT<T>::~GPT() = default;

template <class T>
void GPT<T>::InitParameters(uint64_t seed) {
  const double proj_std = 0.02 / std::sqrt(2.0 * cfg_.n_layer);
  for (const ParamTensor& t : ParameterLayout(cfg_)) {
    double std_dev = 0;  // 0: constant
    T constant = T(0);
    switch (t.kind) {
      case ParamKind::kWte:
      case ParamKind::kAttnW:
      case ParamKind::kFcW:
        std_dev = 0.02;
        break;
      case ParamKind::kAttnProjW:
      case ParamKind::kFcProjW:
        std_dev = proj_std;
        break;
      case ParamKind::kWpe:
        std_dev = 0.01;
        break;
      case ParamKind::kLn1W:
      case ParamKind::kLn2W:
      case ParamKind::kLnfW:
        constant = T(1);
        break;
      default:
        break;  // biases
    }
    T* p = params_.data() + t.offset;
    const int64_t n = int64_t(t.numel);
    if (std_dev == 0) {
      std::fill(p, p + n, constant);
      continue;
    }
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t index = t.offset + uint64_t(i);
      p[i] = T(std_dev * double(RandomNormal(seed, 0, RngPurpose::kInit, index)));
    }
  }
}

template <class T>
T GPT<T>::Forward(const int32_t* inputs, const int32_t* targets, int B, int T_len) {
  if (B <= 0 || B > max_batch_ || T_len <= 0 || T_len > cfg_.seq_len) {
    throw std::invalid_argument(
        fmt::format("GPT::Forward: batch {}x{} outside the allocated (max_batch {}, seq_len {})", B,
                    T_len, max_batch_, cfg_.seq_len));
  }
  const int C = cfg_.n_embd, V = cfg_.vocab_size, L = cfg_.n_layer, NH = cfg_.n_head;
  const int N = B * T_len;
  Activations& a = *acts_;
  for (int i = 0; i < N; ++i) {
    if (inputs[i] < 0 || inputs[i] >= V ||
        (targets != nullptr && (targets[i] < 0 || targets[i] >= V))) {
      throw std::invalid_argument(fmt::format(
          "GPT::Forward: token at position {} out of range [0, {}): input {}, target {}", i, V,
          inputs[i], targets != nullptr ? targets[i] : 0));
    }
  }
  std::copy(inputs, inputs + N, a.inputs.begin());
  if (targets != nullptr) std::copy(targets, targets + N, a.targets.begin());

  const size_t NC = size_t(N) * C, NR = a.rows;  // layer strides use the allocated rows
  const T* P = params_.data();
  auto W = [&](ParamKind kind, int l = -1) { return P + ParamOffset(cfg_, kind, l); };

  ATL_OP("encoder fwd", k::EncoderForward(a.encoded.data(), inputs, W(ParamKind::kWte),
                                          W(ParamKind::kWpe), B, T_len, C));
  const T* residual = a.encoded.data();
  for (int l = 0; l < L; ++l) {
    T* ln1 = a.ln1.data() + l * NR * C;
    T* ln1_mean = a.ln1_mean.data() + l * NR;
    T* ln1_rstd = a.ln1_rstd.data() + l * NR;
    T* qkv = a.qkv.data() + l * NR * 3 * C;
    T* atty = a.atty.data() + l * NR * C;
    T* att = a.att_probs.data() + l * a.att_per_layer;
    T* res2 = a.residual2.data() + l * NR * C;
    T* ln2 = a.ln2.data() + l * NR * C;
    T* ln2_mean = a.ln2_mean.data() + l * NR;
    T* ln2_rstd = a.ln2_rstd.data() + l * NR;
    T* fch = a.fch.data() + l * NR * 4 * C;
    T* fch_gelu = a.fch_gelu.data() + l * NR * 4 * C;
    T* res3 = a.residual3.data() + l * NR * C;

    ATL_OP("layernorm fwd",
           k::LayerNormForward(ln1, ln1_mean, ln1_rstd, residual, W(ParamKind::kLn1W, l),
                               W(ParamKind::kLn1B, l), N, C));
    ATL_OP("matmul fwd", k::MatmulForward(qkv, ln1, W(ParamKind::kAttnW, l),
                                          W(ParamKind::kAttnB, l), N, C, 3 * C));
    ATL_OP("attention fwd", k::AttentionForward(atty, att, qkv, B, T_len, C, NH));
    // residual2 = residual + atty · W_proj + b_proj (the projection lands in residual2 first).
    ATL_OP("matmul fwd", k::MatmulForward(res2, atty, W(ParamKind::kAttnProjW, l),
                                          W(ParamKind::kAttnProjB, l), N, C, C));
    ATL_OP("residual fwd", k::ResidualForward(res2, residual, res2, NC));
    ATL_OP("layernorm fwd",
           k::LayerNormForward(ln2, ln2_mean, ln2_rstd, res2, W(ParamKind::kLn2W, l),
                               W(ParamKind::kLn2B, l), N, C));
    ATL_OP("matmul fwd",
           k::MatmulForward(fch, ln2, W(ParamKind::kFcW, l), W(ParamKind::kFcB, l), N, C, 4 * C));
    ATL_OP("gelu fwd", k::GeluForward(fch_gelu, fch, size_t(N) * 4 * C));
    ATL_OP("matmul fwd", k::MatmulForward(res3, fch_gelu, W(ParamKind::kFcProjW, l),
                                          W(ParamKind::kFcProjB, l), N, 4 * C, C));
    ATL_OP("residual fwd", k::ResidualForward(res3, res2, res3, NC));
    residual = res3;
  }
  ATL_OP("layernorm fwd",
         k::LayerNormForward(a.lnf.data(), a.lnf_mean.data(), a.lnf_rstd.data(), residual,
                             W(ParamKind::kLnfW), W(ParamKind::kLnfB), N, C));
  T loss = 0;
  ATL_OP("classifier fwd",
         loss = k::ClassifierForward(a.logits.data(), a.lse.data(), a.losses.data(),
                                     a.classifier_scratch.data(), a.lnf.data(), W(ParamKind::kWte),
                                     targets, N, C, V));
  last_B_ = B;
  last_T_ = T_len;
  last_had_targets_ = targets != nullptr;
  return loss;
}

template <class T>
void GPT<T>::Backward(T loss_scale) {
  if (!last_had_targets_) {
    throw std::logic_error("GPT::Backward: the last Forward had no targets (or there was none)");
  }
  const int B = last_B_, T_len = last_T_;
  const int C = cfg_.n_embd, V = cfg_.vocab_size, L = cfg_.n_layer, NH = cfg_.n_head;
  const int N = B * T_len;
  const size_t NC = size_t(N) * C, NR = acts_->rows;
  Activations& a = *acts_;
  const T* P = params_.data();
  T* G = grads_.data();
  auto W = [&](ParamKind kind, int l = -1) { return P + ParamOffset(cfg_, kind, l); };
  auto D = [&](ParamKind kind, int l = -1) { return G + ParamOffset(cfg_, kind, l); };

  // Loss = loss_scale * mean over N positions.
  const T dloss = loss_scale / T(N);
  ATL_OP("zero", ZeroBuffers<T>({{a.dln.data(), NC}, {a.dresidual.data(), NC}}));
  ATL_OP("classifier bwd",
         k::ClassifierBackward(a.dln.data(), D(ParamKind::kWte), a.classifier_scratch.data(),
                               a.logits.data(), a.lse.data(), a.lnf.data(), W(ParamKind::kWte),
                               a.targets.data(), dloss, N, C, V));
  const T* last_residual = L > 0 ? a.residual3.data() + (L - 1) * NR * C : a.encoded.data();
  ATL_OP("layernorm bwd",
         k::LayerNormBackward(a.dresidual.data(), D(ParamKind::kLnfW), D(ParamKind::kLnfB),
                              a.dln.data(), last_residual, W(ParamKind::kLnfW), a.lnf_mean.data(),
                              a.lnf_rstd.data(), N, C));
  T* dres = a.dresidual.data();
  for (int l = L - 1; l >= 0; --l) {
    const T* residual = l == 0 ? a.encoded.data() : a.residual3.data() + (l - 1) * NR * C;
    const T* ln1 = a.ln1.data() + l * NR * C;
    const T* ln1_mean = a.ln1_mean.data() + l * NR;
    const T* ln1_rstd = a.ln1_rstd.data() + l * NR;
    const T* qkv = a.qkv.data() + l * NR * 3 * C;
    const T* atty = a.atty.data() + l * NR * C;
    const T* att = a.att_probs.data() + l * a.att_per_layer;
    const T* res2 = a.residual2.data() + l * NR * C;
    const T* ln2 = a.ln2.data() + l * NR * C;
    const T* ln2_mean = a.ln2_mean.data() + l * NR;
    const T* ln2_rstd = a.ln2_rstd.data() + l * NR;
    const T* fch = a.fch.data() + l * NR * 4 * C;
    const T* fch_gelu = a.fch_gelu.data() + l * NR * 4 * C;

    // residual3 = residual2 + mlp(ln2(residual2)): dres flows to residual2 unchanged, and into
    // the MLP as the gradient of its output.
    ATL_OP("zero", ZeroBuffers<T>({{a.dfch_gelu.data(), size_t(N) * 4 * C},
                                   {a.dfch.data(), size_t(N) * 4 * C},
                                   {a.dln.data(), NC},
                                   {a.dln1.data(), NC},
                                   {a.datty.data(), NC},
                                   {a.dqkv.data(), size_t(N) * 3 * C}}));
    ATL_OP("matmul bwd", k::MatmulBackward(a.dfch_gelu.data(), D(ParamKind::kFcProjW, l),
                                           D(ParamKind::kFcProjB, l), dres, fch_gelu,
                                           W(ParamKind::kFcProjW, l), N, 4 * C, C));
    ATL_OP("gelu bwd", k::GeluBackward(a.dfch.data(), fch, a.dfch_gelu.data(), size_t(N) * 4 * C));
    ATL_OP("matmul bwd",
           k::MatmulBackward(a.dln.data(), D(ParamKind::kFcW, l), D(ParamKind::kFcB, l),
                             a.dfch.data(), ln2, W(ParamKind::kFcW, l), N, C, 4 * C));
    ATL_OP("layernorm bwd",
           k::LayerNormBackward(dres, D(ParamKind::kLn2W, l), D(ParamKind::kLn2B, l), a.dln.data(),
                                res2, W(ParamKind::kLn2W, l), ln2_mean, ln2_rstd, N, C));
    // residual2 = residual + attn(ln1(residual)), likewise.
    ATL_OP("matmul bwd", k::MatmulBackward(a.datty.data(), D(ParamKind::kAttnProjW, l),
                                           D(ParamKind::kAttnProjB, l), dres, atty,
                                           W(ParamKind::kAttnProjW, l), N, C, C));
    ATL_OP("attention bwd", k::AttentionBackward(a.dqkv.data(), a.datt_scratch.data(),
                                                 a.datty.data(), qkv, att, B, T_len, C, NH));
    ATL_OP("matmul bwd",
           k::MatmulBackward(a.dln1.data(), D(ParamKind::kAttnW, l), D(ParamKind::kAttnB, l),
                             a.dqkv.data(), ln1, W(ParamKind::kAttnW, l), N, C, 3 * C));
    ATL_OP("layernorm bwd",
           k::LayerNormBackward(dres, D(ParamKind::kLn1W, l), D(ParamKind::kLn1B, l), a.dln1.data(),
                                residual, W(ParamKind::kLn1W, l), ln1_mean, ln1_rstd, N, C));
    if (backward_hook_) backward_hook_(l);
  }
  ATL_OP("encoder bwd", k::EncoderBackward(D(ParamKind::kWte), D(ParamKind::kWpe), dres,
                                           a.inputs.data(), B, T_len, C));
}

template <class T>
void GPT<T>::ZeroGrad() {
  // 44 MB for the `small` preset: worth both cores.
  T* g = grads_.data();
  const int64_t n = int64_t(grads_.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) g[i] = T(0);
}

template <class T>
const T* GPT<T>::logits() const {
  return acts_->logits.data();
}

template <class T>
void GPT<T>::set_profiling(bool on) {
  acts_->profiling = on;
}

template <class T>
std::vector<typename GPT<T>::OpTime> GPT<T>::op_times() const {
  return acts_->times;
}

template <class T>
void GPT<T>::reset_op_times() {
  acts_->times.clear();
}

#undef ATL_OP

template class GPT<float>;
template class GPT<double>;

}  // namespace atl
