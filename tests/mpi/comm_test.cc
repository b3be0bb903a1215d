// The MPI backend across real processes (run under `mpirun -n 2` and `-n 4`, see CMakeLists.txt):
// every collective against values computed by hand, non-blocking overlap, Split, and MPI errors
// that come back as Status (MPI_ERRORS_RETURN) instead of aborting the job.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>

#include "comm/mpi.h"

namespace atl {
namespace {

MpiCommunicator* world = nullptr;

TEST(Mpi, AllReduceFloatAndDouble) {
  Communicator& c = *world;
  const int n = c.size();
  std::vector<float> f(1000);
  std::vector<double> d(33);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(c.rank() + i);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 0.25 * c.rank() - static_cast<double>(i);
  ASSERT_TRUE(c.AllReduce(std::span<float>(f)).ok());
  ASSERT_TRUE(c.AllReduce(std::span<double>(d)).ok());
  const double rank_sum = n * (n - 1) / 2.0;
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], static_cast<float>(rank_sum + n * i));
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], 0.25 * rank_sum - double(n) * i);
}

TEST(Mpi, ReduceScatterAllGatherBroadcast) {
  Communicator& c = *world;
  const int n = c.size();
  const size_t k = 5;
  std::vector<double> send(n * k), recv(k);
  for (size_t i = 0; i < send.size(); ++i) send[i] = 100.0 * c.rank() + static_cast<double>(i);
  ASSERT_TRUE(c.ReduceScatter(std::span<const double>(send), std::span<double>(recv)).ok());
  const double rank_sum = n * (n - 1) / 2.0;
  for (size_t i = 0; i < k; ++i)
    EXPECT_EQ(recv[i], 100.0 * rank_sum + n * double(c.rank() * k + i));

  std::vector<float> mine(k), all(n * k);
  for (size_t i = 0; i < k; ++i) mine[i] = static_cast<float>(10 * c.rank() + i);
  ASSERT_TRUE(c.AllGather(std::span<const float>(mine), std::span<float>(all)).ok());
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(all[r * k + i], static_cast<float>(10 * r + i));

  const int root = n - 1;
  std::vector<int64_t> b(7, c.rank() == root ? 42 : -1);
  ASSERT_TRUE(c.Broadcast(std::span<int64_t>(b), root).ok());
  for (auto v : b) EXPECT_EQ(v, 42);
  EXPECT_TRUE(c.Barrier().ok());
}

TEST(Mpi, SendRecvRing) {
  Communicator& c = *world;
  const int n = c.size();
  const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
  std::vector<float> out = {float(c.rank()), 2.5f}, in(2);
  CommHandle r = c.IRecv(std::span<float>(in), prev, 3);
  ASSERT_TRUE(c.Send(std::span<const float>(out), next, 3).ok());
  ASSERT_TRUE(r.Wait().ok());
  EXPECT_EQ(in[0], float(prev));
  EXPECT_EQ(in[1], 2.5f);
}

TEST(Mpi, OverlappingNonBlockingOps) {
  Communicator& c = *world;
  const int n = c.size();
  std::vector<float> a(1 << 16, 1.0f), b(10, float(c.rank()));
  std::vector<double> mine = {double(c.rank())}, g(n);
  std::vector<double> rs_send(n, 1.0), rs_recv(1);
  CommHandle ha = c.IAllReduce(std::span<float>(a));
  CommHandle hb = c.IAllReduce(std::span<float>(b));
  CommHandle hg = c.IAllGather(std::span<const double>(mine), std::span<double>(g));
  CommHandle hr = c.IReduceScatter(std::span<const double>(rs_send), std::span<double>(rs_recv));
  std::vector<int32_t> bc(3, c.rank() == 0 ? 9 : 0);
  CommHandle hc = c.IBroadcast(std::span<int32_t>(bc), 0);
  CommHandle hbar = c.IBarrier();
  ASSERT_TRUE(hbar.Wait().ok());
  ASSERT_TRUE(hc.Wait().ok());
  ASSERT_TRUE(hr.Wait().ok());
  ASSERT_TRUE(hg.Wait().ok());
  ASSERT_TRUE(hb.Wait().ok());
  ASSERT_TRUE(ha.Wait().ok());
  // With MPI_THREAD_MULTIPLE the non-blocking collectives above ran on the collective thread.
  EXPECT_EQ(world->uses_collective_thread(), world->thread_level() == MPI_THREAD_MULTIPLE);
  for (float v : a) ASSERT_EQ(v, float(n));
  for (float v : b) EXPECT_EQ(v, float(n * (n - 1) / 2));
  for (int r = 0; r < n; ++r) EXPECT_EQ(g[r], r);
  EXPECT_EQ(rs_recv[0], n);
  for (int v : bc) EXPECT_EQ(v, 9);
}

TEST(Mpi, SplitByParity) {
  Communicator& c = *world;
  auto sub = c.Split(c.rank() % 2, c.rank());
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  Communicator& s = **sub;
  EXPECT_EQ(s.rank(), c.rank() / 2);
  EXPECT_EQ(s.size(), (c.size() + 1 - c.rank() % 2) / 2);
  int32_t x = c.rank();
  ASSERT_TRUE(s.AllReduce(std::span<int32_t>(&x, 1)).ok());
  int32_t want = 0;
  for (int r = c.rank() % 2; r < c.size(); r += 2) want += r;
  EXPECT_EQ(x, want);
  EXPECT_NE(s.label().find("of group"), std::string::npos) << s.label();

  auto none = c.Split(c.rank() == 0 ? Communicator::kNoGroup : 1, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none == nullptr, c.rank() == 0);
}

// MPI's own errors come back as Status with the rank, the op and MPI's message: here a message
// longer than the receive buffer (MPI_ERR_TRUNCATE), which the default handler would abort on.
TEST(Mpi, MpiErrorsAreStatusesNamingRankAndOp) {
  Communicator& c = *world;
  if (c.rank() == 0) {
    std::vector<float> x(8, 1.0f);
    ASSERT_TRUE(c.Send(std::span<const float>(x), 1, 11).ok());
  } else if (c.rank() == 1) {
    std::vector<float> y(4);
    Status s = c.Recv(std::span<float>(y), 0, 11);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.ToString();
    EXPECT_NE(s.message().find("rank 1: recv of 4 float32 from rank 0 (tag 11): MPI error:"),
              std::string::npos)
        << s.message();
  }
  // A shorter message than asked for is also an error (MPI itself accepts it).
  if (c.rank() == 0) {
    std::vector<float> x(2, 1.0f);
    ASSERT_TRUE(c.Send(std::span<const float>(x), 1, 12).ok());
  } else if (c.rank() == 1) {
    std::vector<float> y(4);
    Status s = c.Recv(std::span<float>(y), 0, 12);
    EXPECT_NE(s.message().find("the message has 2 elements"), std::string::npos) << s.ToString();
  }
  // Arguments are checked before MPI sees them.
  std::vector<float> z(3);
  Status s = c.Broadcast(std::span<float>(z), c.size());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find(fmt::format("rank {}: broadcast", c.rank())), std::string::npos);
  EXPECT_TRUE(c.Barrier().ok());
}

// A non-blocking receive whose sender never sends: Wait() gives up after the timeout (1 s here,
// set in main) with an error naming the op, instead of hanging.
TEST(Mpi, WaitTimesOutInsteadOfHanging) {
  auto sub = world->Split(0, 0);  // its own communicator, so the stale receive stays isolated
  ASSERT_TRUE(sub.ok());
  Communicator& s = **sub;
  const int last = s.size() - 1;
  static float x = 0.0f;  // outlives the receive, which MPI cannot cancel portably
  if (s.rank() == 0) {
    CommHandle h = s.IRecv(std::span<float>(&x, 1), last, 99);
    Status st = h.Wait();
    ASSERT_FALSE(st.ok());
    EXPECT_NE(st.message().find(fmt::format(": recv of 1 float32 from rank {} (tag 99): not "
                                            "complete after 1 s",
                                            last)),
              std::string::npos)
        << st.message();
  }
  // After rank 0 gave up, satisfy the stale receive so that the communicator is freed cleanly.
  ASSERT_TRUE(s.Barrier().ok());
  if (s.rank() == last) {
    float one = 1.0f;
    ASSERT_TRUE(s.Send(std::span<const float>(&one, 1), 0, 99).ok());
  }
  ASSERT_TRUE(s.Barrier().ok());
}

}  // namespace
}  // namespace atl

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  atl::MpiOptions options;
  options.timeout_s = 1.0;  // WaitTimesOutInsteadOfHanging; everything else finishes in ms
  auto w = atl::MpiCommunicator::CreateWorld(&argc, &argv, options);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    return 1;
  }
  atl::world = w->get();
  int failed = RUN_ALL_TESTS();
  // Every rank exits with the same code.
  int any = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, atl::world->comm());
  w->reset();
  return any ? 1 : 0;
}
