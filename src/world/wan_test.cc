// WAN transport: collectives among endpoints in one process (a thread per site) on loopback,
// link emulation bounds, validation of every chunk, authentication, timeouts, ring choice.
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
#include "world/wan_internal.h"

namespace atl {
namespace {

WorldSecurity Insecure() {
  WorldSecurity s;
  s.insecure = true;
  return s;
}

// n sites, each with its own endpoint, connected concurrently.
struct World {
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::unique_ptr<Communicator>> comms;

  ~World() {
    comms.clear();
    eps.clear();
  }

  // Runs fn(comm, site) on one thread per site.
  void Run(const std::function<void(Communicator&, int)>& fn) {
    std::vector<std::thread> threads;
    for (int s = 0; s < int(comms.size()); ++s) threads.emplace_back([&, s] { fn(*comms[s], s); });
    for (auto& t : threads) t.join();
  }
};

using Tweak = std::function<void(WanOptions&)>;

// Listens on n loopback endpoints and connects them; the statuses of the Connect calls.
std::vector<Status> TryStart(World& w, int n, const Tweak& tweak = nullptr,
                             std::vector<WorldSecurity> security = {}) {
  if (security.empty()) security.assign(n, Insecure());
  std::vector<WanPeer> peers;
  for (int s = 0; s < n; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", security[s]);
    EXPECT_TRUE(ep.ok()) << ep.status().ToString();
    if (!ep.ok()) return {ep.status()};
    peers.push_back({s, (*ep)->address()});
    w.eps.push_back(std::move(*ep));
  }
  w.comms.resize(n);
  std::vector<Status> st(n);
  std::vector<std::thread> threads;
  for (int s = 0; s < n; ++s) {
    threads.emplace_back([&, s] {
      WanOptions o;
      o.site = s;
      o.peers = peers;
      o.timeout_s = 30;
      if (tweak) tweak(o);
      auto c = w.eps[s]->Connect(o);
      if (c.ok())
        w.comms[s] = std::move(*c);
      else
        st[s] = c.status();
    });
  }
  for (auto& t : threads) t.join();
  return st;
}

std::unique_ptr<World> Start(int n, const Tweak& tweak = nullptr,
                             std::vector<WorldSecurity> security = {}) {
  auto w = std::make_unique<World>();
  auto st = TryStart(*w, n, tweak, std::move(security));
  for (size_t s = 0; s < st.size(); ++s) EXPECT_TRUE(st[s].ok()) << st[s].ToString();
  return w;
}

Tweak SmallChunks(size_t bytes) {
  return [bytes](WanOptions& o) { o.chunk_bytes = bytes; };
}

template <class T>
T Value(int site, size_t i) {
  if constexpr (sizeof(T) == 8 && std::is_integral_v<T>)
    return T(i) * 1000003 + (T(site) << 40);
  else if constexpr (std::is_integral_v<T>)
    return T(i) * 3 + T(site) * 100000;
  else
    return T(double((i * 7 + size_t(site) * 3) % 1000) * 0.25);  // sums are exact
}

template <class T>
void CheckAllReduce(World& w, size_t count) {
  const int n = int(w.comms.size());
  std::vector<T> expect(count, T(0));
  for (int s = 0; s < n; ++s)
    for (size_t i = 0; i < count; ++i) expect[i] += Value<T>(s, i);
  w.Run([&](Communicator& c, int s) {
    std::vector<T> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = Value<T>(s, i);
    Status st = c.AllReduce(std::span<T>(v));
    ASSERT_TRUE(st.ok()) << st.ToString();
    for (size_t i = 0; i < count; ++i)
      ASSERT_EQ(v[i], expect[i]) << "site " << s << " element " << i << " of " << count;
  });
}

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
  std::vector<double> took(2);
  w->Run([&](Communicator& c, int s) {
    std::vector<uint8_t> buf(bytes, uint8_t(s == 0 ? 7 : 0));
    const double t0 = NowSeconds();
    Status st =
        s == 0 ? c.Send(std::span<const uint8_t>(buf), 1) : c.Recv(std::span<uint8_t>(buf), 0);
    took[s] = NowSeconds() - t0;
    ASSERT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(buf[bytes - 1], 7);
  });
  EXPECT_GE(took[0], 0.4);  // 4 MiB * 8 / 80e6 = 0.42 s
  EXPECT_GE(took[1], 0.4);
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

TEST(Wan, RingAvoidsASlowLinkMeasuredAtConnect) {
  auto w = Start(3, [](WanOptions& o) {
    o.link = [](int from, int to) {
      return LinkProfile{1, from == 0 && to == 1 ? 20.0 : 200.0, 0};
    };
  });
  for (int s = 0; s < 3; ++s) EXPECT_EQ(w->eps[s]->ring(), (std::vector<int>{0, 2, 1})) << s;
  CheckAllReduce<float>(*w, 1000);
}

// ---------------------------------------------------------------------------------------------
// Validation

struct HookGuard {
  explicit HookGuard(WanChunkHook h) { SetWanChunkHookForTesting(std::move(h)); }
  ~HookGuard() { SetWanChunkHookForTesting(nullptr); }
};

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

// ---------------------------------------------------------------------------------------------
// Connecting, timeouts, authentication

int FreePort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a));
  socklen_t len = sizeof(a);
  getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  close(fd);
  return ntohs(a.sin_port);
}

TEST(Wan, PeerThatNeverListensTimesOutNamingIt) {
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  const std::string dead = fmt::format("127.0.0.1:{}", FreePort());
  WanOptions o;
  o.site = 0;
  o.peers = {{0, (*ep)->address()}, {1, dead}};
  o.timeout_s = 1.5;
  const double t0 = NowSeconds();
  auto c = (*ep)->Connect(o);
  const double took = NowSeconds() - t0;
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("site 1 (" + dead + ")"), std::string::npos)
      << c.status().message();
  EXPECT_NE(c.status().message().find("did not answer within 1.5 s"), std::string::npos)
      << c.status().message();
  EXPECT_GE(took, 1.4);
  EXPECT_LT(took, 10);
}

TEST(Wan, PeerThatNeverCallsConnectTimesOutNamingIt) {
  auto a = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  auto b = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(a.ok() && b.ok());
  WanOptions o;
  o.site = 0;
  o.peers = {{0, (*a)->address()}, {1, (*b)->address()}};
  o.timeout_s = 1;
  auto c = (*a)->Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("site 1"), std::string::npos) << c.status().message();
  EXPECT_NE(c.status().message().find("has not called Connect"), std::string::npos)
      << c.status().message();
}

TEST(Wan, PeerThatVanishesFailsTheOperation) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 5; });
  w->comms[1].reset();
  w->eps[1].reset();  // its streams close
  std::vector<float> v(10, 1.0f);
  const double t0 = NowSeconds();
  Status st = w->comms[0]->AllReduce(std::span<float>(v));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("site 1"), std::string::npos) << st.message();
  EXPECT_LT(NowSeconds() - t0, 10);
  EXPECT_EQ(v[0], 1.0f);
}

TEST(Wan, PeerThatStallsTimesOutNamingIt) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 1; });
  std::vector<float> v(100, 1.0f);
  const double t0 = NowSeconds();
  Status st = w->comms[0]->AllReduce(std::span<float>(v));  // site 1 never joins
  ASSERT_FALSE(st.ok());
  EXPECT_GE(NowSeconds() - t0, 0.99);
  EXPECT_NE(st.message().find("site 0: all_reduce of 100 float32: timed out after 1 s waiting for "
                              "site 1"),
            std::string::npos)
      << st.message();
  EXPECT_EQ(v[0], 1.0f);
  // Site 0 told site 1, which fails the operation when it gets to it.
  st = w->comms[1]->AllReduce(std::span<float>(v));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("site 0 gave it up: timed out"), std::string::npos) << st.message();
  // Both dropped the failed operation's chunks: the next one works.
  CheckAllReduce<double>(*w, 1000);
}

TEST(Wan, InvalidOptions) {
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  WanOptions o;
  o.site = 2;
  o.peers = {{0, "127.0.0.1:1"}, {1, "127.0.0.1:2"}};
  auto c = (*ep)->Connect(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("site 2 is not one of the 2 peers"), std::string::npos);
  o.site = 0;
  o.peers = {{1, "127.0.0.1:1"}, {0, "127.0.0.1:2"}};
  c = (*ep)->Connect(o);
  EXPECT_NE(c.status().message().find("ordered by site"), std::string::npos);
  o.peers = {{0, ""}, {1, "127.0.0.1:2"}};
  o.link = [](int, int) { return LinkProfile{-1, 0, 0}; };
  c = (*ep)->Connect(o);
  EXPECT_NE(c.status().message().find("latency_ms"), std::string::npos) << c.status().message();
  EXPECT_FALSE(WanEndpoint::Listen("256.1.1.1:0", Insecure()).ok());
}

// ---------------------------------------------------------------------------------------------
// Absent sites, rejoining, snapshots

// `from` sends `count` values to `to` on `tag`; they arrive exactly.
void ExpectMessage(Communicator& from, Communicator& to, int tag, size_t count) {
  std::vector<int64_t> out(count), in(count, -1);
  for (size_t i = 0; i < count; ++i) out[i] = Value<int64_t>(from.rank(), i) + tag;
  CommHandle h = from.ISend(std::span<const int64_t>(out), to.rank(), tag);
  Status st = to.Recv(std::span<int64_t>(in), from.rank(), tag);
  ASSERT_TRUE(st.ok()) << st.ToString();
  st = h.Wait();
  ASSERT_TRUE(st.ok()) << st.ToString();
  ASSERT_EQ(in, out) << "site " << from.rank() << " -> site " << to.rank() << " tag " << tag;
}

// Runs the calls at once, one thread each; their statuses.
std::vector<Status> Concurrently(const std::vector<std::function<Status()>>& calls) {
  std::vector<Status> st(calls.size());
  std::vector<std::thread> threads;
  for (size_t i = 0; i < calls.size(); ++i) threads.emplace_back([&, i] { st[i] = calls[i](); });
  for (auto& t : threads) t.join();
  return st;
}

TEST(WanRejoin, CrashedSiteRejoinsAndTalksToEveryPeer) {
  auto w = Start(3, [](WanOptions& o) {
    o.chunk_bytes = 4096;
    o.timeout_s = 10;
  });
  ExpectMessage(*w->comms[0], *w->comms[2], 5, 1000);
  const uint64_t sent0 = w->eps[0]->stats().bytes_sent;
  // Site 2 crashes; sites 0 and 1 keep talking.
  w->comms[2].reset();
  w->eps[2].reset();
  ExpectMessage(*w->comms[0], *w->comms[1], 1, 100);
  ExpectMessage(*w->comms[1], *w->comms[0], 1, 100);

  // A new process for site 2: it connects alone (both peers absent), at once.
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  const std::string a2 = (*ep)->address();
  WanOptions o;
  o.site = 2;
  o.peers = {{0, ""}, {1, ""}, {2, a2}};
  o.chunk_bytes = 4096;
  o.timeout_s = 10;
  const double t0 = NowSeconds();
  auto c2 = (*ep)->Connect(o);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_LT(NowSeconds() - t0, 1.0);
  EXPECT_EQ((*ep)->ring(), (std::vector<int>{0, 1, 2}));
  std::vector<int64_t> v(10);
  Status st = (*c2)->Send(std::span<const int64_t>(v), 0, 1);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("site 0 is not connected"), std::string::npos) << st.message();

  // Each live site and the new one reconnect with each other, all at once.
  const std::string a0 = w->eps[0]->address(), a1 = w->eps[1]->address();
  WanEndpoint* e2 = ep->get();
  auto rs = Concurrently(
      {[&] { return w->eps[0]->Reconnect(2, a2); }, [&] { return w->eps[1]->Reconnect(2, a2); },
       [&] { return e2->Reconnect(0, a0); }, [&] { return e2->Reconnect(1, a1); }});
  for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
  w->eps[2] = std::move(*ep);
  w->comms[2] = std::move(*c2);

  for (int s : {0, 1}) {
    ExpectMessage(*w->comms[s], *w->comms[2], 10 + s, 5000);  // several chunks
    ExpectMessage(*w->comms[2], *w->comms[s], 20 + s, 5000);
  }
  // Tag 5 was used with the old site 2: numbering starts again on both sides.
  ExpectMessage(*w->comms[0], *w->comms[2], 5, 1000);
  ExpectMessage(*w->comms[0], *w->comms[1], 1, 100);
  EXPECT_GE(w->eps[0]->stats().bytes_sent, sent0 + (5000 + 1000 + 100 + 100) * 8);

  // Collectives are not supported after a Reconnect: every site fails at once.
  w->Run([&](Communicator& c, int s) {
    std::vector<float> x(10, 1.0f);
    Status r = c.AllReduce(std::span<float>(x));
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << r.ToString();
    EXPECT_NE(r.message().find("not supported after a Reconnect"), std::string::npos)
        << r.message();
    EXPECT_EQ(x[0], 1.0f);
  });
}

TEST(WanRejoin, OldIncarnationStillRunningIsCutOff) {
  // Site 1 is replaced while its old process still runs (hung or cut off, not dead): its stream
  // into site 0 is still open when the new one arrives.
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 10; });
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  const std::string a0 = w->eps[0]->address(), a1 = (*ep)->address();
  WanOptions o;
  o.site = 1;
  o.peers = {{0, ""}, {1, a1}};
  o.timeout_s = 10;
  auto c1 = (*ep)->Connect(o);
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  WanEndpoint* e1 = ep->get();
  auto rs = Concurrently(
      {[&] { return w->eps[0]->Reconnect(1, a1); }, [&] { return e1->Reconnect(0, a0); }});
  for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
  // Whatever the old process still sends is not taken for the new one's messages.
  std::vector<int64_t> old(100, -1);
  (void)w->comms[1]->Send(std::span<const int64_t>(old), 0, 3);
  ExpectMessage(**c1, *w->comms[0], 3, 100);
  ExpectMessage(*w->comms[0], **c1, 3, 100);
  // The old process finds its links with site 0 gone.
  Status st = w->comms[1]->Recv(std::span<int64_t>(old), 0, 4);
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
}

TEST(WanRejoin, LiveSitesReconnectAndDropWhatTheOldStreamsHeld) {
  auto w = Start(2, [](WanOptions& o) { o.timeout_s = 10; });
  const std::string a0 = w->eps[0]->address(), a1 = w->eps[1]->address();
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE(fmt::format("round {}", round));
    // Sent but never received: the reconnect drops it, it is not taken for the next message.
    std::vector<int64_t> stale(50, -7);
    ASSERT_TRUE(w->comms[0]->Send(std::span<const int64_t>(stale), 1, 7).ok());
    // Either side may be first.
    const int late = round % 2 == 0 ? 1 : 0;
    auto delayed = [&](int s, const std::string& peer) {
      if (s == late) std::this_thread::sleep_for(std::chrono::milliseconds(300));
      return w->eps[s]->Reconnect(1 - s, peer);
    };
    auto rs = Concurrently({[&] { return delayed(0, a1); }, [&] { return delayed(1, a0); }});
    for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
    ExpectMessage(*w->comms[0], *w->comms[1], 7, 50);
    ExpectMessage(*w->comms[1], *w->comms[0], 7, 3000);
  }
}

TEST(WanRejoin, OperationsWithAnAbsentPeerFailAtOnce) {
  World w;
  std::vector<WanPeer> peers;
  for (int s = 0; s < 2; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
    ASSERT_TRUE(ep.ok());
    peers.push_back({s, (*ep)->address()});
    w.eps.push_back(std::move(*ep));
  }
  peers.push_back({2, ""});  // absent
  w.comms.resize(2);
  std::vector<Status> cs(2);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s) {
    threads.emplace_back([&, s] {
      WanOptions o;
      o.site = s;
      o.peers = peers;
      o.timeout_s = 30;  // nothing below may wait for it
      auto c = w.eps[s]->Connect(o);
      if (c.ok())
        w.comms[s] = std::move(*c);
      else
        cs[s] = c.status();
    });
  }
  for (auto& t : threads) t.join();
  for (const Status& c : cs) ASSERT_TRUE(c.ok()) << c.ToString();
  EXPECT_EQ(w.eps[0]->ring(), (std::vector<int>{0, 1, 2}));  // in site order, unmeasured

  const double t0 = NowSeconds();
  w.Run([&](Communicator& c, int s) {
    std::vector<float> v(100, 1.0f);
    auto expect_absent = [&](const Status& r, const char* what) {
      EXPECT_EQ(r.code(), StatusCode::kUnavailable) << what << ": " << r.ToString();
      EXPECT_NE(r.message().find(
                    "site 2 is not connected (absent when this site connected; see Reconnect)"),
                std::string::npos)
          << what << ": " << r.message();
    };
    expect_absent(c.Send(std::span<const float>(v), 2, 1), "send");
    expect_absent(c.Recv(std::span<float>(v), 2, 1), "recv");
    expect_absent(c.AllReduce(std::span<float>(v)), "all_reduce");
    expect_absent(c.Barrier(), "barrier");
    EXPECT_EQ(v[0], 1.0f);
  });
  EXPECT_LT(NowSeconds() - t0, 2.0);
  ExpectMessage(*w.comms[0], *w.comms[1], 3, 1000);
  ExpectMessage(*w.comms[1], *w.comms[0], 3, 1000);
}

TEST(WanRejoin, ReconnectFailsNamingWhatIsMissing) {
  // Two endpoints that each connected with the other absent.
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::string> addr;
  for (int s = 0; s < 2; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
    ASSERT_TRUE(ep.ok());
    addr.push_back((*ep)->address());
    eps.push_back(std::move(*ep));
  }
  Status st = eps[0]->Reconnect(1, addr[1]);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("Connect has not succeeded"), std::string::npos) << st.message();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int s = 0; s < 2; ++s) {
    WanOptions o;
    o.site = s;
    o.peers = {{0, s == 0 ? addr[0] : ""}, {1, s == 1 ? addr[1] : ""}};
    o.timeout_s = 1;
    auto c = eps[s]->Connect(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comms.push_back(std::move(*c));
  }
  st = eps[0]->Reconnect(0, addr[0]);
  EXPECT_NE(st.message().find("site 0 is this site"), std::string::npos) << st.message();
  st = eps[0]->Reconnect(2, addr[1]);
  EXPECT_NE(st.message().find("not a site of this world"), std::string::npos) << st.message();
  st = eps[0]->Reconnect(1, "");
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();

  // Nobody listens there.
  const std::string dead = fmt::format("127.0.0.1:{}", FreePort());
  double t0 = NowSeconds();
  st = eps[0]->Reconnect(1, dead);
  double took = NowSeconds() - t0;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("site 0: reconnect: site 1 (" + dead + ") did not answer within 1 s"),
            std::string::npos)
      << st.message();
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5);

  // The peer listens but does not call Reconnect.
  t0 = NowSeconds();
  st = eps[0]->Reconnect(1, addr[1]);
  took = NowSeconds() - t0;
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("site 1 (" + addr[1] +
                              "): no hello on a new stream from it within "
                              "1 s: it has not opened a new stream to this site"),
            std::string::npos)
      << st.message();
  EXPECT_GE(took, 0.9);
  EXPECT_LT(took, 5);

  // Both call it: it works, and so does the link.
  auto rs = Concurrently({[&] { return eps[0]->Reconnect(1, addr[1]); },
                          [&] { return eps[1]->Reconnect(0, addr[0]); }});
  for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
  ExpectMessage(*comms[0], *comms[1], 1, 2000);
  ExpectMessage(*comms[1], *comms[0], 1, 2000);
  comms.clear();
}

std::shared_ptr<const std::string> RandomBlob(size_t bytes, uint32_t seed) {
  auto b = std::make_shared<std::string>(bytes, '\0');
  std::mt19937 rng(seed);
  for (size_t i = 0; i + 4 <= bytes; i += 4) {
    const uint32_t x = rng();
    std::memcpy(b->data() + i, &x, 4);
  }
  return b;
}

struct FetchHookGuard {
  explicit FetchHookGuard(WanFetchHook h) { SetWanFetchHookForTesting(std::move(h)); }
  ~FetchHookGuard() { SetWanFetchHookForTesting(nullptr); }
};

TEST(WanSnapshot, FetchRoundTripsPacedAndNotFound) {
  // 400 Mbit/s, 5 ms: 5 MB take >= 0.1 s.
  auto w = Start(2, [](WanOptions& o) {
    o.timeout_s = 10;
    o.link = [](int, int) { return LinkProfile{5, 400, 0}; };
  });
  const std::string a0 = w->eps[0]->address();
  auto f = FetchSnapshot(a0, Insecure(), 1, 0, 5);
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_NE(f.status().message().find("site 0 has published no snapshot"), std::string::npos)
      << f.status().message();

  auto blob = RandomBlob(5'000'000, 1);
  w->eps[0]->Publish(3, blob);
  f = FetchSnapshot(a0, Insecure(), 1, 4, 5);
  EXPECT_EQ(f.status().code(), StatusCode::kNotFound) << f.status().ToString();
  EXPECT_NE(f.status().message().find("no snapshot with index >= 4 (its latest is 3)"),
            std::string::npos)
      << f.status().message();

  const uint64_t sent = w->eps[0]->stats().bytes_sent;
  const double t0 = NowSeconds();
  f = FetchSnapshot(a0, Insecure(), 1, 3, 5);
  const double took = NowSeconds() - t0;
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->first, 3u);
  EXPECT_TRUE(f->second == *blob) << "the snapshot's bytes differ";
  EXPECT_GE(took, 5e6 * 8 / 400e6);
  EXPECT_GE(w->eps[0]->stats().bytes_sent, sent + blob->size());

  // Replaced, and an empty one.
  w->eps[0]->Publish(4, std::make_shared<const std::string>());
  f = FetchSnapshot(a0, Insecure(), 1, 0, 5);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->first, 4u);
  EXPECT_TRUE(f->second.empty());

  // Only the sites of the world may ask.
  f = FetchSnapshot(a0, Insecure(), 7, 0, 5);
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
  EXPECT_NE(f.status().message().find("refused this site"), std::string::npos)
      << f.status().message();
}

TEST(WanSnapshot, PublishDuringAFetchDoesNotChangeIt) {
  // 100 Mbit/s: 4 MB take ~0.34 s; a new snapshot is published meanwhile.
  auto w = Start(2, [](WanOptions& o) {
    o.timeout_s = 10;
    o.link = [](int, int) { return LinkProfile{1, 100, 0}; };
  });
  auto first = RandomBlob(4 << 20, 2);
  w->eps[0]->Publish(1, first);
  StatusOr<std::pair<uint64_t, std::string>> f = Status::Internal("not run");
  std::thread t([&] { f = FetchSnapshot(w->eps[0]->address(), Insecure(), 1, 1, 5); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  w->eps[0]->Publish(2, RandomBlob(1 << 20, 3));
  t.join();
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->first, 1u);
  EXPECT_TRUE(f->second == *first);
  f = FetchSnapshot(w->eps[0]->address(), Insecure(), 1, 2, 5);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_EQ(f->first, 2u);
}

TEST(WanSnapshot, CorruptPiecesAreDetected) {
  // Served from Listen on, before Connect.
  auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(ep.ok());
  auto blob = RandomBlob(3 << 20, 4);
  (*ep)->Publish(9, blob);
  const std::string a = (*ep)->address();
  {
    FetchHookGuard g([](int, int, wan::FetchChunk& p) {
      if (p.offset() == 1 << 20) (*p.mutable_data())[17] ^= 4;
    });
    auto f = FetchSnapshot(a, Insecure(), 1, 0, 5);
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
    EXPECT_NE(f.status().message().find("site 1: fetch snapshot from " + a + ": checksum mismatch"),
              std::string::npos)
        << f.status().message();
  }
  {
    FetchHookGuard g([](int, int, wan::FetchChunk& p) {
      if (p.offset() == 2 << 20) p.set_offset(p.offset() + 1);
    });
    auto f = FetchSnapshot(a, Insecure(), 1, 0, 5);
    EXPECT_EQ(f.status().code(), StatusCode::kCorruption) << f.status().ToString();
    EXPECT_NE(f.status().message().find("a piece at offset 2097153, expected 2097152"),
              std::string::npos)
        << f.status().message();
  }
  auto f = FetchSnapshot(a, Insecure(), 1, 9, 5);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->second == *blob);
}

// Certificates made with the openssl command line: a CA and one certificate for "atoll".
class TlsFiles {
 public:
  TlsFiles() {
    dir_ = std::filesystem::temp_directory_path() /
           fmt::format("atoll_wan_tls_{}_{}", getpid(), std::rand());
    std::filesystem::create_directories(dir_);
    const std::string d = dir_.string();
    std::ofstream(d + "/ext.cnf") << "subjectAltName=DNS:atoll\nbasicConstraints=CA:FALSE\n"
                                     "keyUsage=digitalSignature,keyEncipherment\n"
                                     "extendedKeyUsage=serverAuth,clientAuth\n";
    const std::string cmd = fmt::format(
        "cd {0} && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes "
        "-keyout ca.key -out ca.pem -days 2 -subj /CN=atoll-test-ca "
        "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign "
        "&& openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        "site-0.key -out site.csr -subj /CN=atoll "
        "&& openssl x509 -req -in site.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out "
        "site-0.pem -days 2 -extfile ext.cnf "
        "&& cp site-0.pem site-1.pem && cp site-0.key site-1.key "
        "&& openssl req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "
        "impostor.key -out impostor.csr -subj /CN=site-1 "
        "&& openssl x509 -req -in impostor.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out "
        "impostor.pem -days 2 -extfile ext.cnf "
        "&& echo 0123456789abcdef-token > token",
        d);
    ok_ = std::system(("(" + cmd + ") >/dev/null 2>&1").c_str()) == 0;
  }
  ~TlsFiles() { std::filesystem::remove_all(dir_); }
  bool ok() const { return ok_; }
  std::string dir() const { return dir_.string(); }

 private:
  std::filesystem::path dir_;
  bool ok_ = false;
};

TEST(WanTls, MutualTlsWithTokenWorksAndAWrongTokenIsRefused) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok()) << "openssl failed to make test certificates";
  std::vector<WorldSecurity> sec;
  for (int s = 0; s < 2; ++s) {
    auto x = LoadSecurity(files.dir(), fmt::format("site-{}", s));
    ASSERT_TRUE(x.ok()) << x.status().ToString();
    sec.push_back(*x);
  }
  {
    auto w = Start(2, SmallChunks(1000), sec);
    ASSERT_TRUE(w->comms[0] && w->comms[1]);
    CheckAllReduce<double>(*w, 3333);
  }
  // Site 1 holds another token: each refuses the other, naming it.
  sec[1].token = "another-token-of-16+chars";
  World w;
  auto st = TryStart(
      w, 2, [](WanOptions& o) { o.timeout_s = 5; }, sec);
  for (int s = 0; s < 2; ++s) {
    ASSERT_FALSE(st[s].ok()) << s;
    EXPECT_NE(st[s].message().find(fmt::format("site {} (", 1 - s)), std::string::npos)
        << st[s].message();
    EXPECT_NE(st[s].message().find("refused this site"), std::string::npos) << st[s].message();
    EXPECT_NE(st[s].message().find("token"), std::string::npos) << st[s].message();
  }
}

TEST(WanTls, CertificateNamingAnotherSiteIsRefused) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto good = LoadSecurity(files.dir(), "site-1");
  auto impostor = LoadSecurity(files.dir(), "impostor");  // CN site-1, used by site 0
  ASSERT_TRUE(good.ok() && impostor.ok());
  World w;
  auto st = TryStart(w, 2, [](WanOptions& o) { o.timeout_s = 3; }, {*impostor, *good});
  ASSERT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("site 0"), std::string::npos) << st[1].message();
  EXPECT_NE(st[1].message().find("its certificate is for site-1 but it claims site 0"),
            std::string::npos)
      << st[1].message();
  EXPECT_FALSE(st[0].ok());
}

TEST(WanTls, PlaintextPeerCannotReachATlsEndpoint) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto sec = LoadSecurity(files.dir(), "site-0");
  ASSERT_TRUE(sec.ok());
  World w;
  auto st = TryStart(w, 2, [](WanOptions& o) { o.timeout_s = 1.5; }, {*sec, Insecure()});
  EXPECT_FALSE(st[0].ok());
  EXPECT_FALSE(st[1].ok());
  EXPECT_NE(st[1].message().find("site 0"), std::string::npos) << st[1].message();
}

TEST(WanTls, FetchSnapshotNeedsTheToken) {
  if (std::system("openssl version >/dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl";
  TlsFiles files;
  ASSERT_TRUE(files.ok());
  auto server = LoadSecurity(files.dir(), "site-0");
  auto client = LoadSecurity(files.dir(), "site-1");
  ASSERT_TRUE(server.ok() && client.ok());
  auto ep = WanEndpoint::Listen("127.0.0.1:0", *server);
  ASSERT_TRUE(ep.ok());
  auto blob = RandomBlob(100000, 5);
  (*ep)->Publish(1, blob);
  auto f = FetchSnapshot((*ep)->address(), *client, 1, 0, 5);
  ASSERT_TRUE(f.ok()) << f.status().ToString();
  EXPECT_TRUE(f->second == *blob);
  client->token = "another-token-of-16+chars";
  f = FetchSnapshot((*ep)->address(), *client, 1, 0, 5);
  EXPECT_EQ(f.status().code(), StatusCode::kUnavailable) << f.status().ToString();
  EXPECT_NE(f.status().message().find("refused this site"), std::string::npos)
      << f.status().message();
  EXPECT_NE(f.status().message().find("token"), std::string::npos) << f.status().message();
  auto impostor = LoadSecurity(files.dir(), "impostor");  // CN site-1
  ASSERT_TRUE(impostor.ok());
  f = FetchSnapshot((*ep)->address(), *impostor, 0, 0, 5);
  EXPECT_NE(f.status().message().find("its certificate is for site-1 but it claims site 0"),
            std::string::npos)
      << f.status().message();
}

}  // namespace
}  // namespace atl
