// LinkEmulator: pacing by bandwidth, latency, jitter within bounds, in-order arrival, determinism.
#include "world/link.h"

#include <gtest/gtest.h>

#include <vector>

namespace atl {
namespace {

constexpr double kEps = 1e-9;

TEST(Link, LatencyOnlyArrivesLatencyLater) {
  LinkEmulator e({30, 0, 0}, 1, 0);
  for (double now : {0.0, 0.5, 0.5, 2.0}) {
    auto t = e.Send(now, 1 << 20);
    EXPECT_NEAR(t.depart_s, now, kEps);  // unlimited bandwidth: leaves at once
    EXPECT_NEAR(t.arrive_s, now + 0.030, kEps);
  }
}

TEST(Link, BandwidthPacesBackToBackChunks) {
  // 8 Mbit/s = 1e6 bytes/s: 125000 bytes take 0.125 s on the wire.
  LinkEmulator e({10, 8, 0}, 1, 0);
  for (int i = 0; i < 10; ++i) {
    auto t = e.Send(0.0, 125000);
    EXPECT_NEAR(t.depart_s, 0.125 * (i + 1), kEps) << i;
    EXPECT_NEAR(t.arrive_s, 0.125 * (i + 1) + 0.010, kEps) << i;
  }
  // An idle link starts serializing when the chunk is handed to it.
  auto t = e.Send(100.0, 250000);
  EXPECT_NEAR(t.depart_s, 100.25, kEps);
  EXPECT_NEAR(t.arrive_s, 100.26, kEps);
}

TEST(Link, ThroughputOverManyChunksMatchesBandwidth) {
  LinkEmulator e({40, 100, 0}, 1, 0);
  const size_t chunk = 1 << 20;
  const int n = 64;
  double last = 0;
  for (int i = 0; i < n; ++i) last = e.Send(0.001 * i, chunk).arrive_s;
  const double seconds = last - 0.040;
  EXPECT_NEAR(double(chunk) * n * 8 / seconds / 1e6, 100.0, 1e-6);
}

TEST(Link, JitterStaysWithinBoundsKeepsOrderAndVaries) {
  const LinkProfile p{20, 0, 5};
  LinkEmulator e(p, 42, 7);
  double prev = 0, lo = 1e9, hi = -1e9;
  for (int i = 0; i < 2000; ++i) {
    const double now = 0.001 * i;
    auto t = e.Send(now, 1000);
    EXPECT_GE(t.arrive_s, prev) << "chunk " << i << " overtook its predecessor";
    EXPECT_GE(t.arrive_s, now + 0.015 - kEps);
    // In order: a chunk may wait for its predecessor, which left at most 1 ms earlier.
    EXPECT_LE(t.arrive_s, now + 0.025 + kEps);
    prev = t.arrive_s;
    lo = std::min(lo, t.arrive_s - now);
    hi = std::max(hi, t.arrive_s - now);
  }
  EXPECT_LT(lo, 0.0165);  // the draws cover the range
  EXPECT_GT(hi, 0.0235);
}

TEST(Link, JitterLargerThanLatencyNeverArrivesBeforeDeparture) {
  LinkEmulator e({1, 0, 10}, 3, 0);
  for (int i = 0; i < 500; ++i) {
    auto t = e.Send(double(i), 100);  // far apart: no ordering effects
    EXPECT_GE(t.arrive_s, t.depart_s);
    EXPECT_LE(t.arrive_s, t.depart_s + 0.011 + kEps);
  }
}

TEST(Link, JitterIsDeterministicPerSeedAndStream) {
  auto run = [](uint64_t seed, uint64_t stream) {
    LinkEmulator e({20, 50, 5}, seed, stream);
    std::vector<double> a;
    for (int i = 0; i < 50; ++i) a.push_back(e.Send(0.01 * i, 10000).arrive_s);
    return a;
  };
  EXPECT_EQ(run(1, 2), run(1, 2));
  EXPECT_NE(run(1, 2), run(1, 3));
  EXPECT_NE(run(1, 2), run(2, 2));
}

TEST(Link, DescribeAndValidate) {
  EXPECT_EQ(DescribeLink({40, 100, 0}), "40 ms, 100 Mbit/s");
  EXPECT_EQ(DescribeLink({40, 0, 5}), "40 ms, unlimited, jitter 5 ms");
  EXPECT_EQ(ValidateLink({40, 100, 50}), "");
  EXPECT_NE(ValidateLink({-1, 0, 0}).find("latency_ms"), std::string::npos);
  EXPECT_NE(ValidateLink({0, std::nan(""), 0}).find("bandwidth_mbps"), std::string::npos);
  EXPECT_NE(ValidateLink({0, 0, 1.0 / 0.0}).find("jitter_ms"), std::string::npos);
}

}  // namespace
}  // namespace atl
