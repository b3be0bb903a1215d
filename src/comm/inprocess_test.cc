// The in-process backend: every collective against values computed by hand, overlapping
// non-blocking operations, sub-groups, and the failures that must give errors instead of hangs.
#include "comm/inprocess.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "core/log.h"

namespace atl {
namespace {

// Runs fn on n ranks and expects every rank to succeed.
void ExpectAllOk(int n, const std::function<Status(Communicator&)>& fn, InProcessOptions o = {}) {
  auto st = RunInProcessRanks(n, fn, o);
  for (int r = 0; r < n; ++r) EXPECT_TRUE(st[r].ok()) << "rank " << r << ": " << st[r].ToString();
}

// Value held by rank r at index i before a reduction.
float Val(int r, size_t i) { return static_cast<float>(r + 1) * 0.5f + static_cast<float>(i); }

TEST(InProcess, AllReduceFloatAndDouble) {
  for (int n : {1, 2, 3, 4}) {
    ExpectAllOk(n, [n](Communicator& c) -> Status {
      std::vector<float> f(37);
      std::vector<double> d(5);
      for (size_t i = 0; i < f.size(); ++i) f[i] = Val(c.rank(), i);
      for (size_t i = 0; i < d.size(); ++i) d[i] = c.rank() * 1e-3 + static_cast<double>(i);
      ATOLL_RETURN_IF_ERROR(c.AllReduce(std::span<float>(f)));
      ATOLL_RETURN_IF_ERROR(c.AllReduce(std::span<double>(d)));
      for (size_t i = 0; i < f.size(); ++i) {
        float want = Val(0, i);
        for (int r = 1; r < n; ++r) want += Val(r, i);  // rank order: bitwise equal
        EXPECT_EQ(f[i], want) << "i=" << i;
      }
      const double rank_sum = n * (n - 1) / 2 * 1e-3;
      for (size_t i = 0; i < d.size(); ++i) EXPECT_NEAR(d[i], n * double(i) + rank_sum, 1e-12);
      return Status::Ok();
    });
  }
}

// The sum is in rank order 0..N-1 whatever the arrival order: values chosen so that any other
// order rounds differently (1e8 + 1 - 1e8 in float32 is 0, in another order 1).
TEST(InProcess, ReductionOrderIsRankOrderWhateverTheTiming) {
  for (int trial = 0; trial < 20; ++trial) {
    ExpectAllOk(3, [trial](Communicator& c) -> Status {
      const float vals[3] = {1e8f, 1.0f, -1e8f};
      float x = vals[c.rank()];
      // Vary who arrives last.
      if (c.rank() == trial % 3) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      ATOLL_RETURN_IF_ERROR(c.AllReduce(std::span<float>(&x, 1)));
      EXPECT_EQ(x, (1e8f + 1.0f) + -1e8f);
      EXPECT_EQ(x, 0.0f);
      return Status::Ok();
    });
  }
}

TEST(InProcess, ReduceScatterAllGatherBroadcast) {
  const int n = 4;
  const size_t k = 3;
  ExpectAllOk(n, [&](Communicator& c) -> Status {
    std::vector<double> send(n * k), recv(k);
    for (size_t i = 0; i < send.size(); ++i) send[i] = 100.0 * c.rank() + static_cast<double>(i);
    ATOLL_RETURN_IF_ERROR(c.ReduceScatter(std::span<const double>(send), std::span<double>(recv)));
    // Block b of the sum: sum_r (100 r + b*k + i) = 100*6 + 4*(b*k + i).
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(recv[i], 600.0 + 4.0 * (c.rank() * k + i));

    std::vector<float> mine(k), all(n * k);
    for (size_t i = 0; i < k; ++i) mine[i] = static_cast<float>(10 * c.rank() + i);
    ATOLL_RETURN_IF_ERROR(c.AllGather(std::span<const float>(mine), std::span<float>(all)));
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < k; ++i) EXPECT_EQ(all[r * k + i], static_cast<float>(10 * r + i));

    std::vector<int64_t> b(5, c.rank() == 2 ? 42 : -1);
    ATOLL_RETURN_IF_ERROR(c.Broadcast(std::span<int64_t>(b), /*root=*/2));
    for (auto v : b) EXPECT_EQ(v, 42);
    return c.Barrier();
  });
}

TEST(InProcess, SendRecvRing) {
  const int n = 4;
  ExpectAllOk(n, [&](Communicator& c) -> Status {
    std::vector<float> out = {float(c.rank()), 1.5f}, in(2);
    const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
    ATOLL_RETURN_IF_ERROR(c.Send(std::span<const float>(out), next, /*tag=*/7));
    ATOLL_RETURN_IF_ERROR(c.Recv(std::span<float>(in), prev, /*tag=*/7));
    EXPECT_EQ(in[0], float(prev));
    EXPECT_EQ(in[1], 1.5f);
    return Status::Ok();
  });
}

TEST(InProcess, OverlappingNonBlockingOpsWaitedOutOfOrder) {
  const int n = 3;
  ExpectAllOk(n, [&](Communicator& c) -> Status {
    std::vector<float> a(1000, 1.0f), b(10, float(c.rank()));
    std::vector<double> g(n * 2), gathered_in = {double(c.rank()), -double(c.rank())};
    CommHandle ha = c.IAllReduce(std::span<float>(a));
    CommHandle hb = c.IAllReduce(std::span<float>(b));
    CommHandle hg = c.IAllGather(std::span<const double>(gathered_in), std::span<double>(g));
    CommHandle hbar = c.IBarrier();
    // Wait in a different order on each rank.
    if (c.rank() % 2) {
      ATOLL_RETURN_IF_ERROR(hbar.Wait());
      ATOLL_RETURN_IF_ERROR(hg.Wait());
      ATOLL_RETURN_IF_ERROR(hb.Wait());
      ATOLL_RETURN_IF_ERROR(ha.Wait());
    } else {
      ATOLL_RETURN_IF_ERROR(ha.Wait());
      ATOLL_RETURN_IF_ERROR(hb.Wait());
      ATOLL_RETURN_IF_ERROR(hg.Wait());
      ATOLL_RETURN_IF_ERROR(hbar.Wait());
    }
    EXPECT_TRUE(ha.Wait().ok());  // a second Wait returns the same status
    for (float v : a) EXPECT_EQ(v, 3.0f);
    for (float v : b) EXPECT_EQ(v, 0.0f + 1.0f + 2.0f);
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(g[2 * r], r);
      EXPECT_EQ(g[2 * r + 1], -r);
    }
    return Status::Ok();
  });
}

// The mesh's use: 4 ranks as a 2x2 grid, split by row (dp) and by column (tp).
TEST(InProcess, SplitIntoRowAndColumnGroups) {
  ExpectAllOk(4, [](Communicator& c) -> Status {
    const int row = c.rank() / 2, col = c.rank() % 2;
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> rows, c.Split(row, c.rank()));
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> cols, c.Split(col, -c.rank()));
    EXPECT_EQ(rows->size(), 2);
    EXPECT_EQ(rows->rank(), col);
    EXPECT_EQ(cols->rank(), 1 - row);  // key -rank reverses the order
    float x = float(c.rank());
    ATOLL_RETURN_IF_ERROR(rows->AllReduce(std::span<float>(&x, 1)));
    EXPECT_EQ(x, row == 0 ? 0.0f + 1.0f : 2.0f + 3.0f);
    float y = float(c.rank());
    ATOLL_RETURN_IF_ERROR(cols->AllReduce(std::span<float>(&y, 1)));
    EXPECT_EQ(y, col == 0 ? 0.0f + 2.0f : 1.0f + 3.0f);
    // kNoGroup: ranks 1..3 join, rank 0 gets nothing.
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> some,
                           c.Split(c.rank() == 0 ? Communicator::kNoGroup : 0, 0));
    EXPECT_EQ(some == nullptr, c.rank() == 0);
    if (some) {
      EXPECT_EQ(some->size(), 3);
    }
    return Status::Ok();
  });
}

// A rank that never arrives (alive, but not calling): an error naming the op and the missing rank
// within the timeout, not a hang.
TEST(InProcess, MissingRankTimesOutWithTheOpAndRanks) {
  InProcessOptions o;
  o.timeout_s = 0.2;
  auto comms = CreateInProcessGroup(3, o);
  std::vector<Status> st(2);
  const double t0 = NowSeconds();
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      std::vector<float> x(4096, 1.0f);
      st[r] = comms[r]->AllReduce(std::span<float>(x));
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_LT(NowSeconds() - t0, 5.0);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].ok());
    const std::string& m = st[r].message();
    EXPECT_NE(m.find(fmt::format("rank {}: all_reduce of 4096 float32", r)), std::string::npos)
        << m;
    EXPECT_NE(m.find("ranks 2"), std::string::npos) << m;
    EXPECT_NE(m.find("timed out"), std::string::npos) << m;
  }
  // The late rank learns that the others gave up instead of waiting again.
  std::vector<float> x(4096, 1.0f);
  Status late = comms[2]->AllReduce(std::span<float>(x));
  EXPECT_FALSE(late.ok());
  EXPECT_NE(late.message().find("rank 2: all_reduce"), std::string::npos) << late.message();
}

// A rank that leaves (its communicator is destroyed: the thread of a crashed rank) fails the others
// at once, well before the timeout.
TEST(InProcess, DepartedRankFailsPeersAtOnce) {
  const double t0 = NowSeconds();
  auto st = RunInProcessRanks(3, [](Communicator& c) -> Status {
    if (c.rank() == 0) return Status::Internal("rank 0 crashed");
    std::vector<float> x(16);
    ATOLL_RETURN_IF_ERROR(c.AllReduce(std::span<float>(x)));
    return Status::Ok();
  });
  EXPECT_LT(NowSeconds() - t0, 10.0);  // the default timeout is 60 s
  for (int r = 1; r < 3; ++r) {
    ASSERT_FALSE(st[r].ok());
    EXPECT_NE(st[r].message().find("rank 0 left the group"), std::string::npos) << st[r].message();
    EXPECT_NE(st[r].message().find(fmt::format("rank {}: all_reduce of 16 float32", r)),
              std::string::npos)
        << st[r].message();
  }
  // Recv from a rank that left without sending.
  auto st2 = RunInProcessRanks(2, [](Communicator& c) -> Status {
    if (c.rank() == 1) return Status::Ok();
    double d;
    return c.Recv(std::span<double>(&d, 1), 1, 5);
  });
  ASSERT_FALSE(st2[0].ok());
  EXPECT_NE(st2[0].message().find("recv of 1 float64 from rank 1 (tag 5)"), std::string::npos)
      << st2[0].message();
}

TEST(InProcess, MismatchedCollectivesAreErrorsOnEveryRank) {
  auto st = RunInProcessRanks(2, [](Communicator& c) -> Status {
    std::vector<float> x(c.rank() == 0 ? 8 : 9);
    return c.AllReduce(std::span<float>(x));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(st[r].ok());
    const std::string& m = st[r].message();
    EXPECT_NE(m.find(fmt::format("rank {}: all_reduce of {} float32: mismatched collectives", r,
                                 r == 0 ? 8 : 9)),
              std::string::npos)
        << m;
    // Which rank's call is named first depends on arrival order; both calls are named.
    EXPECT_NE(m.find("rank 0 called all_reduce of 8 float32"), std::string::npos) << m;
    EXPECT_NE(m.find("rank 1 called all_reduce of 9 float32"), std::string::npos) << m;
  }
}

TEST(InProcess, BadArgumentsAreInvalidArgument) {
  ExpectAllOk(2, [](Communicator& c) -> Status {
    std::vector<float> x(4), y(3);
    Status s = c.Broadcast(std::span<float>(x), /*root=*/2);
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
    EXPECT_NE(s.message().find("root 2 is not a rank"), std::string::npos) << s.message();
    s = c.ReduceScatter(std::span<const float>(x), std::span<float>(y));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    std::vector<uint8_t> bytes(3);
    s = c.AllReduce(std::span<uint8_t>(bytes));
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    // A receive of the wrong size.
    if (c.rank() == 0) return c.Send(std::span<const float>(x), 1);
    s = c.Recv(std::span<float>(y), 0);
    EXPECT_NE(s.message().find("the message has 4 float32"), std::string::npos) << s.ToString();
    return Status::Ok();
  });
}

}  // namespace
}  // namespace atl
