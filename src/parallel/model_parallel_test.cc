// Tensor and pipeline parallel GPT shards over the in-process backend against the whole model
// (double precision): the loss and every gradient (reassembled with CopyShard) agree to rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <mutex>
#include <random>
#include <span>
#include <stdexcept>
#include <vector>

#include "comm/inprocess.h"
#include "model/gpt.h"
#include "parallel/mesh.h"
#include "parallel/pipeline.h"

namespace atl {
namespace {

GPTConfig Config() {
  GPTConfig c;
  c.n_layer = 4;
  c.n_head = 4;
  c.n_embd = 16;
  c.vocab_size = 47;  // uneven vocabulary shares: 24 + 23, 12 + 12 + 12 + 11
  c.seq_len = 8;
  return c;
}

std::vector<int32_t> Tokens(size_t n, int vocab, uint32_t seed) {
  std::mt19937 gen(seed);
  std::vector<int32_t> t(n);
  for (int32_t& x : t) x = int32_t(gen() % uint32_t(vocab));
  return t;
}

struct Reference {
  std::vector<double> params, grads;
  double loss = 0;
};

// The whole model, perturbed away from GPT-2's near-linear init, one forward and backward.
Reference Whole(const GPTConfig& cfg, const std::vector<int32_t>& in,
                const std::vector<int32_t>& tg, int B) {
  GPT<double> m(cfg, B);
  m.InitParameters(3);
  std::mt19937 gen(11);
  std::normal_distribution<double> d(0.0, 0.2);
  for (size_t i = 0; i < m.num_params(); ++i) m.params()[i] += d(gen);
  Reference r;
  r.params.assign(m.params(), m.params() + m.num_params());
  r.loss = m.Forward(in.data(), tg.data(), B, cfg.seq_len);
  m.Backward();
  r.grads.assign(m.grads(), m.grads() + m.num_params());
  return r;
}

void CheckLayout(int tp, int pp) {
  const GPTConfig cfg = Config();
  const int B = 2, T = cfg.seq_len;
  const auto in = Tokens(size_t(B) * T, cfg.vocab_size, 1);
  const auto tg = Tokens(size_t(B) * T, cfg.vocab_size, 2);
  const Reference ref = Whole(cfg, in, tg, B);
  std::mutex mu;
  std::vector<double> grads(ref.grads.size(), 0.0);
  std::vector<int> seen(ref.grads.size(), 0);
  double loss = NAN;
  const auto statuses = RunInProcessRanks(tp * pp, [&](Communicator& world) -> Status {
    ATOLL_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Make(&world, 1, tp, pp));
    const LayerRange layers = StageLayers(cfg.n_layer, pp, mesh.pp_rank());
    const ModelShard shard{mesh.tp_rank(), tp, layers.begin, layers.end};
    GPT<double> m(cfg, B, shard);
    std::vector<double> whole = ref.params;
    CopyShard(cfg, shard, whole.data(), m.params(), true);
    if (Communicator* g = mesh.tp_group())
      m.set_tensor_parallel([g](double* d, size_t n) {
        Status s = g->AllReduce(std::span<double>(d, n));
        if (!s.ok()) throw std::runtime_error(s.ToString());
      });
    const size_t acts = size_t(B) * T * cfg.n_embd;
    std::vector<double> buf(acts);
    Communicator* p = mesh.pp_group();
    if (!mesh.first_stage())
      ATOLL_RETURN_IF_ERROR(p->Recv(std::span<double>(buf), mesh.pp_rank() - 1, 0));
    const double l = m.ForwardStage(0, in.data(), buf.data(), tg.data(), B, T);
    if (!mesh.last_stage())
      ATOLL_RETURN_IF_ERROR(
          p->Send(std::span<const double>(m.stage_output(0), acts), mesh.pp_rank() + 1, 0));
    if (!mesh.last_stage())
      ATOLL_RETURN_IF_ERROR(p->Recv(std::span<double>(buf), mesh.pp_rank() + 1, 1));
    m.BackwardStage(0, buf.data(), 1.0);
    if (!mesh.first_stage())
      ATOLL_RETURN_IF_ERROR(
          p->Send(std::span<const double>(m.input_grad(), acts), mesh.pp_rank() - 1, 1));
    // The tied wte: embedding plus head gradients, as the trainer sums them.
    if (Communicator* e = mesh.embed_group())
      ATOLL_RETURN_IF_ERROR(e->AllReduce(std::span<double>(m.grads(), m.layout().front().numel)));
    std::vector<double> part(ref.grads.size(), NAN);
    CopyShard(cfg, shard, part.data(), m.grads(), false);
    std::lock_guard<std::mutex> lock(mu);
    if (mesh.last_stage() && mesh.tp_rank() == 0) loss = l;
    for (size_t i = 0; i < part.size(); ++i) {
      if (std::isnan(part[i])) continue;
      if (seen[i]++ == 0) {
        grads[i] = part[i];
      } else if (part[i] != grads[i]) {  // replicas must agree bitwise
        return Status::Internal("replicated gradient differs at " + std::to_string(i));
      }
    }
    return Status::Ok();
  });
  for (const Status& s : statuses) ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_NEAR(loss, ref.loss, 1e-13 * std::abs(ref.loss)) << "tp " << tp << " pp " << pp;
  double worst = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    ASSERT_GT(seen[i], 0) << i;
    worst =
        std::max(worst, std::abs(grads[i] - ref.grads[i]) / std::max(std::abs(ref.grads[i]), 1e-3));
  }
  EXPECT_LT(worst, 1e-11) << "tp " << tp << " pp " << pp;
}

TEST(ModelParallelTest, TensorParallelMatchesWholeModel) {
  CheckLayout(2, 1);
  CheckLayout(4, 1);
}

TEST(ModelParallelTest, PipelineMatchesWholeModel) {
  CheckLayout(1, 2);
  CheckLayout(1, 3);
}

TEST(ModelParallelTest, TensorAndPipelineMatchWholeModel) { CheckLayout(2, 2); }

}  // namespace
}  // namespace atl
