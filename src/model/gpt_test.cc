// GPT<T>: the whole-model gradient against finite differences (double), float against double,
// bitwise determinism across thread counts, initialization, and argument checks.
#include "model/gpt.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
#include <random>
#include <stdexcept>
#include <vector>

#include "core/rng.h"

namespace atl {
namespace {

std::vector<int32_t> RandomTokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

// GPT-2's init makes a tiny model nearly linear (weights 0.02): perturb every parameter so the
// finite-difference test exercises the nonlinear parts (softmax, LayerNorm, GELU) at O(1) scale.
template <class T>
void Perturb(GPT<T>& m, double scale, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<double> d(0.0, scale);
  for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] += T(d(gen));
}

GPTConfig TinyConfig() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 2;
  c.n_embd = 8;
  c.vocab_size = 64;
  c.seq_len = 8;
  return c;
}

// Central differences on the double model, for a random sample of elements of every tensor
// (every kind, every layer).
//
// Tolerance: loss J ~ 4, step h = 1e-5, so rounding noise in (J(+h) - J(-h)) / 2h is about
// 1e-16 * 4 / 1e-5 ~ 4e-11 and the truncation term h^2 J''' / 6 ~ 1e-11 (O(1) derivatives after
// the perturbation). We require |analytic - numeric| <= 1e-6 * max(|numeric|, 1e-3): the floor
// 1e-9 is ~25x the noise, and relative 1e-6 sits far below any real bug's O(1) error.
TEST(GptTest, FiniteDiffGradientDouble) {
  const GPTConfig cfg = TinyConfig();
  const int B = 2, T = cfg.seq_len;
  GPT<double> m(cfg, B);
  m.InitParameters(7);
  Perturb(m, 0.3, 1);
  const auto inputs = RandomTokens(size_t(B) * T, cfg.vocab_size, 2);
  const auto targets = RandomTokens(size_t(B) * T, cfg.vocab_size, 3);
  m.ZeroGrad();
  const double loss = m.Forward(inputs.data(), targets.data(), B, T);
  m.Backward();
  const std::vector<double> grads(m.grads(), m.grads() + m.num_params());

  std::mt19937 gen(4);
  const double h = 1e-5, rtol = 1e-6, floor = 1e-3;
  double worst = 0;
  int checked = 0;
  for (const ParamTensor& t : ParameterLayout(cfg)) {
    std::vector<size_t> idx;
    idx.reserve(6 + 2 * size_t(cfg.n_embd));
    for (int s = 0; s < 6; ++s) idx.push_back(t.offset + gen() % t.numel);
    if (t.kind == ParamKind::kWte) {  // rows of tokens that occur (embedding + head paths)
      for (int c = 0; c < cfg.n_embd; ++c) idx.push_back(size_t(inputs[0]) * cfg.n_embd + c);
      for (int c = 0; c < cfg.n_embd; ++c) idx.push_back(size_t(targets[1]) * cfg.n_embd + c);
    }
    double worst_t = 0;
    for (size_t i : idx) {
      double& p = m.params()[i];
      const double p0 = p;
      p = p0 + h;
      const double jp = m.Forward(inputs.data(), targets.data(), B, T);
      p = p0 - h;
      const double jm = m.Forward(inputs.data(), targets.data(), B, T);
      p = p0;
      const double numeric = (jp - jm) / (2 * h);
      const double rel = std::abs(grads[i] - numeric) / std::max(std::abs(numeric), floor);
      worst_t = std::max(worst_t, rel);
      ++checked;
      EXPECT_LE(rel, rtol) << t.name << " flat index " << i << ": analytic " << grads[i]
                           << " numeric " << numeric;
    }
    worst = std::max(worst, worst_t);
  }
  std::printf("GPT<double> finite differences: %d elements, max rel err %.2e (loss %.6f)\n",
              checked, worst, loss);
}

TEST(GptTest, LossScaleAccumulates) {
  const GPTConfig cfg = TinyConfig();
  GPT<float> m(cfg, 2);
  m.InitParameters(3);
  const auto in = RandomTokens(16, cfg.vocab_size, 5), tg = RandomTokens(16, cfg.vocab_size, 6);
  m.ZeroGrad();
  m.Forward(in.data(), tg.data(), 2, 8);
  m.Backward(1.0f);
  const std::vector<float> once(m.grads(), m.grads() + m.num_params());
  m.ZeroGrad();
  m.Forward(in.data(), tg.data(), 2, 8);
  m.Backward(0.5f);
  // Every op is linear in the loss scale and scaling by a power of two is exact in floating
  // point, so half the scale gives exactly half the gradient.
  for (size_t i = 0; i < once.size(); ++i) ASSERT_EQ(m.grads()[i], 0.5f * once[i]) << i;
  m.Backward(0.5f);  // Backward of the same Forward again: grads add up to the whole (rounding
                     // differs: contributions to a tensor are added in another grouping)
  for (size_t i = 0; i < once.size(); ++i) {
    ASSERT_NEAR(m.grads()[i], once[i], 1e-6f * (std::abs(once[i]) + 1e-3f)) << i;
  }
}

// A mid-size shape in which every kernel runs its tiled paths.
GPTConfig MidConfig() {
  GPTConfig c;
  c.n_layer = 2;
  c.n_head = 4;
  c.n_embd = 64;
  c.vocab_size = 3001;
  c.seq_len = 32;
  return c;
}

// Float against double from the same parameters. Float tolerance: each layer adds ~1e-7
// relative rounding per op (LayerNorm, GEMM rows of <= 256 terms, the ~1-2 ulp vector exp), and
// two layers plus the head stay below ~2e-6; the issue asks for ~1e-5, which we assert.
TEST(GptTest, FloatMatchesDouble) {
  const GPTConfig cfg = MidConfig();
  const int B = 3, T = cfg.seq_len;
  GPT<double> md(cfg, B);
  GPT<float> mf(cfg, B);
  md.InitParameters(11);
  Perturb(md, 0.05, 12);
  for (size_t i = 0; i < md.num_params(); ++i) mf.params()[i] = float(md.params()[i]);
  for (size_t i = 0; i < md.num_params(); ++i) md.params()[i] = double(mf.params()[i]);
  const auto in = RandomTokens(size_t(B) * T, cfg.vocab_size, 13);
  const auto tg = RandomTokens(size_t(B) * T, cfg.vocab_size, 14);
  md.ZeroGrad();
  mf.ZeroGrad();
  const double ld = md.Forward(in.data(), tg.data(), B, T);
  const float lf = mf.Forward(in.data(), tg.data(), B, T);
  md.Backward();
  mf.Backward();
  const double loss_rel = std::abs(lf - ld) / ld;
  double logit_err = 0, logit_max = 0;
  for (size_t i = 0; i < size_t(B) * T * cfg.vocab_size; ++i) {
    logit_err = std::max(logit_err, std::abs(double(mf.logits()[i]) - md.logits()[i]));
    logit_max = std::max(logit_max, std::abs(md.logits()[i]));
  }
  double gerr = 0, gmax = 0;
  for (size_t i = 0; i < md.num_params(); ++i) {
    gerr = std::max(gerr, std::abs(double(mf.grads()[i]) - md.grads()[i]));
    gmax = std::max(gmax, std::abs(md.grads()[i]));
  }
  std::printf("float vs double: loss rel %.2e, logits %.2e, grads %.2e (normalized max err)\n",
              loss_rel, logit_err / logit_max, gerr / gmax);
  EXPECT_LE(loss_rel, 1e-5);
  EXPECT_LE(logit_err / logit_max, 1e-5);
  EXPECT_LE(gerr / gmax, 1e-4);  // backward through softmax and LayerNorm loses ~1 more digit
}

TEST(GptTest, BitwiseIdenticalForAnyThreadCount) {
  const GPTConfig cfg = MidConfig();
  const int B = 4, T = cfg.seq_len;
  const auto in = RandomTokens(size_t(B) * T, cfg.vocab_size, 21);
  const auto tg = RandomTokens(size_t(B) * T, cfg.vocab_size, 22);
  auto run = [&](int threads, float* loss, std::vector<float>* grads) {
    const int saved = omp_get_max_threads();
    omp_set_num_threads(threads);
    GPT<float> m(cfg, B);
    m.InitParameters(23);
    m.ZeroGrad();
    *loss = m.Forward(in.data(), tg.data(), B, T);
    m.Backward();
    *loss += 0.0f;
    grads->assign(m.grads(), m.grads() + m.num_params());
    omp_set_num_threads(saved);
  };
  float l1, l2;
  std::vector<float> g1, g2;
  run(1, &l1, &g1);
  for (int threads : {2, 3}) {  // 2: the requirement; 3: an odd count, more threads than cores
    run(threads, &l2, &g2);
    // Bits, not values: the contract is bitwise identity.
    EXPECT_EQ(
        0, std::memcmp(&l1, &l2, sizeof(float)))  // NOLINT(bugprone-suspicious-memory-comparison)
        << threads << " threads";
    ASSERT_EQ(g1.size(), g2.size());
    EXPECT_EQ(0, std::memcmp(g1.data(), g2.data(), g1.size() * sizeof(float)))
        << threads << " threads";
  }
}

TEST(GptTest, InitParametersFollowsTheContract) {
  GPTConfig cfg = MidConfig();
  GPT<float> m(cfg, 1);
  m.InitParameters(99);
  for (const ParamTensor& t : ParameterLayout(cfg)) {
    const float* p = m.params() + t.offset;
    double s2 = 0;
    for (size_t i = 0; i < t.numel; ++i) s2 += double(p[i]) * p[i];
    const double rms = std::sqrt(s2 / t.numel);
    switch (t.kind) {
      case ParamKind::kWte:
      case ParamKind::kAttnW:
      case ParamKind::kFcW:
        EXPECT_NEAR(rms, 0.02, 0.002) << t.name;
        break;
      case ParamKind::kAttnProjW:
      case ParamKind::kFcProjW:
        EXPECT_NEAR(rms, 0.02 / std::sqrt(2.0 * cfg.n_layer), 0.001) << t.name;
        break;
      case ParamKind::kWpe:
        EXPECT_NEAR(rms, 0.01, 0.001) << t.name;
        break;
      case ParamKind::kLn1W:
      case ParamKind::kLn2W:
      case ParamKind::kLnfW:
        for (size_t i = 0; i < t.numel; ++i) ASSERT_EQ(p[i], 1.0f) << t.name;
        break;
      default:
        for (size_t i = 0; i < t.numel; ++i) ASSERT_EQ(p[i], 0.0f) << t.name;
    }
  }
  // Each element is a function of (seed, its flat index) only.
  const size_t i = ParamOffset(cfg, ParamKind::kFcW, 1) + 17;
  EXPECT_EQ(m.params()[i], float(0.02 * double(RandomNormal(99, 0, RngPurpose::kInit, i))));
}

TEST(GptTest, ShorterBatchMatchesPrefixAndNoTargets) {
  // Causal: the logits of the first 5 positions of sequence 0 do not depend on later tokens or
  // on the other sequences, and a smaller call than allocated works.
  const GPTConfig cfg = TinyConfig();
  GPT<double> m(cfg, 2);
  m.InitParameters(5);
  Perturb(m, 0.2, 6);
  const auto in = RandomTokens(16, cfg.vocab_size, 7), tg = RandomTokens(16, cfg.vocab_size, 8);
  m.Forward(in.data(), tg.data(), 2, 8);
  const std::vector<double> full(m.logits(), m.logits() + 16 * cfg.vocab_size);
  EXPECT_EQ(m.Forward(in.data(), nullptr, 1, 5), 0.0);
  for (int i = 0; i < 5 * cfg.vocab_size; ++i) EXPECT_NEAR(m.logits()[i], full[i], 1e-12);
  m.Forward(in.data(), tg.data(), 1, 1);  // a single position
  for (int i = 0; i < cfg.vocab_size; ++i) EXPECT_NEAR(m.logits()[i], full[i], 1e-12);
  m.Backward();
  m.Forward(in.data(), nullptr, 1, 5);
  EXPECT_THROW(m.Backward(), std::logic_error);  // the last Forward had no targets
}

TEST(GptTest, RejectsBadArguments) {
  const GPTConfig cfg = TinyConfig();
  GPT<float> m(cfg, 2);
  std::vector<int32_t> tok(24, 1);
  EXPECT_THROW(m.Forward(tok.data(), tok.data(), 3, 8), std::invalid_argument);  // B > max
  EXPECT_THROW(m.Forward(tok.data(), tok.data(), 1, 9), std::invalid_argument);  // T > seq_len
  tok[3] = cfg.vocab_size;
  EXPECT_THROW(m.Forward(tok.data(), tok.data(), 1, 8), std::invalid_argument);  // bad token
  GPTConfig bad = cfg;
  bad.n_head = 3;
  EXPECT_THROW(GPT<float>(bad, 1), std::invalid_argument);
}

// ShardLayout and CopyShard: the shards of every (tp, stage) split partition the whole buffer
// exactly (replicated tensors aside), and copying whole -> shards -> whole is the identity.
TEST(GptTest, ShardsPartitionTheWholeModel) {
  GPTConfig cfg = TinyConfig();
  cfg.n_layer = 3;
  cfg.n_head = 4;
  const size_t n = NumParameters(cfg);
  EXPECT_EQ(ShardLayout(cfg, {}).size(), ParameterLayout(cfg).size());
  std::vector<double> whole(n);
  for (size_t i = 0; i < n; ++i) whole[i] = double(i);
  for (int tp : {1, 2, 4}) {
    for (int pp : {1, 2, 3}) {
      std::vector<double> rebuilt(n, -1.0);
      std::vector<int> hits(n, 0);
      for (int stage = 0; stage < pp; ++stage) {
        const int begin = stage * 3 / pp, end = (stage + 1) * 3 / pp;
        for (int r = 0; r < tp; ++r) {
          const ModelShard shard{r, tp, begin, end};
          ASSERT_EQ(ValidateShard(cfg, shard), "");
          const auto layout = ShardLayout(cfg, shard);
          const size_t local_n = layout.back().offset + layout.back().numel;
          std::vector<double> local(local_n);
          CopyShard(cfg, shard, whole.data(), local.data(), true);
          std::vector<double> back(n, -1.0);
          CopyShard(cfg, shard, back.data(), local.data(), false);
          for (size_t i = 0; i < n; ++i) {
            if (back[i] < 0) continue;
            EXPECT_EQ(back[i], whole[i]);
            rebuilt[i] = back[i];
            ++hits[i];
          }
        }
      }
      EXPECT_EQ(rebuilt, whole) << "tp " << tp << " pp " << pp;
      // Split tensors are held once; wte by the first and the last stage of every tp rank.
      for (const ParamTensor& t : ParameterLayout(cfg)) {
        int expect = ModelShard::SplitByTensorParallel(t.kind) ? 1 : tp;
        if (t.kind == ParamKind::kWte && pp > 1) expect *= 2;
        EXPECT_EQ(hits[t.offset], expect) << t.name << " tp " << tp << " pp " << pp;
      }
    }
  }
  EXPECT_NE(ValidateShard(cfg, {0, 3, 0, -1}), "");  // 4 heads do not split 3 ways
  EXPECT_NE(ValidateShard(cfg, {0, 1, 2, 2}), "");   // empty range
  EXPECT_THROW(GPT<float>(cfg, 1, ModelShard{0, 1, 3, 4}), std::invalid_argument);
}

// Pipeline stages (no tensor parallelism): running the stages one after another, passing
// activations forward and their gradients back, gives the whole model's loss and gradients
// (the same kernels on the same numbers: bitwise).
TEST(GptTest, PipelineStagesMatchTheWholeModel) {
  GPTConfig cfg = TinyConfig();
  cfg.n_layer = 3;
  const int B = 2, T = cfg.seq_len;
  GPT<double> whole(cfg, B);
  whole.InitParameters(5);
  Perturb(whole, 0.3, 9);
  const auto in = RandomTokens(size_t(B) * T, cfg.vocab_size, 4);
  const auto tg = RandomTokens(size_t(B) * T, cfg.vocab_size, 6);
  const double loss = whole.Forward(in.data(), tg.data(), B, T);
  whole.Backward(0.5);

  const int pp = 3;
  std::vector<std::unique_ptr<GPT<double>>> stages;
  for (int s = 0; s < pp; ++s) {
    stages.push_back(std::make_unique<GPT<double>>(cfg, B, ModelShard{0, 1, s, s + 1}, 2));
    CopyShard(cfg, stages[s]->shard(), whole.params(), stages[s]->params(), true);
  }
  // Two micro-batches in flight in different slots; only slot 1 is checked against the whole.
  const auto other = RandomTokens(size_t(B) * T, cfg.vocab_size, 8);
  double stage_loss = 0;
  for (int slot : {1, 0}) {
    const auto& x = slot == 1 ? in : other;
    const double* acts = nullptr;
    for (int s = 0; s < pp; ++s) {
      const double l = stages[s]->ForwardStage(slot, x.data(), acts, tg.data(), B, T);
      if (s == pp - 1 && slot == 1) stage_loss = l;
      acts = s + 1 < pp ? stages[s]->stage_output(slot) : nullptr;
    }
  }
  EXPECT_EQ(stage_loss, loss);
  for (auto& st : stages) st->ZeroGrad();
  const double* dy = nullptr;
  for (int s = pp - 1; s >= 0; --s) {
    stages[s]->BackwardStage(1, dy, 0.5);
    dy = s > 0 ? stages[s]->input_grad() : nullptr;
  }
  std::vector<double> grads(NumParameters(cfg), 0.0);
  for (int s = pp - 1; s >= 0; --s) {  // the last stage's wte gradient, then the first's added
    std::vector<double> part(NumParameters(cfg), 0.0);
    CopyShard(cfg, stages[s]->shard(), part.data(), stages[s]->grads(), false);
    for (size_t i = 0; i < part.size(); ++i) grads[i] += part[i];
  }
  const size_t wte = size_t(cfg.vocab_size) * cfg.n_embd;
  for (size_t i = 0; i < grads.size(); ++i) {
    if (i < wte)  // the tied wte: head and embedding gradients summed in another order
      EXPECT_NEAR(grads[i], whole.grads()[i], 1e-15) << i;
    else
      ASSERT_EQ(grads[i], whole.grads()[i]) << i;
  }
}

// What an op hook changes in a block's output flows on as if the kernel had computed it (gpt.h):
// the next block's ln_1 normalizes the changed residual stream (the forward leaves a block's
// residual add to the next LayerNorm only when no hook may write).
TEST(GptTest, AHookChangingABlockOutputReachesTheNextBlock) {
  const GPTConfig c{.vocab_size = 32, .seq_len = 8, .n_layer = 2, .n_head = 2, .n_embd = 16};
  GPT<float> model(c, 1);
  model.InitParameters(4);
  std::vector<int32_t> tokens(9);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 5 + 1) % 32);
  auto ln1_of_block1 = [&](float change) {
    std::vector<float> ln1;
    model.set_op_hook([&](const GPT<float>::OpEvent& e) {
      if (e.kind == GPT<float>::OpKind::kActivation && e.layer == 0) e.out[0] += change;
      if (e.kind == GPT<float>::OpKind::kGemmForward && e.layer == 1 && e.gemm == 0)
        ln1.assign(e.a, e.a + c.n_embd);  // the first row of ln_1's output
    });
    model.Forward(tokens.data(), tokens.data() + 1, 1, c.seq_len);
    return ln1;
  };
  const auto clean = ln1_of_block1(0.0f), changed = ln1_of_block1(10.0f);
  ASSERT_EQ(clean.size(), size_t(c.n_embd));
  EXPECT_NE(clean, changed);
}

// The block outputs' events are the same, in the same order, whether the forward leaves each
// block's residual add to the next LayerNorm (no hook, or a device reader) or runs it at the
// block's end (a hook that may write): the whole model and each of two pipeline stages.
TEST(GptTest, BlockOutputEventsAreTheSameWhereverTheAddRuns) {
  const GPTConfig c{.vocab_size = 32, .seq_len = 8, .n_layer = 3, .n_head = 2, .n_embd = 16};
  std::vector<int32_t> tokens(9);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int32_t((i * 7 + 3) % 32);
  const int N = c.seq_len;
  for (const ModelShard shard :
       {ModelShard{}, ModelShard{.layer_begin = 0, .layer_end = 2}, ModelShard{.layer_begin = 2}}) {
    SCOPED_TRACE(testing::Message() << "layers " << shard.layer_begin << ".." << shard.end(c));
    GPT<float> model(c, 1, shard);
    model.InitParameters(6);
    const std::vector<float> input(size_t(N) * c.n_embd, 0.25f);  // a later stage's input
    auto events = [&](bool device_reader) {
      std::vector<std::pair<int, std::vector<float>>> seen;
      model.set_op_hook(
          [&](const GPT<float>::OpEvent& e) {
            if (e.kind == GPT<float>::OpKind::kActivation)
              seen.emplace_back(e.layer, std::vector<float>(e.out, e.out + e.n));
          },
          device_reader);
      model.ForwardStage(0, tokens.data(), input.data(), tokens.data() + 1, 1, c.seq_len);
      return seen;
    };
    const auto deferred = events(true), at_end = events(false);
    ASSERT_FALSE(deferred.empty());
    EXPECT_EQ(deferred, at_end);
    for (size_t k = 1; k < deferred.size(); ++k)
      EXPECT_EQ(deferred[k].first, deferred[k - 1].first + 1);
  }
}

}  // namespace
}  // namespace atl
