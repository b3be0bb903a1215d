// WAN transport: the ring choice, collectives among endpoints in one process (a thread per site)
// on loopback, link emulation bounds, validation of every chunk. Connecting, timeouts and TLS:
// world/transport/connect_test.cc; absent sites, rejoining, snapshots: rejoin_test.cc; faults:
// wan_fault_test.cc.
#include "world/wan.h"

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "core/log.h"
#include "world/proto/transport.pb.h"
#include "world/transport/test_world.h"
#include "world/wan_internal.h"

namespace atl {
namespace {

using namespace testing_wan;  // NOLINT: the shared test world

// ---------------------------------------------------------------------------------------------
// ChooseRing

using Matrix = std::vector<std::vector<double>>;
Matrix Full(int n, double v) {
  Matrix m(n, std::vector<double>(n, v));
  for (int i = 0; i < n; ++i) m[i][i] = 0;
  return m;
}

TEST(ChooseRing, TrivialSizes) {
  EXPECT_EQ(ChooseRing({}, {}), std::vector<int>{});
  EXPECT_EQ(ChooseRing(Full(1, 1), Full(1, 0)), std::vector<int>{0});
  EXPECT_EQ(ChooseRing(Full(2, 1), Full(2, 0)), (std::vector<int>{0, 1}));
}

TEST(ChooseRing, UniformLinksGiveSiteOrder) {
  EXPECT_EQ(ChooseRing(Full(5, 100), Full(5, 0.02)), (std::vector<int>{0, 1, 2, 3, 4}));
}

TEST(ChooseRing, AvoidsOneSlowDirectedLink) {
  Matrix bw = Full(4, 100);
  bw[0][1] = 1;  // 0 -> 1 slow; 1 -> 0 fast
  auto r = ChooseRing(bw, Full(4, 0.01));
  EXPECT_EQ(r, (std::vector<int>{0, 2, 1, 3}));  // the first ring without 0 -> 1
  for (int i = 0; i < 4; ++i) EXPECT_FALSE(r[i] == 0 && r[(i + 1) % 4] == 1);
  // Three sites: only the reversed ring avoids it.
  Matrix bw3 = Full(3, 100);
  bw3[0][1] = 1;
  EXPECT_EQ(ChooseRing(bw3, Full(3, 0.01)), (std::vector<int>{0, 2, 1}));
}

TEST(ChooseRing, AvoidsASlowSiteWhenPossible) {
  // Site 2 reaches only site 3 fast and is reached fast only from site 1.
  Matrix bw = Full(4, 10);
  bw[1][2] = 100;
  bw[2][3] = 100;
  bw[0][1] = bw[3][0] = 100;
  EXPECT_EQ(ChooseRing(bw, Full(4, 0.01)), (std::vector<int>{0, 1, 2, 3}));
  bw = Full(4, 10);
  bw[0][3] = bw[3][2] = bw[2][1] = bw[1][0] = 100;
  EXPECT_EQ(ChooseRing(bw, Full(4, 0.01)), (std::vector<int>{0, 3, 2, 1}));
}

TEST(ChooseRing, UnavoidableSlowLinkStillGivesARing) {
  Matrix bw = Full(3, 100);
  bw[0][1] = bw[1][0] = 1;  // every ring of three uses one of them
  auto r = ChooseRing(bw, Full(3, 0.01));
  EXPECT_EQ(r, (std::vector<int>{0, 1, 2}));  // a tie everywhere: lexicographic
}

TEST(ChooseRing, BottleneckBeforeLatency) {
  Matrix bw = Full(3, 100), lat = Full(3, 0.010);
  bw[0][1] = 50;    // ring 0,1,2 has the worse bottleneck ...
  lat[0][2] = 0.5;  // ... though ring 0,2,1 has the worse latency
  EXPECT_EQ(ChooseRing(bw, lat), (std::vector<int>{0, 2, 1}));
}

TEST(ChooseRing, LatencyBreaksTies) {
  Matrix lat = Full(4, 0.030);
  lat[0][2] = lat[2][1] = lat[1][3] = lat[3][0] = 0.005;
  EXPECT_EQ(ChooseRing(Full(4, 100), lat), (std::vector<int>{0, 2, 1, 3}));
}

TEST(ChooseRing, GreedyBeyondEightSites) {
  const int n = 10;
  Matrix bw = Full(n, 10);
  // The fast path visits sites in the order 0, 9, 8, ..., 1.
  for (int i = 0; i < n; ++i) bw[i][(i + n - 1) % n] = 100;
  auto r = ChooseRing(bw, Full(n, 0.01));
  std::vector<int> expect{0};
  for (int i = n - 1; i >= 1; --i) expect.push_back(i);
  EXPECT_EQ(r, expect);
  auto sorted = r;
  std::sort(sorted.begin(), sorted.end());
  for (int i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i);
}

TEST(ChooseRing, ExhaustiveIsOptimalForEight) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> u(1, 100);
  const int n = 8;
  Matrix bw = Full(n, 0), lat = Full(n, 0);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j)
      if (i != j) {
        bw[i][j] = std::round(u(rng));
        lat[i][j] = u(rng) / 1000;
      }
  auto r = ChooseRing(bw, lat);
  ASSERT_EQ(r.size(), size_t(n));
  EXPECT_EQ(r[0], 0);
  auto bottleneck = [&](const std::vector<int>& x) {
    double m = 1e300;
    for (int i = 0; i < n; ++i) m = std::min(m, bw[x[i]][x[(i + 1) % n]]);
    return m;
  };
  // No ring (sampled) has a better bottleneck.
  std::vector<int> p(n);
  for (int i = 0; i < n; ++i) p[i] = i;
  for (int t = 0; t < 2000; ++t) {
    std::shuffle(p.begin() + 1, p.end(), rng);
    EXPECT_LE(bottleneck(p), bottleneck(r));
  }
}

// ---------------------------------------------------------------------------------------------
// Collectives

TEST(Wan, AllReduceSumsOnTwoThreeFourSites) {
  for (int n : {2, 3, 4}) {
    SCOPED_TRACE(fmt::format("{} sites", n));
    auto w = Start(n, SmallChunks(4096));
    ASSERT_EQ(w->eps[0]->ring().size(), size_t(n));
    for (size_t count : {size_t(0), size_t(1), size_t(3), size_t(1000), size_t(100003)})
      CheckAllReduce<float>(*w, count);
    CheckAllReduce<double>(*w, 777);
    CheckAllReduce<int64_t>(*w, 4099);
    CheckAllReduce<int32_t>(*w, 1025);
  }
}

TEST(Wan, AllReduceBitwiseIdenticalOnEverySite) {
  auto w = Start(3, SmallChunks(1000));
  const size_t count = 12345;
  std::vector<std::vector<float>> out(3);
  w->Run([&](Communicator& c, int s) {
    std::mt19937 rng(s);
    std::normal_distribution<float> g;
    out[s].resize(count);
    for (auto& x : out[s]) x = g(rng);
    ASSERT_TRUE(c.AllReduce(std::span<float>(out[s])).ok());
  });
  EXPECT_EQ(std::memcmp(out[0].data(), out[1].data(), count * 4), 0);
  EXPECT_EQ(std::memcmp(out[0].data(), out[2].data(), count * 4), 0);
}

TEST(Wan, ReduceScatterAndAllGather) {
  auto w = Start(3, SmallChunks(256));
  for (size_t count : {size_t(1), size_t(1000)}) {
    w->Run([&](Communicator& c, int s) {
      const int n = c.size();
      std::vector<double> send(count * n), recv(count);
      for (size_t i = 0; i < send.size(); ++i) send[i] = Value<double>(s, i);
      Status st = c.ReduceScatter(std::span<const double>(send), std::span<double>(recv));
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (size_t i = 0; i < count; ++i) {
        double e = 0;
        for (int q = 0; q < n; ++q) e += Value<double>(q, s * count + i);
        ASSERT_EQ(recv[i], e) << "site " << s << " element " << i;
      }
      std::vector<int64_t> mine(count), all(count * n);
      for (size_t i = 0; i < count; ++i) mine[i] = Value<int64_t>(s, i);
      st = c.AllGather(std::span<const int64_t>(mine), std::span<int64_t>(all));
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (int q = 0; q < n; ++q)
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(all[q * count + i], Value<int64_t>(q, i));
    });
  }
}

TEST(Wan, BroadcastFromEveryRoot) {
  auto w = Start(4, SmallChunks(512));
  for (int root = 0; root < 4; ++root) {
    w->Run([&](Communicator& c, int s) {
      std::vector<float> v(3001);
      for (size_t i = 0; i < v.size(); ++i) v[i] = s == root ? Value<float>(root, i) : -1.0f;
      Status st = c.Broadcast(std::span<float>(v), root);
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], Value<float>(root, i));
    });
  }
}

TEST(Wan, SendRecvTagsOrderAndSelf) {
  auto w = Start(3, SmallChunks(100));
  w->Run([&](Communicator& c, int s) {
    const int n = c.size(), to = (s + 1) % n, from = (s + n - 1) % n;
    std::vector<int32_t> a(1000), b(7);
    for (size_t i = 0; i < a.size(); ++i) a[i] = int32_t(s * 100000 + i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = int32_t(-s - int(i));
    // Receives first, waited on out of order; two messages on one tag arrive in order.
    std::vector<int32_t> ra(1000), rb(7), rb2(7), self(5), empty;
    CommHandle h1 = c.IRecv(std::span<int32_t>(ra), from, 3);
    CommHandle h2 = c.IRecv(std::span<int32_t>(rb), from, 4);
    CommHandle h3 = c.IRecv(std::span<int32_t>(rb2), from, 4);
    ASSERT_TRUE(c.Send(std::span<const int32_t>(b), to, 4).ok());
    ASSERT_TRUE(c.Send(std::span<const int32_t>(a), to, 3).ok());
    std::vector<int32_t> b2 = b;
    b2[0] = 42;
    ASSERT_TRUE(c.Send(std::span<const int32_t>(b2), to, 4).ok());
    Status st = h3.Wait();
    ASSERT_TRUE(st.ok()) << st.ToString();
    ASSERT_TRUE(h2.Wait().ok());
    ASSERT_TRUE(h1.Wait().ok());
    for (size_t i = 0; i < ra.size(); ++i) ASSERT_EQ(ra[i], int32_t(from * 100000 + i));
    for (size_t i = 0; i < rb.size(); ++i) ASSERT_EQ(rb[i], int32_t(-from - int(i)));
    EXPECT_EQ(rb2[0], 42);
    // To itself, and an empty message.
    std::vector<int32_t> five{1, 2, 3, 4, 5};
    ASSERT_TRUE(c.Send(std::span<const int32_t>(five), s, 9).ok());
    ASSERT_TRUE(c.Recv(std::span<int32_t>(self), s, 9).ok());
    EXPECT_EQ(self, five);
    ASSERT_TRUE(c.Send(std::span<const int32_t>(empty), to, 0).ok());
    ASSERT_TRUE(c.Recv(std::span<int32_t>(empty), from, 0).ok());
    // A message of another size is an error naming it.
    ASSERT_TRUE(c.Send(std::span<const int32_t>(b), to, 5).ok());
    std::vector<int32_t> wrong(8, 0);
    st = c.Recv(std::span<int32_t>(wrong), from, 5);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("the message has 7 elements"), std::string::npos) << st.message();
    EXPECT_EQ(wrong, std::vector<int32_t>(8, 0));
  });
}

TEST(Wan, NonBlockingInFlightAndExchange) {
  auto w = Start(3, SmallChunks(4096));
  w->Run([&](Communicator& c, int s) {
    std::vector<std::vector<float>> v(4, std::vector<float>(5000));
    std::vector<CommHandle> hs;
    for (int k = 0; k < 4; ++k) {
      for (size_t i = 0; i < v[k].size(); ++i) v[k][i] = float(k + s);
      hs.push_back(c.IAllReduce(std::span<float>(v[k])));
    }
    // Every site receives before it sends: the sends must not wait behind the receives.
    const int n = c.size();
    std::vector<double> in(10000), out(10000, double(s));
    CommHandle r = c.IRecv(std::span<double>(in), (s + n - 1) % n, 1);
    CommHandle sd = c.ISend(std::span<const double>(out), (s + 1) % n, 1);
    ASSERT_TRUE(c.Barrier().ok());
    ASSERT_TRUE(r.Wait().ok());
    ASSERT_TRUE(sd.Wait().ok());
    EXPECT_EQ(in[9999], double((s + n - 1) % n));
    for (int k = 3; k >= 0; --k) {
      Status st = hs[k].Wait();
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(v[k][4999], float(3 * k + 0 + 1 + 2));
    }
  });
  auto st = w->eps[0]->stats();
  EXPECT_GT(st.bytes_sent, 0u);
  EXPECT_GT(st.bytes_received, 0u);
  EXPECT_GE(st.operations, 7);
  EXPECT_GT(st.seconds, 0.0);
}

TEST(Wan, OneSiteWorld) {
  auto w = Start(1);
  ASSERT_TRUE(w->comms[0]);
  Communicator& c = *w->comms[0];
  EXPECT_EQ(c.size(), 1);
  EXPECT_EQ(w->eps[0]->ring(), std::vector<int>{0});
  std::vector<float> v{1, 2, 3}, out(3);
  ASSERT_TRUE(c.AllReduce(std::span<float>(v)).ok());
  EXPECT_EQ(v, (std::vector<float>{1, 2, 3}));
  ASSERT_TRUE(c.AllGather(std::span<const float>(v), std::span<float>(out)).ok());
  EXPECT_EQ(out, v);
  ASSERT_TRUE(c.Broadcast(std::span<float>(v), 0).ok());
  ASSERT_TRUE(c.Barrier().ok());
  ASSERT_TRUE(c.Send(std::span<const float>(v), 0, 1).ok());
  ASSERT_TRUE(c.Recv(std::span<float>(out), 0, 1).ok());
  EXPECT_EQ(out, v);
}

TEST(Wan, UnsupportedAndBadArguments) {
  auto w = Start(2);
  w->Run([&](Communicator& c, int s) {
    EXPECT_EQ(c.label(), fmt::format("site {}", s));
    std::vector<uint8_t> b(4);
    Status st = c.AllReduce(b.data(), b.size(), DType::kByte);
    EXPECT_FALSE(st.ok());
    EXPECT_NE(st.message().find("sum is not defined"), std::string::npos) << st.message();
    st = c.Send(b.data(), 4, DType::kByte, 5, 0);
    EXPECT_NE(st.message().find("not a rank"), std::string::npos) << st.message();
    EXPECT_FALSE(c.Split(0, 0).ok());
  });
}

// ---------------------------------------------------------------------------------------------
// Link emulation

TEST(Wan, LatencyBoundsASmallAllReduce) {
  const double latency_ms = 20;
  auto w = Start(3, [&](WanOptions& o) {
    o.link = [&](int, int) { return LinkProfile{latency_ms, 0, 0}; };
  });
  std::vector<double> start(3), end(3);
  w->Run([&](Communicator& c, int s) {
    std::vector<float> v(10, 1.0f);
    start[s] = NowSeconds();
    ASSERT_TRUE(c.AllReduce(std::span<float>(v)).ok());
    end[s] = NowSeconds();
    EXPECT_EQ(v[0], 3.0f);
  });
  // Every chunk crosses 2 (n - 1) links one after the other.
  const double first = *std::min_element(start.begin(), start.end());
  for (int s = 0; s < 3; ++s) EXPECT_GE(end[s] - first, 4 * latency_ms * 1e-3 * 0.999) << s;
}

TEST(Wan, BandwidthBoundsALargeSend) {
  auto w = Start(2, [](WanOptions& o) { o.link = [](int, int) { return LinkProfile{0, 80, 0}; }; });
  const size_t bytes = 4 << 20;
  std::vector<std::vector<uint8_t>> bufs(2);
  for (int s = 0; s < 2; ++s) bufs[size_t(s)].assign(bytes, uint8_t(s == 0 ? 7 : 0));
  // Both ends are timed from one instant taken before either starts: the receiver cannot be
  // done before the last byte has crossed the link after the sender began, however late the
  // receiver's own thread starts (a per-thread start made this fail by 0.3 ms once).
  std::vector<double> end(2);
  const double t0 = NowSeconds();
  w->Run([&](Communicator& c, int s) {
    std::vector<uint8_t>& buf = bufs[size_t(s)];
    Status st =
        s == 0 ? c.Send(std::span<const uint8_t>(buf), 1) : c.Recv(std::span<uint8_t>(buf), 0);
    end[size_t(s)] = NowSeconds();
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(buf[bytes - 1], 7);
  });
  const double bound = double(bytes) * 8 / 80e6;  // 0.42 s at 80 Mbit/s
  EXPECT_GE(end[0] - t0, bound);
  EXPECT_GE(end[1] - t0, bound);
}

TEST(Wan, JitteredLinksKeepOrderAndPace) {
  // 100 Mbit/s with jitter: chunks still arrive in order, sums are exact, and the all-reduce
  // cannot beat the bandwidth: each link carries 2 (n - 1) / n of the buffer.
  auto w = Start(3, [](WanOptions& o) {
    o.chunk_bytes = 64 << 10;
    o.seed = 5;
    o.link = [](int, int) { return LinkProfile{5, 100, 4}; };
  });
  const size_t count = (1 << 20) / 4;
  std::vector<double> start(3), end(3);
  w->Run([&](Communicator& c, int s) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = Value<float>(s, i);
    start[s] = NowSeconds();
    Status st = c.AllReduce(std::span<float>(v));
    end[s] = NowSeconds();
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], Value<float>(0, i) + Value<float>(1, i) + Value<float>(2, i));
  });
  const double first = *std::min_element(start.begin(), start.end());
  const double bound = 2.0 * 2 / 3 * (1 << 20) * 8 / 100e6;
  for (int s = 0; s < 3; ++s) EXPECT_GE(end[s] - first, bound) << s;
}

// The probe at connect (7 x 128 KB a link) takes 1.5 s over the slow link against 37 ms over the
// others: a stall of the machine under 1.4 s while a fast link is probed cannot hide which is slow.
TEST(Wan, RingAvoidsASlowLinkMeasuredAtConnect) {
  auto w = Start(3, [](WanOptions& o) {
    o.link = [](int from, int to) {
      return LinkProfile{1, from == 0 && to == 1 ? 5.0 : 200.0, 0};
    };
  });
  for (int s = 0; s < 3; ++s) EXPECT_EQ(w->eps[s]->ring(), (std::vector<int>{0, 2, 1})) << s;
  CheckAllReduce<float>(*w, 1000);
}

// ---------------------------------------------------------------------------------------------
// Validation

// Corrupts chunks from site 0 to site 1 during one all-reduce; every site must fail it, the
// message must name `check`, and the buffers must be unchanged.
void ExpectCorruptAllReduceFails(const std::function<void(wan::Chunk&)>& corrupt,
                                 const std::string& check, bool world_survives) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 10; });
  std::vector<Status> st(2);
  {
    HookGuard g([&](int from, int to, wan::Chunk& c) {
      if (from == 0 && to == 1) corrupt(c);
    });
    w->Run([&](Communicator& c, int s) {
      std::vector<float> v(1000, float(s + 1));
      st[s] = c.AllReduce(std::span<float>(v));
      for (float x : v) ASSERT_EQ(x, float(s + 1)) << "the buffer changed on site " << s;
    });
  }
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find(check), std::string::npos) << st[1].message();
  EXPECT_NE(st[1].message().find("site 0"), std::string::npos) << st[1].message();
  EXPECT_NE(st[1].message().find("all_reduce of 1000 float32"), std::string::npos)
      << st[1].message();
  ASSERT_FALSE(st[0].ok());
  EXPECT_NE(st[0].message().find("site 1"), std::string::npos) << st[0].message();
  if (world_survives) CheckAllReduce<float>(*w, 1000);  // the late chunks are dropped
}

TEST(Wan, CorruptPayloadFailsOnChecksum) {
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { (*c.mutable_payload())[5] ^= 0x10; },
                              "checksum mismatch", true);
}

TEST(Wan, WrongChecksumFails) {
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { c.set_checksum(c.checksum() + 1); },
                              "checksum mismatch", true);
}

TEST(Wan, WrongOpSeqFails) {
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { c.set_op_seq(c.op_seq() + 1000); }, "op_seq",
                              false);
}

TEST(Wan, OutOfRangeOffsetFails) {
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { c.set_offset(c.total()); }, "outside the buffer",
                              false);
}

TEST(Wan, WrongSenderOrVersionPoisonsTheStream) {
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { c.set_from_site(1); }, "from_site", false);
  ExpectCorruptAllReduceFails([](wan::Chunk& c) { c.set_version(99); }, "protocol version", false);
}

// The payload fault (fault injection: a payload corrupted in the sender's memory before it was
// checksummed) is accepted by the receiver: the checksum cannot see it. In a 2-site ring
// all-reduce, site 0's first chunk is the reduce-scatter half (its sum reaches both sites), its
// second the all-gather half (only site 1 takes it). Removing the fault ends it.
TEST(Wan, PayloadFaultBeforeTheChecksumIsAccepted) {
  auto w = Start(2);
  std::atomic<int> chunks{0}, strike{-1};
  w->eps[0]->SetPayloadFault([&](int to, uint32_t op, std::string* payload) {
    EXPECT_EQ(to, 1);
    EXPECT_EQ(op, uint32_t(CommOp::kAllReduce));
    if (chunks++ != strike.load()) return;
    float x;
    std::memcpy(&x, payload->data(), sizeof x);
    x += 1000;
    std::memcpy(payload->data(), &x, sizeof x);
  });
  auto run = [&](int which) {
    chunks = 0;
    strike = which;
    std::vector<std::vector<float>> out(2);
    w->Run([&](Communicator& c, int s) {
      std::vector<float> v(8, float(s + 1));
      ASSERT_TRUE(c.AllReduce(std::span<float>(v)).ok());
      out[size_t(s)] = v;
    });
    return out;
  };
  const auto clean = run(-1);
  for (const auto& v : clean)
    for (float x : v) EXPECT_EQ(x, 3.0f);
  const auto rs = run(0), ag = run(1);
  EXPECT_EQ(chunks.load(), 2);
  EXPECT_EQ(rs[0], rs[1]);  // the corrupted sum, on both sites
  EXPECT_NE(rs[0], clean[0]);
  EXPECT_EQ(ag[0], clean[0]);  // site 0 kept its own block
  EXPECT_NE(ag[1], clean[1]);
  w->eps[0]->SetPayloadFault(nullptr);
  EXPECT_EQ(run(0), clean);
}

TEST(Wan, CorruptSendFailsTheReceive) {
  auto w = Start(2);
  HookGuard g([](int, int, wan::Chunk& c) {
    if (!c.payload().empty()) (*c.mutable_payload())[0] ^= 1;
  });
  std::vector<Status> st(2);
  w->Run([&](Communicator& c, int s) {
    std::vector<double> v(100, s == 0 ? 1.0 : 0.0);
    st[s] = s == 0 ? c.Send(std::span<const double>(v), 1, 2) : c.Recv(std::span<double>(v), 0, 2);
    if (s == 1) {
      for (double x : v) ASSERT_EQ(x, 0.0);
    }
  });
  EXPECT_TRUE(st[0].ok()) << st[0].ToString();
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("recv of 100 float64 from rank 0 (tag 2)"), std::string::npos)
      << st[1].message();
  EXPECT_NE(st[1].message().find("checksum mismatch"), std::string::npos) << st[1].message();
}

TEST(Wan, UnstagedReceivesWriteVerifiedChunks) {
  auto w = Start(2, [](WanOptions& o) {
    o.stage_receives = false;
    o.chunk_bytes = 1000;
  });
  w->Run([&](Communicator& c, int s) {
    std::vector<double> v(10007);
    for (size_t i = 0; i < v.size(); ++i) v[i] = s == 0 ? Value<double>(0, i) : -1.0;
    Status st = s == 0 ? c.Send(std::span<const double>(v), 1) : c.Recv(std::span<double>(v), 0);
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], Value<double>(0, i));
  });
  HookGuard g([](int, int, wan::Chunk& c) {
    if (c.offset() > 0) c.set_checksum(c.checksum() ^ 1);  // the second chunk on
  });
  std::vector<Status> st(2);
  w->Run([&](Communicator& c, int s) {
    std::vector<double> v(10007, s == 0 ? 1.0 : 0.0);
    st[s] = s == 0 ? c.Send(std::span<const double>(v), 1) : c.Recv(std::span<double>(v), 0);
    if (s == 1) {
      EXPECT_EQ(v[0], 1.0);  // the first chunk was verified and written
      EXPECT_EQ(v.back(), 0.0);
    }
  });
  EXPECT_TRUE(st[0].ok());
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("checksum mismatch"), std::string::npos) << st[1].message();
}

TEST(Wan, MismatchedCollectivesFail) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 10; });
  std::vector<Status> st(2);
  w->Run([&](Communicator& c, int s) {
    std::vector<float> v(s == 0 ? 100 : 101, 1.0f);
    st[s] = c.AllReduce(std::span<float>(v));
  });
  for (int s = 0; s < 2; ++s) {
    ASSERT_FALSE(st[s].ok());
    EXPECT_NE(st[s].message().find("elements there"), std::string::npos) << st[s].message();
  }
}

}  // namespace
}  // namespace atl
