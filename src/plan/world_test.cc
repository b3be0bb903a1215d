// The world of datacenters: with one datacenter it is exactly the single-site model; WAN terms
// against hand-computed values; DiLoCo, compression and streaming; and the scaling tables.
#include "plan/world.h"

#include <gtest/gtest.h>

#include "plan/scaling.h"
#include "plan/units.h"

namespace atl::plan {
namespace {

WorldSettings Base(double params, int64_t dcs) {
  WorldSettings s;
  s.hardware = *MakeHardware("H100", "default");
  s.params = params;
  s.datacenters = dcs;
  return s;
}

void ExpectSameStep(const StepTime& a, const StepTime& b) {
  EXPECT_EQ(a.step_s, b.step_s);
  EXPECT_EQ(a.matmul_s, b.matmul_s);
  EXPECT_EQ(a.tp_s, b.tp_s);
  EXPECT_EQ(a.dp_s, b.dp_s);
  EXPECT_EQ(a.pp_s, b.pp_s);
  EXPECT_EQ(a.latency_s(), b.latency_s());
  EXPECT_EQ(a.bubble, b.bubble);
  EXPECT_EQ(a.utilization, b.utilization);
}

TEST(World, OneDatacenterIsExactlyTheSingleSiteModel) {
  for (double params : {5e11, 3e12, 2e13}) {
    for (WorldStrategy strategy : {WorldStrategy::kSync, WorldStrategy::kDiLoCo}) {
      WorldSettings s = Base(params, 1);
      s.strategy = strategy;
      s.wan_bits = 4;  // irrelevant with one site
      auto w = RunWorld(s);
      ASSERT_TRUE(w.ok()) << w.status().ToString();
      ModelShape shape = *ShapeForParams(params, s.rules);
      EXPECT_EQ(w->shape.batch_tokens(), shape.batch_tokens());
      auto single = SmallestCluster(s.hardware.gpu, SiteTopology(s.hardware), shape,
                                    s.months * kSecondsPerMonth, {}, s.search);
      ASSERT_TRUE(single.has_value());
      EXPECT_EQ(w->gpus_per_dc, single->layout.Gpus());
      EXPECT_EQ(w->plan.layout.DP(), single->layout.DP());
      EXPECT_EQ(w->plan.layout.TP(), single->layout.TP());
      EXPECT_EQ(w->plan.layout.PP(), single->layout.PP());
      EXPECT_EQ(w->plan.layout.microbatches, single->layout.microbatches);
      ExpectSameStep(w->plan.step, single->step);
      EXPECT_EQ(w->step_s, single->step.step_s);
      EXPECT_EQ(w->train_s, single->train_s);
      EXPECT_EQ(w->utilization, single->step.utilization);
      EXPECT_EQ(w->single_dc_utilization, w->utilization);
      EXPECT_EQ(w->wan_bytes_per_step, 0.0);
      EXPECT_EQ(w->exchange_s, 0.0);
      EXPECT_TRUE(w->finishes);
    }
  }
}

TEST(World, WanExchangeFormula) {
  WorldSettings s = Base(1e12, 4);
  s.wan_bits_per_s = 400e9;
  s.wan_latency_s = 0.02;
  // 2 (D-1)/D x N x 2 bytes / 50 GB/s + 2 (D-1) x 20 ms = 1.5 x 2e12 / 5e10 + 0.12 = 60.12 s.
  EXPECT_NEAR(WanExchangeSeconds(s, 1e12), 60.12, 1e-9);
  s.wan_bits = 4;  // a quarter of the bytes
  EXPECT_NEAR(WanExchangeSeconds(s, 1e12), 15.12, 1e-9);
  Topology t = WorldTopology(s, 1024);
  ASSERT_EQ(t.levels.size(), 3u);
  EXPECT_EQ(t.site_levels, 2u);
  EXPECT_DOUBLE_EQ(t.levels[2].bandwidth, 2 * 50e9 / 1024);
  EXPECT_TRUE(t.levels[2].ring_latency);
}

TEST(World, SyncWanTermIsTheRingAllReduce) {
  WorldSettings s = Base(2e12, 8);
  s.gpus_per_dc = 4096;
  s.wan_bits_per_s = 1.6e12;
  auto w = RunWorld(s);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  const double bytes = 2.0 * 7 / 8 * w->shape.params * 2;
  EXPECT_NEAR(w->plan.step.wan_s, bytes / 200e9, 1e-9 * bytes / 200e9);
  EXPECT_NEAR(w->plan.step.wan_latency_s, 14 * 0.02, 1e-12);
  EXPECT_DOUBLE_EQ(w->wan_bytes_per_step, bytes);
  EXPECT_EQ(w->plan.layout.dp.back(), 8);  // DP spans the sites, nothing else does
  EXPECT_EQ(w->plan.layout.tp_model.back() * w->plan.layout.tp_ff.back() * w->plan.layout.pp.back(),
            1);
  EXPECT_LE(w->utilization, w->single_dc_utilization);
}

TEST(World, DiLoCoAmortizesAndStreamingHides) {
  WorldSettings s = Base(2e12, 8);
  s.gpus_per_dc = 4096;
  s.strategy = WorldStrategy::kDiLoCo;
  s.inner_steps = 50;
  auto w = RunWorld(s);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  EXPECT_DOUBLE_EQ(w->plan.step.wan_s, 0.0);  // nothing crosses the WAN per inner step
  EXPECT_NEAR(w->exchange_exposed_s, w->exchange_s / 50, 1e-12);
  EXPECT_DOUBLE_EQ(w->step_s, w->plan.step.step_s + w->exchange_s / 50);
  EXPECT_DOUBLE_EQ(w->wan_bytes_per_step, 2.0 * 7 / 8 * w->shape.params * 2 / 50);
  // Streaming hides the exchange once H inner steps take longer than it.
  s.streaming = true;
  s.inner_steps = 100000;
  auto st = RunWorld(s);
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->exchange_exposed_s, 0.0);
  EXPECT_DOUBLE_EQ(st->utilization, st->plan.step.utilization);
}

TEST(World, RequiredBandwidthKeepsUtilizationWithinFivePercent) {
  WorldSettings s = Base(1e12, 4);
  s.gpus_per_dc = 8192;
  s.wan_latency_s = 0.001;
  auto w = RunWorld(s);
  ASSERT_TRUE(w.ok()) << w.status().ToString();
  ASSERT_TRUE(w->required_wan_bits_per_s.has_value()) << w->note;
  WorldSettings at = s;
  at.wan_bits_per_s = *w->required_wan_bits_per_s * 1.001;
  auto ok = RunWorld(at);
  ASSERT_TRUE(ok.ok());
  EXPECT_GE(ok->utilization, 0.95 * ok->single_dc_utilization * (1 - 1e-6));
  at.wan_bits_per_s = *w->required_wan_bits_per_s * 0.8;
  auto slow = RunWorld(at);
  EXPECT_LT(slow->utilization, 0.95 * slow->single_dc_utilization);
  // Sync over 20 sites with 20 ms links: 2 x 19 x 20 ms of latency per step cannot be bought
  // back with bandwidth.
  WorldSettings far = Base(1e12, 20);
  far.gpus_per_dc = 2048;
  auto f = RunWorld(far);
  ASSERT_TRUE(f.ok());
  EXPECT_FALSE(f->required_wan_bits_per_s.has_value());
  EXPECT_NE(f->note.find("latency"), std::string::npos);
}

TEST(World, HundredTrillionOverTwentyDatacenters) {
  WorldSettings s = Base(1e14, 20);
  s.wan_bits_per_s = 400e9;
  s.wan_latency_s = 0.02;
  auto sync = RunWorld(s);
  ASSERT_TRUE(sync.ok()) << sync.status().ToString();
  EXPECT_FALSE(sync->finishes);  // a 2 x 200 TB exchange per step over 400 Gbps
  EXPECT_GT(sync->plan.step.wan_s, 3600);
  s.strategy = WorldStrategy::kDiLoCo;
  s.inner_steps = 1000;
  s.wan_bits = 4;
  s.streaming = true;
  auto diloco = RunWorld(s);
  ASSERT_TRUE(diloco.ok());
  EXPECT_GT(diloco->utilization, 10 * sync->utilization);
  ASSERT_TRUE(diloco->required_wan_bits_per_s.has_value());
  EXPECT_GT(*diloco->required_wan_bits_per_s, 400e9);
  EXPECT_EQ(diloco->shape.batch_sequences % 20, 0);
  EXPECT_NE(WorldReport(*diloco, s).find("WAN bandwidth needed"), std::string::npos);
  EXPECT_TRUE(WorldJson(*diloco, s).contains("required_wan_bits_per_s"));
}

TEST(World, RefusesBadSettings) {
  WorldSettings s = Base(1e12, 0);
  EXPECT_EQ(RunWorld(s).status().code(), StatusCode::kInvalidArgument);
  s = Base(1e12, 2);
  s.wan_bits = 12;
  EXPECT_EQ(RunWorld(s).status().code(), StatusCode::kInvalidArgument);
  s = Base(1e12, 2);
  s.gpus_per_dc = 323;  // 17 x 19 GPUs: no degree of a smooth model shape divides them
  EXPECT_EQ(RunWorld(s).status().code(), StatusCode::kInvalidArgument);
}

TEST(Scaling, ColumnsAndSlopes) {
  ScalingSettings s;
  ScalingRow r = ScalingPoint(s, 1e12, 4);
  // M = 2e12 bytes; hierarchical: 2 x 3/4 M = 3e12; ring over 4 x 64 replicas: 2 x 255/256 M.
  EXPECT_DOUBLE_EQ(r.hier_bytes, 3e12);
  EXPECT_DOUBLE_EQ(r.ring_bytes, 2.0 * 255 / 256 * 2e12);
  EXPECT_DOUBLE_EQ(r.diloco_bytes, 3e10);
  EXPECT_DOUBLE_EQ(r.hier_s, 3e12 / 50e9 + 6 * 0.02);
  EXPECT_DOUBLE_EQ(r.ring_s, r.ring_bytes / 50e9 + 2 * 255 * 0.02);
  ScalingResult res = RunScaling(s);
  EXPECT_EQ(res.rows.size(), s.params.size() * s.datacenters.size());
  // Bytes are exactly linear in model size; per-site bytes are nearly flat in D, totals linear.
  EXPECT_NEAR(res.hier_bytes.vs_params, 1.0, 1e-9);
  EXPECT_LT(res.hier_bytes.vs_datacenters, 0.3);
  EXPECT_NEAR(res.ring_bytes.vs_datacenters, 0.0, 0.01);
  EXPECT_GT(res.hier_total.vs_datacenters, 0.95);
  EXPECT_NEAR(res.diloco_bytes.vs_params, 1.0, 1e-9);
  EXPECT_GT(res.ring_time.vs_datacenters, res.hier_time.vs_datacenters);
  EXPECT_NE(res.answer.find("linearly"), std::string::npos);
  EXPECT_NE(ScalingReport(res, s).find("2 (D-1)/D M"), std::string::npos);
}

}  // namespace
}  // namespace atl::plan
