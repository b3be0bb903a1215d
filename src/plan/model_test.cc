// Each formula of the data-movement model against values computed by hand (and, where the
// reference published them, against its logs: logs/1f1b_dense_batch_size_comparison.txt of
// github ege-erdil/limits_to_distributed_training).
#include <gtest/gtest.h>

#include <cmath>
#include <utility>
#include <vector>

#include "plan/hardware.h"
#include "plan/matmul.h"
#include "plan/shape.h"
#include "plan/step.h"

namespace atl::plan {
namespace {

TEST(Shape, RoundToSmoothPicksNearestFTimesPowerOfTwo) {
  EXPECT_EQ(RoundToSmooth(197.8), 192);  // 3 x 64, nearer than 224 = 7 x 32
  EXPECT_EQ(RoundToSmooth(3416), 3584);  // 7 x 512
  EXPECT_EQ(RoundToSmooth(1), 1);
  EXPECT_EQ(RoundToSmooth(0.2), 1);
  EXPECT_EQ(RoundToSmooth(10), 10);  // 5 x 2
  EXPECT_EQ(RoundToSmooth(11), 10);  // tie between 10 and 12 goes to the smaller
  EXPECT_EQ(RoundToSmooth(11.5), 12);
}

TEST(Shape, MatchesTheReferenceLogAtDModel12288) {
  // Reference log: "d_model: 1.23e+04 Params: 2.32e+11 Layers: 192 ... Training: 6.45e+24 FLOP"
  // with batch 7.34e6 tokens (default rule) and 3.77e7 tokens (DeepSeek rule).
  ShapeRules rules;
  ModelShape s = ShapeForWidth(12288, rules);
  EXPECT_EQ(s.d_ff, 49152);
  // L = 0.10056 (12288 x 49152)^0.3751 = 197.8 -> 192.
  EXPECT_EQ(s.layers, 192);
  EXPECT_EQ(s.experts, 1);
  EXPECT_DOUBLE_EQ(s.params, 2.0 * 12288 * 49152 * 192);
  EXPECT_DOUBLE_EQ(s.tokens, 20 * s.params);
  EXPECT_DOUBLE_EQ(s.compute, 6 * s.params * s.tokens);
  EXPECT_NEAR(s.compute, 6.45e24, 0.01e24);
  // (6.45e24 / 3e23)^(1/6) x 2048 = 3416 sequences -> 3584.
  EXPECT_EQ(s.batch_sequences, 3584);
  EXPECT_EQ(s.batch_tokens(), 3584 * 2048);
  rules.batch = BatchRule::kDeepSeek;  // 0.292 C^0.3271 / 2048 = 18594 -> 18432
  EXPECT_EQ(ShapeForWidth(12288, rules).batch_sequences, 18432);
  rules.batch = BatchRule::kFixed;
  EXPECT_EQ(ShapeForWidth(12288, rules).batch_sequences, 2048);
}

TEST(Shape, SparsityRule) {
  // E = 8 sqrt(d_model d_ff / (4 x 12288^2)): 8 at the reference width, x2 at twice the width.
  EXPECT_EQ(SparsityFor(12288, 4 * 12288), 8);
  EXPECT_EQ(SparsityFor(24576, 4 * 24576), 16);
  ShapeRules rules;
  rules.sparse = true;
  ModelShape s = ShapeForWidth(12288, rules);
  EXPECT_EQ(s.experts, 8);
  EXPECT_DOUBLE_EQ(s.active_params, s.params / 8);
  EXPECT_DOUBLE_EQ(s.compute, 6 * s.active_params * s.tokens);
  // Reference log for this width, sparse: "Params: 1.86e+12 ... Training: 5.16e+25 FLOP".
  EXPECT_NEAR(s.params, 1.86e12, 0.01e12);
  EXPECT_NEAR(s.compute, 5.16e25, 0.01e25);
}

TEST(Shape, ShapeForParamsAndGrid) {
  ShapeRules rules;
  ModelShape s = *ShapeForParams(1e14, rules);
  EXPECT_EQ(s.d_model % 1024, 0);
  EXPECT_NEAR(s.params / 1e14, 1.0, 0.02);
  EXPECT_FALSE(ShapeForParams(10, rules).ok());
  std::vector<int64_t> g = WidthGrid(12288, 32768);
  // f x 2^i, f odd <= 15: eight widths per octave, 12288 = 3 x 4096, 13312 = 13 x 1024, ...,
  // then steps of 2048 from 16384 up to 32768.
  ASSERT_EQ(g.front(), 12288);
  ASSERT_EQ(g[1], 13312);
  EXPECT_EQ(g[5], 18432);
  EXPECT_EQ(g.back(), 32768);
  EXPECT_EQ(g.size(), 13u);
}

TEST(Matmul, ArithmeticBoundForAWellShapedTile) {
  Gpu h100 = *FindGpu("H100");
  // 2048 x 2048 weights by 4096 tokens: 3.4e10 FLOP at 989.4 x 0.7 TFLOP/s = 49.6 us, above
  // the HBM (10 us), L2 (10 us) and shared-memory (48 us) times; plus 4.5 us of latency.
  double flop = 2.0 * 2048.0 * 2048.0 * 4096.0;
  double expect = flop / (h100.peak_flops * 0.7) + 4.5e-6;
  EXPECT_NEAR(MatmulSeconds(h100, 2048, 2048, 4096), expect, expect * 1e-12);
  // Very large tiles come close to the shared-memory bound (75% of a 64 KiB register file per
  // processing block) but, with the activations multicast between SMs, stay arithmetic-bound.
  MatmulTraffic big = MatmulBytes(h100, 8192, 8192, 8192, false);
  EXPECT_GT(big.shared_bytes / h100.shared_bandwidth(), 0.9 * big.flop / h100.flop_per_s());
  EXPECT_LT(big.shared_bytes / h100.shared_bandwidth(), big.flop / h100.flop_per_s());
  // Padding to 8 x 8 x 8 tensor-core tiles: b = 1 costs as much arithmetic as b = 8.
  EXPECT_DOUBLE_EQ(MatmulBytes(h100, 8192, 8192, 1, false).flop,
                   MatmulBytes(h100, 8192, 8192, 8, false).flop);
  EXPECT_DOUBLE_EQ(MatmulBytes(h100, 8192, 8192, 9, false).flop,
                   MatmulBytes(h100, 8192, 8192, 16, false).flop);
}

// Seconds from the reference's own GPU.matmul_time_seconds (gpu/gpu_model.py at b1f771c),
// printed by its Python for these shapes: a Hopper shard whose small DSMEM tiles multicast the
// activations (18 x 18 of them), its weight-gradient twin, tiny and unaligned shapes, and the
// same on an A100 (no distributed shared memory).
TEST(Matmul, AgreesWithTheReferenceGpuModel) {
  struct Case {
    const char* gpu;
    double d1, d2, b;
    bool weight_grads;
    double seconds;
  };
  const Case cases[] = {
      {"H100", 2816, 11264, 2048, false, 0.00019208678116055167},
      {"H100", 11264, 2816, 2048, true, 0.00019208678116055167},
      {"H100", 8192, 8192, 1, false, 4.6204919937872576e-05},
      {"H100", 1000, 3000, 7, false, 4.5693039883613655e-06},
      {"H100", 8192, 8192, 16, true, 8.821428754514273e-05},
      {"A100", 2816, 11264, 2048, false, 0.0004946099213523076},
      {"A100", 8192, 8192, 1, false, 9.087379499243092e-05},
      {"A100", 1000, 3000, 7, false, 4.6810712464654895e-06},
      {"A100", 8192, 8192, 16, true, 0.000177881221612725},
  };
  for (const Case& c : cases) {
    const Gpu g = *FindGpu(c.gpu);
    EXPECT_NEAR(MatmulSeconds(g, c.d1, c.d2, c.b, c.weight_grads), c.seconds, c.seconds * 1e-12)
        << c.gpu << " " << c.d1 << " x " << c.d2 << " x " << c.b << (c.weight_grads ? " dW" : "");
  }
}

TEST(Matmul, MemoryBoundWithFewTokens) {
  Gpu h100 = *FindGpu("H100");
  // 8192 x 8192 weights (128 MiB) do not fit 75% of the 50 MiB L2: they stream from HBM once.
  // L2 tiles: ceil(128 MiB / 37.5 MiB) = 4 tiles of 4096 x 4096 -> 2 rows, 2 columns.
  // HBM bytes = weights 134217728 + 2 rows x X (8192 x 16 x 2 = 262144)
  //           + (2 x 2 columns - 1) x Y (262144) = 135528448.
  MatmulTraffic t = MatmulBytes(h100, 8192, 8192, 16, false);
  EXPECT_DOUBLE_EQ(t.hbm_bytes, 135528448.0);
  double s = MatmulSeconds(h100, 8192, 8192, 16);
  double hbm = t.hbm_bytes / h100.hbm_bandwidth;
  double l2 = t.l2_bytes / h100.l2_bandwidth;
  double smem = t.shared_bytes / h100.shared_bandwidth();
  double arith = t.flop / h100.flop_per_s();
  EXPECT_DOUBLE_EQ(s, std::max(std::max(hbm, l2), std::max(smem, arith)) + 4.5e-6);
  EXPECT_GT(s - 4.5e-6, 10 * arith);  // far from arithmetic-bound
  // Weight gradients read and write the accumulator: twice the weight traffic.
  EXPECT_GT(MatmulBytes(h100, 8192, 8192, 16, true).hbm_bytes, 2 * 134217728.0);
}

TEST(Comm, AllReduceAndPointToPoint) {
  NetworkLevel l{"IB", 0, 1e11, 2e-6};
  // 2 (p-1) W s r bytes / (N BW / 2) = 2 x 7 x 1e9 x 2 / (1024 x 5e10) = 5.46875e-4 s.
  CommTime c = AllReduceTime(l, 2.0, 8, 1e9, 1024, 1, 1);
  EXPECT_DOUBLE_EQ(c.bandwidth_s, 5.46875e-4);
  EXPECT_DOUBLE_EQ(c.latency_s, 4e-6);  // 2 lambda
  EXPECT_DOUBLE_EQ(AllReduceTime(l, 2.0, 1, 1e9, 1024, 1, 1).bandwidth_s, 0.0);
  l.ring_latency = true;  // 2 (p - 1) lambda
  EXPECT_DOUBLE_EQ(AllReduceTime(l, 2.0, 8, 1e9, 1024, 3, 1).latency_s, 14 * 3 * 2e-6);
  CommTime p = PointToPointTime(l, 2.0, 1000, 10, 4, 5);  // 1000 x 4 x 5 x 2 / (10 x 5e10)
  EXPECT_DOUBLE_EQ(p.bandwidth_s, 8e-8);
  EXPECT_DOUBLE_EQ(p.latency_s, 8e-6);
}

Layout Flat(int64_t dp, int64_t tpm, int64_t tpf, int64_t pp, int64_t ep, int64_t m, int64_t v) {
  Layout l;
  l.dp = {dp};
  l.tp_model = {tpm};
  l.tp_ff = {tpf};
  l.pp = {pp};
  l.ep = {ep};
  l.microbatches = m;
  l.interleave = v;
  return l;
}

TEST(Step, BubbleOfInterleaved1F1B) {
  Hardware hw = *MakeHardware("H100", "global-nvlink");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(12288, ShapeRules{});
  // PP 4, m 4, v 1: (PP - 1) / (PP + m - 1) = 3/7.
  EXPECT_DOUBLE_EQ(EvaluateStep(hw.gpu, topo, s, Flat(1, 1, 1, 4, 1, 4, 1), {}).bubble, 3.0 / 7);
  // PP 4, m 2, v 2: z = (v-1) max(0, PP - m) = 2; (z + PP - 1)/(PP + v m + z - 1) = 5/9.
  EXPECT_DOUBLE_EQ(EvaluateStep(hw.gpu, topo, s, Flat(1, 1, 1, 4, 1, 2, 2), {}).bubble, 5.0 / 9);
  Layout zb = Flat(1, 1, 1, 4, 1, 8, 1);
  zb.zero_bubble = true;
  EXPECT_DOUBLE_EQ(EvaluateStep(hw.gpu, topo, s, zb, {}).bubble, 0.0);
}

TEST(Step, SingleGpuIsMatmulsOnly) {
  Hardware hw = *MakeHardware("H100", "default");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(2048, ShapeRules{});
  Layout l;
  for (auto* v : {&l.dp, &l.tp_model, &l.tp_ff, &l.pp, &l.ep}) *v = {1, 1};
  StepTime t = EvaluateStep(hw.gpu, topo, s, l, {});
  double b = static_cast<double>(s.batch_tokens());
  double pair =
      MatmulSeconds(hw.gpu, s.d_ff, s.d_model, b) + MatmulSeconds(hw.gpu, s.d_model, s.d_ff, b);
  EXPECT_DOUBLE_EQ(t.matmul_s, 3.0 * s.layers * pair);
  EXPECT_DOUBLE_EQ(t.comm_s(), 0.0);
  EXPECT_DOUBLE_EQ(t.latency_s(), 0.0);
  EXPECT_DOUBLE_EQ(t.step_s, t.matmul_s);
  EXPECT_DOUBLE_EQ(t.ideal_s, 6.0 * s.params * b / hw.gpu.peak_flops);
  EXPECT_DOUBLE_EQ(t.utilization, t.ideal_s / t.step_s);
  EXPECT_LE(t.utilization, hw.gpu.effective_utilization);
}

// A layout on a site's two levels (NVLink, InfiniBand): each degree as {inside a node, across}.
using Split = std::vector<int64_t>;
Layout TwoLevels(Split dp, Split tp_model, Split tp_ff, Split pp, int64_t microbatches = 1,
                 int64_t interleave = 1) {
  Layout l;
  l.dp = std::move(dp);
  l.tp_model = std::move(tp_model);
  l.tp_ff = std::move(tp_ff);
  l.pp = std::move(pp);
  l.ep = {1, 1};
  l.microbatches = microbatches;
  l.interleave = interleave;
  return l;
}

TEST(Step, DataAndTensorParallelTerms) {
  Hardware hw = *MakeHardware("H100", "default");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(4096, ShapeRules{});
  Layout l = TwoLevels({1, 4}, {2, 1}, {4, 1}, {1, 1});
  EvalOptions no_overlap{false, false, false};
  StepTime t = EvaluateStep(hw.gpu, topo, s, l, no_overlap);
  const double n = 32, w = 2, b = static_cast<double>(s.batch_tokens());
  // DP: 4 ranks on InfiniBand: 2 x 3 x N_params x 2 bytes / (32 x 1e11 / 2).
  EXPECT_DOUBLE_EQ(t.dp_s, 2 * 3 * s.params * w / (n * 1e11 / 2));
  // TP on NVLink: over 2 TP_model ranks d_ff words, over 4 TP_ff ranks d_model words, each 2L
  // times per step for every token.
  double tp = 2 * 1 * s.d_ff * 2 * s.layers * b * w / (n * 9e11 / 2) +
              2 * 3 * s.d_model * 2 * s.layers * b * w / (n * 9e11 / 2);
  EXPECT_NEAR(t.tp_s, tp, tp * 1e-12);
  EXPECT_DOUBLE_EQ(t.tp_latency_s, 2 * (2 * s.layers * 2 * 1.125e-6));
  EXPECT_DOUBLE_EQ(t.dp_latency_s, 2 * 1.125e-6);
  EXPECT_NEAR(t.step_s, t.latency_s() + t.matmul_s + t.tp_s + t.dp_s + t.pp_s, 1e-12);
  // Overlapped: bandwidth hides behind matmuls up to the larger of the two.
  StepTime o = EvaluateStep(hw.gpu, topo, s, l, EvalOptions{});
  EXPECT_DOUBLE_EQ(o.step_s, o.latency_s() + std::max(o.matmul_s, o.tp_s + o.dp_s + o.pp_s));
}

// The reference notebook's combination (training_results): the levels' bandwidth times overlap
// (the largest counts), DP stays outside the pipeline and its bubble, and the pipeline latencies
// are dropped under the zero-bubble schedule.
TEST(Step, ReferenceCombination) {
  Hardware hw = *MakeHardware("H100", "default");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(4096, ShapeRules{});
  // DP on both levels: atoll adds their times, the reference takes the larger.
  Layout l = TwoLevels({2, 4}, {2, 1}, {2, 1}, {1, 2}, /*microbatches=*/4);
  EvalOptions atoll{false, false, false};
  EvalOptions ref = atoll;
  ref.combine = Combine::kReference;
  const StepTime a = EvaluateStep(hw.gpu, topo, s, l, atoll);
  const StepTime r = EvaluateStep(hw.gpu, topo, s, l, ref);
  const double n = 64, w = 2;
  const double dp0 = 2 * 1 * s.params * 4 * w / (n * 9e11 / 2);  // 2 ranks on NVLink, 4 in parallel
  const double dp1 = 2 * 3 * s.params * w / (n * 1e11 / 2);      // 4 on InfiniBand
  EXPECT_NEAR(a.dp_s, dp0 + dp1, 1e-12 * (dp0 + dp1));
  EXPECT_NEAR(r.dp_s, std::max(dp0, dp1), 1e-12 * dp1);
  EXPECT_DOUBLE_EQ(r.tp_s, a.tp_s);  // TP on one level: the same
  // Matmuls: the reference costs the weight-gradient pair with its gradient traffic.
  EXPECT_DOUBLE_EQ(a.matmul_s, 3.0 * s.layers / 2 * 4 * MatmulPairSeconds(hw.gpu, s, l));
  EXPECT_DOUBLE_EQ(r.matmul_s, 3.0 * s.layers / 2 * 4 * MatmulPairSeconds(hw.gpu, s, l, true));
  // They differ where the matmuls are memory-bound: few tokens a microbatch.
  Layout thin = l;
  thin.dp = {2, 512};
  thin.microbatches = 64;
  ASSERT_LE(MicrobatchTokens(s, thin), 128);
  EXPECT_GT(MatmulPairSeconds(hw.gpu, s, thin, true), 1.05 * MatmulPairSeconds(hw.gpu, s, thin));
  ASSERT_GT(r.bubble, 0);
  // Nothing overlapped: pipeline = (matmuls + TP + PP) / (1 - bubble) + TP and PP latencies; then
  // + DP + its latency.
  const double pipeline =
      (r.matmul_s + r.tp_s + r.pp_s) / (1 - r.bubble) + r.tp_latency_s + r.pp_latency_s;
  EXPECT_NEAR(r.step_s, pipeline + r.dp_s + r.dp_latency_s, 1e-12 * r.step_s);
  // DP overlapped: it hides behind the whole pipeline, bubble included.
  ref.overlap_dp = true;
  const StepTime o = EvaluateStep(hw.gpu, topo, s, l, ref);
  EXPECT_NEAR(o.step_s, std::max(pipeline, o.dp_s) + o.dp_latency_s, 1e-12 * o.step_s);
  // Zero bubble: no bubble, and (as in the reference) no pipeline latency either.
  Layout zb = l;
  zb.zero_bubble = true;
  ref.overlap_dp = false;
  const StepTime z = EvaluateStep(hw.gpu, topo, s, zb, ref);
  EXPECT_NEAR(z.step_s, z.matmul_s + z.tp_s + z.pp_s + z.dp_s + z.dp_latency_s, 1e-12 * z.step_s);
}

// Pipeline sends cross the levels the pipeline spans and no other (reference: p2p_comm_cost): 8
// interleaved stages inside an NVLink node send nothing over InfiniBand, wrap-arounds included;
// spread over both levels, the outer one carries its PP v - 1 boundaries, the inner the rest.
TEST(Step, PipelineSendsStayOnTheLevelsThePipelineSpans) {
  Hardware hw = *MakeHardware("H100", "default");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(4096, ShapeRules{});
  const double w = hw.gpu.bytes_per_word(), b = static_cast<double>(s.batch_tokens());
  Layout l = TwoLevels({1, 4}, {1, 1}, {1, 1}, {8, 1}, /*microbatches=*/8, /*interleave=*/2);
  const double n = 32, d = static_cast<double>(s.d_model);
  StepTime t = EvaluateStep(hw.gpu, topo, s, l, EvalOptions{});
  const CommTime inner = PointToPointTime(topo.levels[0], w, d, n, 2 * (8 * 2 - 1), b);
  EXPECT_DOUBLE_EQ(t.pp_s, inner.bandwidth_s);
  EXPECT_DOUBLE_EQ(t.pp_latency_s, inner.latency_s);
  l.pp = {2, 4};
  l.dp = {4, 1};
  t = EvaluateStep(hw.gpu, topo, s, l, EvalOptions{});
  const double pp_s =
      PointToPointTime(topo.levels[0], w, d, n, 2.0 * 2 * 4 * (2 - 1), b).bandwidth_s +
      PointToPointTime(topo.levels[1], w, d, n, 2 * (4 * 2 - 1), b).bandwidth_s;
  EXPECT_NEAR(t.pp_s, pp_s, 1e-12 * pp_s);
}

TEST(Step, MemoryCheck) {
  Hardware hw = *MakeHardware("H100", "default");
  Topology topo = SiteTopology(hw);
  ModelShape s = ShapeForWidth(16384, ShapeRules{});  // 550B params: 1.1 TB of weights
  Layout one = Flat(1, 1, 1, 1, 1, 1, 1);
  EXPECT_FALSE(FitsInMemory(hw.gpu, topo, s, one));
  // Weights (2 bytes) + 4 words of optimizer state (8 bytes) = 10 bytes per parameter.
  Layout many = Flat(1, 8, 8, 1, 1, 1, 1);  // 64 GPUs x 80 GB = 5.12 TB < 5.5 TB
  EXPECT_FALSE(FitsInMemory(hw.gpu, topo, s, many));
  Layout more = Flat(1, 8, 16, 1, 1, 1, 1);  // 128 x 80 GB = 10.2 TB
  EXPECT_TRUE(FitsInMemory(hw.gpu, topo, s, more));
}

}  // namespace
}  // namespace atl::plan
