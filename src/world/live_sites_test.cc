// LiveSites over the real WAN transport on loopback: the collectives' results, and that they go on
// among the live sites once one is gone, where the WAN's own ring collectives fail.
#include "world/live_sites.h"

#include <gtest/gtest.h>

#include <numeric>
#include <vector>

#include "world/transport/test_world.h"

namespace atl {
namespace {

using testing_wan::Start;

std::vector<float> FloatsOf(int site, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(i % 97) * 0.37f + float(site) * 1.7f - 20.0f;
  return v;
}

// Every collective over all three sites, against the same arithmetic done here: sums in rank
// order, bit for bit.
TEST(LiveSites, CollectivesOverEverySiteGiveTheSumsInRankOrder) {
  auto w = Start(3);
  ASSERT_TRUE(w->ok());
  const size_t n = 1001;  // not a multiple of 3: pieces of unequal size
  std::vector<float> want(n, 0.0f);
  for (int s = 0; s < 3; ++s) {
    const std::vector<float> v = FloatsOf(s, n);
    for (size_t i = 0; i < n; ++i) want[i] += v[i];
  }
  w->Run([&](Communicator& wan, int s) {
    LiveSites live(&wan, {0, 1, 2}, 7);
    EXPECT_EQ(live.rank(), s);
    std::vector<float> f = FloatsOf(s, n);
    ASSERT_TRUE(live.AllReduce(std::span<float>(f)).ok());
    EXPECT_EQ(f, want);
    std::vector<int64_t> big(5, (int64_t(1) << 60) / 4 + s);
    ASSERT_TRUE(live.AllReduce(std::span<int64_t>(big)).ok());
    EXPECT_EQ(big[4], 3 * ((int64_t(1) << 60) / 4) + 3);
    std::vector<double> blocks = {1.0 * s, 10.0 * s, 100.0 * s}, mine(1);
    ASSERT_TRUE(live.ReduceScatter(std::span<const double>(blocks), std::span<double>(mine)).ok());
    EXPECT_EQ(mine[0], std::pow(10.0, s) * 3);
    const int64_t me = 100 + s;
    std::vector<int64_t> all(3);
    ASSERT_TRUE(live.AllGather(std::span<const int64_t>(&me, 1), std::span<int64_t>(all)).ok());
    EXPECT_EQ(all, (std::vector<int64_t>{100, 101, 102}));
    int32_t root_value = s == 2 ? 42 : -1;
    ASSERT_TRUE(live.Broadcast(std::span<int32_t>(&root_value, 1), 2).ok());
    EXPECT_EQ(root_value, 42);
    EXPECT_TRUE(live.Barrier().ok());
  });
}

// Site 1 vanishes: the WAN's ring all-reduce fails on the others, LiveSites over {0, 2} goes on
// (its ranks 0 and 1 are sites 0 and 2), and one that still names site 1 fails on both at once,
// leaving their buffers as they were.
TEST(LiveSites, GoOnAmongTheSurvivorsOfALostSite) {
  auto w = Start(3);
  ASSERT_TRUE(w->ok());
  w->Drop(1);
  std::vector<Communicator*> wans = {w->comms[0].get(), w->comms[2].get()};
  std::vector<std::thread> threads;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      Communicator& wan = *wans[size_t(i)];
      std::vector<float> x(10, 1.0f);
      EXPECT_FALSE(wan.AllReduce(std::span<float>(x)).ok());
      LiveSites stale(&wan, {0, 1, 2}, 1);
      std::vector<int64_t> kept(4, 5);
      EXPECT_FALSE(stale.AllReduce(std::span<int64_t>(kept)).ok());
      EXPECT_EQ(kept, std::vector<int64_t>(4, 5));

      LiveSites live(&wan, {0, 2}, 2);
      EXPECT_EQ(live.size(), 2);
      EXPECT_EQ(live.rank(), i);
      std::vector<int64_t> v(3, int64_t(wan.rank()) + 1);
      ASSERT_TRUE(live.AllReduce(std::span<int64_t>(v)).ok());
      EXPECT_EQ(v, std::vector<int64_t>(3, 4));  // sites 0 and 2: 1 + 3
      const int32_t token = 7 * wan.rank();
      if (i == 0) {
        ASSERT_TRUE(live.Send(std::span<const int32_t>(&token, 1), 1, 5).ok());
      } else {
        int32_t got = 0;
        ASSERT_TRUE(live.Recv(std::span<int32_t>(&got, 1), 0, 5).ok());
        EXPECT_EQ(got, 0);
      }
    });
  for (auto& t : threads) t.join();
}

TEST(LiveSites, RefusesASiteListWithoutThisSite) {
  auto w = Start(2);
  ASSERT_TRUE(w->ok());
  LiveSites live(w->comms[0].get(), {1}, 0);
  int64_t x = 1;
  const Status s = live.AllReduce(std::span<int64_t>(&x, 1));
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not among them"), std::string::npos) << s.ToString();
}

}  // namespace
}  // namespace atl
