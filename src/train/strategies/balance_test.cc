// world.balance's shares: by speed, whole, at least one each, the same for the same inputs.
#include "train/strategies/balance.h"

#include <gtest/gtest.h>

#include <limits>
#include <numeric>
#include <vector>

namespace atl {
namespace {

int64_t Sum(const std::vector<int64_t>& v) {
  return std::accumulate(v.begin(), v.end(), int64_t(0));
}

TEST(Balance, SharesFollowSpeedAndAddUp) {
  const std::vector<int> live = {0, 1, 2};
  // Site 2 takes twice as long per micro-batch: speeds 1 : 1 : 0.5 of 18 micro-batches.
  const std::vector<double> seconds = {0.1, 0.1, 0.2};
  const std::vector<int64_t> c = BalancedCounts(live, seconds, 18);
  EXPECT_EQ(Sum(c), 18);
  EXPECT_EQ(c[0], c[1]);
  EXPECT_GE(c[2], 3);
  EXPECT_LE(c[2], 5);  // ~ 1 + 15 * 0.2 = 4
  EXPECT_GT(c[0], c[2]);
  // The ranges laid end to end, in live order.
  using R = std::vector<std::pair<int64_t, int64_t>>;
  EXPECT_EQ(ShareOfSite(live, c, 0), (R{{0, c[0]}}));
  EXPECT_EQ(ShareOfSite(live, c, 2), (R{{c[0] + c[1], 18}}));
}

TEST(Balance, EqualWithoutMeasurementsAndAtLeastOneEach) {
  const std::vector<int> live = {0, 2};
  EXPECT_EQ(BalancedCounts(live, std::vector<double>{0.1, 0, 0}, 7),
            (std::vector<int64_t>{4, 3}));  // site 2 has none: equal, remainder to the lowest
  EXPECT_EQ(
      BalancedCounts(live, std::vector<double>{0.1, 0, std::numeric_limits<double>::infinity()}, 6),
      (std::vector<int64_t>{3, 3}));
  // A site a thousand times slower keeps one micro-batch (it is still measured).
  const std::vector<int64_t> c = BalancedCounts(live, std::vector<double>{0.001, 0, 1.0}, 6);
  EXPECT_EQ(c, (std::vector<int64_t>{5, 1}));
  // A site not live has no share.
  EXPECT_TRUE(ShareOfSite(live, c, 1).empty());
}

TEST(Balance, RoundingIsWholeAndDeterministic) {
  const std::vector<int> live = {0, 1, 2, 3};
  for (int64_t total = 4; total < 40; ++total) {
    const std::vector<double> seconds = {0.3, 0.1, 0.7, 0.2};
    const std::vector<int64_t> a = BalancedCounts(live, seconds, total);
    EXPECT_EQ(Sum(a), total);
    for (int64_t x : a) EXPECT_GE(x, 1);
    EXPECT_EQ(a, BalancedCounts(live, seconds, total));
    EXPECT_GE(a[1], a[3]);  // faster never gets fewer
    EXPECT_GE(a[3], a[0]);
    EXPECT_GE(a[0], a[2]);
  }
}

}  // namespace
}  // namespace atl
