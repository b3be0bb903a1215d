// The NCCL backend (comm/nccl/nccl_comm.h) across real processes under mpirun, each rank with its
// own GPU: every collective on device buffers against values computed by hand, a send/receive
// ring, Split, and a peer that never joins giving an error instead of a hang.
//
// Built twice: against the emulated NCCL and GPUs (mpi_nccl_emu_n2, _n3: runs everywhere) and
// against the real ones (mpi_nccl_n1: exits 77, skipped, without a GPU; with one GPU only one rank
// can run, since NCCL refuses two ranks on one GPU, so the multi-rank cases need a machine with a
// GPU per rank).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "comm/mpi.h"
#include "comm/nccl/nccl_comm.h"
#include "kernels/cuda/runtime.h"

namespace atl {
namespace {

using kernels::cuda::DeviceArray;
using kernels::cuda::ToDevice;
using kernels::cuda::ToHost;

MpiCommunicator* world = nullptr;
Communicator* nccl = nullptr;

TEST(Nccl, SaysItTakesDeviceMemory) {
  EXPECT_TRUE(nccl->device_memory());
  EXPECT_FALSE(world->device_memory());
  EXPECT_EQ(nccl->rank(), world->rank());
  EXPECT_EQ(nccl->size(), world->size());
}

TEST(Nccl, AllReduceOnTheGpu) {
  Communicator& c = *nccl;
  const int n = c.size();
  std::vector<float> f(1000);
  std::vector<double> d(33);
  std::vector<int64_t> k(5, int64_t(1) << 40);
  for (size_t i = 0; i < f.size(); ++i) f[i] = float(c.rank() + i);
  for (size_t i = 0; i < d.size(); ++i) d[i] = 0.25 * c.rank() - double(i);
  auto gf = ToDevice(f);
  auto gd = ToDevice(d);
  auto gk = ToDevice(k);
  ASSERT_TRUE(c.AllReduce(gf.data(), f.size(), DType::kFloat32).ok());
  ASSERT_TRUE(c.AllReduce(gd.data(), d.size(), DType::kFloat64).ok());
  ASSERT_TRUE(c.AllReduce(gk.data(), k.size(), DType::kInt64).ok());
  f = ToHost(gf);
  d = ToHost(gd);
  k = ToHost(gk);
  const double rank_sum = n * (n - 1) / 2.0;
  for (size_t i = 0; i < f.size(); ++i) EXPECT_EQ(f[i], float(rank_sum + n * i));
  for (size_t i = 0; i < d.size(); ++i) EXPECT_EQ(d[i], 0.25 * rank_sum - double(n) * i);
  for (int64_t v : k) EXPECT_EQ(v, int64_t(n) << 40);
}

TEST(Nccl, ReduceScatterAllGatherBroadcastBarrier) {
  Communicator& c = *nccl;
  const int n = c.size();
  const size_t k = 5;
  std::vector<double> send(n * k);
  for (size_t i = 0; i < send.size(); ++i) send[i] = 100.0 * c.rank() + double(i);
  auto gsend = ToDevice(send);
  DeviceArray<double> grecv(k);
  ASSERT_TRUE(c.ReduceScatter(gsend.data(), grecv.data(), k, DType::kFloat64).ok());
  const auto recv = ToHost(grecv);
  const double rank_sum = n * (n - 1) / 2.0;
  for (size_t i = 0; i < k; ++i)
    EXPECT_EQ(recv[i], 100.0 * rank_sum + n * double(c.rank() * k + i));

  std::vector<float> mine(k);
  for (size_t i = 0; i < k; ++i) mine[i] = float(10 * c.rank() + i);
  auto gmine = ToDevice(mine);
  DeviceArray<float> gall(n * k);
  ASSERT_TRUE(c.AllGather(gmine.data(), gall.data(), k, DType::kFloat32).ok());
  const auto all = ToHost(gall);
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < k; ++i) EXPECT_EQ(all[r * k + i], float(10 * r + i));

  const int root = n - 1;
  auto gb = ToDevice(std::vector<int32_t>(7, c.rank() == root ? 42 : -1));
  ASSERT_TRUE(c.Broadcast(gb.data(), 7, DType::kInt32, root).ok());
  for (int32_t v : ToHost(gb)) EXPECT_EQ(v, 42);
  EXPECT_TRUE(c.Barrier().ok());
}

// Even ranks send first, odd ones receive first: NCCL's sends wait for their receiver, so a ring
// where everyone sent first could wait forever.
TEST(Nccl, SendRecvRing) {
  Communicator& c = *nccl;
  const int n = c.size();
  if (n < 2) GTEST_SKIP() << "one rank";
  const int next = (c.rank() + 1) % n, prev = (c.rank() + n - 1) % n;
  auto out = ToDevice(std::vector<float>{float(c.rank()), 2.5f});
  DeviceArray<float> in(2);
  auto send = [&] { return c.Send(out.data(), 2, DType::kFloat32, next, 0); };
  auto recv = [&] { return c.Recv(in.data(), 2, DType::kFloat32, prev, 0); };
  if (c.rank() % 2 == 0) {
    ASSERT_TRUE(send().ok());
    ASSERT_TRUE(recv().ok());
  } else {
    ASSERT_TRUE(recv().ok());
    ASSERT_TRUE(send().ok());
  }
  EXPECT_EQ(ToHost(in), (std::vector<float>{float(prev), 2.5f}));
  // Non-blocking: the handles finish with the stream.
  CommHandle h = c.IAllReduce(in.data(), 2, DType::kFloat32);
  ASSERT_TRUE(h.Wait().ok());
  EXPECT_EQ(ToHost(in)[1], 2.5f * n);
}

TEST(Nccl, SplitMakesNcclGroups) {
  const int color = world->rank() % 2;
  auto sub = nccl->Split(color, -world->rank());  // reversed order within each group
  ASSERT_TRUE(sub.ok()) << sub.status().ToString();
  Communicator& g = **sub;
  EXPECT_TRUE(g.device_memory());
  const int members = (world->size() + 1 - color) / 2;
  EXPECT_EQ(g.size(), members);
  auto x = ToDevice(std::vector<int32_t>{world->rank(), 1});
  ASSERT_TRUE(g.AllReduce(x.data(), 2, DType::kInt32).ok());
  int want = 0;
  for (int r = color; r < world->size(); r += 2) want += r;
  EXPECT_EQ(ToHost(x), (std::vector<int32_t>{want, members}));
  auto none = nccl->Split(Communicator::kNoGroup, 0);
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
}

TEST(Nccl, BadArgumentsAreRefusedByName) {
  DeviceArray<float> x(4);
  const Status s = nccl->Send(x.data(), 4, DType::kFloat32, nccl->size() + 3, 0);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("is not a rank"), std::string::npos) << s.ToString();
  const Status tagged = nccl->Send(x.data(), 4, DType::kFloat32, 0, 3);
  EXPECT_EQ(tagged.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(tagged.message().find("no tags"), std::string::npos) << tagged.ToString();
  EXPECT_EQ(nccl->Recv(x.data(), 4, DType::kFloat32, nccl->rank(), 0).code(),
            StatusCode::kInvalidArgument);
#if ATOLL_NCCL_EMULATED
  // A host pointer: NCCL's kernels on a GPU would fault on it; the emulator says so.
  std::vector<float> host(4, 1.0f);
  const Status h = nccl->AllReduce(host.data(), 4, DType::kFloat32);
  EXPECT_EQ(h.code(), StatusCode::kUnavailable);
  EXPECT_NE(h.message().find("not device memory"), std::string::npos) << h.ToString();
  // Every rank made that call and failed before joining, so the ranks are still in step.
#endif
}

// Rank 0 all-reduces on a communicator the others never use again: it gets an error naming the
// operation within the timeout (2 s here), not a hang.
TEST(Nccl, APeerThatNeverJoinsIsAnErrorNotAHang) {
  if (world->size() < 2) GTEST_SKIP() << "one rank";
  auto lonely = MakeNcclCommunicator(*world, /*timeout_s=*/2.0);
  ASSERT_TRUE(lonely.ok()) << lonely.status().ToString();
  // The emulated NCCL's own wait, for this test (after joining, which a loaded machine may slow).
  setenv("ATOLL_EMU_NCCL_TIMEOUT_S", "2", 1);
  if (world->rank() == 0) {
    DeviceArray<float> x(8);
    x.SetZero();
    const Status s = (*lonely)->AllReduce(x.data(), 8, DType::kFloat32);
    EXPECT_EQ(s.code(), StatusCode::kUnavailable);
    EXPECT_NE(s.message().find("all_reduce of 8 float32"), std::string::npos) << s.ToString();
    // Aborted: later calls fail at once.
    EXPECT_FALSE((*lonely)->AllReduce(x.data(), 8, DType::kFloat32).ok());
  }
  ASSERT_TRUE(world->Barrier().ok());
  unsetenv("ATOLL_EMU_NCCL_TIMEOUT_S");
}

// A rank whose joining never completes (the emulated NCCL's fault: as a rank whose GPU hangs in
// ncclCommInitRank), at the first join or at the split that makes the operations' communicator:
// every rank's MakeNcclCommunicator fails with Unavailable naming the call within the timeout
// (2 s here; each of the two waits has it), none hangs; and the world goes on.
TEST(Nccl, APeerStuckJoiningIsAnErrorNotAHang) {
#if !ATOLL_NCCL_EMULATED
  GTEST_SKIP() << "the fault is injected into the emulated NCCL";
#endif
  if (world->size() < 2) GTEST_SKIP() << "one rank";
  for (const char* fault : {"ATOLL_EMU_NCCL_STUCK_INIT_RANK", "ATOLL_EMU_NCCL_STUCK_SPLIT_RANK"}) {
    SCOPED_TRACE(fault);
    const std::string call = std::string(fault).find("INIT") != std::string::npos
                                 ? "ncclCommInitRankConfig"
                                 : "ncclCommSplit";
    setenv(fault, "1", 1);
    const auto start = std::chrono::steady_clock::now();
    auto stuck = MakeNcclCommunicator(*world, /*timeout_s=*/2.0);
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    unsetenv(fault);
    ASSERT_FALSE(stuck.ok());
    EXPECT_EQ(stuck.status().code(), StatusCode::kUnavailable);
    EXPECT_NE(stuck.status().message().find(call + ": not done within 2 s"), std::string::npos)
        << stuck.status().ToString();
    EXPECT_LT(seconds, 30.0);
    // The bootstrap and the working communicator are unharmed.
    ASSERT_TRUE(world->Barrier().ok());
    DeviceArray<float> x(4);
    x.SetZero();
    EXPECT_TRUE(nccl->AllReduce(x.data(), 4, DType::kFloat32).ok());
  }
}

}  // namespace
}  // namespace atl

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  auto w = atl::MpiCommunicator::CreateWorld(&argc, &argv);
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    return 1;
  }
  atl::world = w->get();
  // Every rank decides alike whether to skip: no GPU on any rank skips all.
  std::string why;
  int usable = atl::kernels::cuda::Available(&why) ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &usable, 1, MPI_INT, MPI_MIN, atl::world->comm());
  if (!usable) {
    if (atl::world->rank() == 0)
      std::printf("SKIPPED: no GPU here (%s): the NCCL tests need one per rank\n", why.c_str());
    w->reset();
    return 77;
  }
  auto comm = atl::MakeNcclCommunicator(*atl::world);
  if (!comm.ok()) {
    std::fprintf(stderr, "%s\n", comm.status().ToString().c_str());
    w->reset();
    return 1;
  }
  atl::nccl = comm->get();
  int failed = RUN_ALL_TESTS();
  int any = failed;
  MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, atl::world->comm());
  comm->reset();
  w->reset();
  return any ? 1 : 0;
}
