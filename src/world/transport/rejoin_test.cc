// Absent sites and rejoining (a crashed site's new process, an old incarnation cut off, live sites
// reconnecting), and snapshots (fetched, paced, consistent while republished, corruption caught).
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
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl {
namespace {

using namespace testing_wan;  // NOLINT: the shared test world

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

// n endpoints listening on loopback, and their addresses.
void ListenOnLoopback(int n, std::vector<std::unique_ptr<WanEndpoint>>* eps,
                      std::vector<std::string>* addr) {
  for (int s = 0; s < n; ++s) {
    auto ep = WanEndpoint::Listen("127.0.0.1:0", Insecure());
    ASSERT_TRUE(ep.ok()) << ep.status().ToString();
    addr->push_back((*ep)->address());
    eps->push_back(std::move(*ep));
  }
}

// The options of `ep` connecting as `site` of a world of n sites whose other sites are all absent
// (a process taking a site over, or peers not known yet): no links until Reconnect.
WanOptions AloneOptions(const WanEndpoint& ep, int site, int n, double timeout_s) {
  WanOptions o;
  o.site = site;
  for (int p = 0; p < n; ++p) o.peers.push_back({p, p == site ? ep.address() : ""});
  o.timeout_s = timeout_s;
  return o;
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
  WanOptions o = AloneOptions(**ep, 2, 3, 10);
  o.chunk_bytes = 4096;
  const double t0 = NowSeconds();
  auto c2 = (*ep)->Connect(o);
  ASSERT_TRUE(c2.ok()) << c2.status().ToString();
  EXPECT_LT(NowSeconds() - t0, 3.0);  // at once: timeout_s is 10
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
  auto c1 = (*ep)->Connect(AloneOptions(**ep, 1, 2, 10));
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
  // Fenced: once the coordinator's verdict on the old process reaches site 0, a stream that comes
  // from its address (here a process speaking for it) is refused at once, and the new process's
  // traffic goes on.
  const std::string stale = w->eps[1]->address();
  w->eps[0]->PeerLost(1, stale, "declared dead (test)");
  auto zombie = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(zombie.ok());
  WanOptions zo = AloneOptions(**zombie, 1, 2, 5);
  zo.peers[1].address = stale;
  auto zc = (*zombie)->Connect(zo);
  ASSERT_TRUE(zc.ok()) << zc.status().ToString();
  ::testing::internal::CaptureStderr();  // site 0 logs its refusal
  const Status z = (*zombie)->Reconnect(0, a0);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(z.ok());
  EXPECT_NE(log.find(fmt::format("refused a stream from ipv4:127.0.0.1"), 0), std::string::npos)
      << log;
  EXPECT_NE(log.find(fmt::format("a stream claiming site 1 from {}, a process of it declared "
                                 "dead (declared dead (test))",
                                 stale)),
            std::string::npos)
      << log;
  ExpectMessage(**c1, *w->comms[0], 6, 10);
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
  EXPECT_LT(NowSeconds() - t0, 5.0);  // at once, not after a timeout
  ExpectMessage(*w.comms[0], *w.comms[1], 3, 1000);
  ExpectMessage(*w.comms[1], *w.comms[0], 3, 1000);
}

// Every chunk carries the membership epoch its sender's process registered at. Once site 0
// learns that site 1 was taken over by a process of a later epoch (PeerAlive, from the
// coordinator's membership), whatever still comes from the earlier process (here still on the
// live stream, from its very address) is refused, naming both epochs.
TEST(WanRejoin, AChunkOfAnEarlierEpochIsRefused) {
  auto w = Start(2, [](WanOptions& o) {
    o.timeout_s = 10;
    for (WanPeer& p : o.peers) p.epoch = 3 + p.site;  // site 0 registered at 3, site 1 at 4
  });
  ASSERT_TRUE(w->comms[0] && w->comms[1]);
  ExpectMessage(*w->comms[1], *w->comms[0], 3, 100);  // epoch 4 from site 1: fine
  const std::string a1 = w->eps[1]->address();
  w->eps[0]->PeerAlive(1, a1, 4);  // the same process: nothing changes
  ExpectMessage(*w->comms[1], *w->comms[0], 4, 100);
  ::testing::internal::CaptureStderr();
  w->eps[0]->PeerAlive(1, a1, 7);  // site 1 now held by a process registered at epoch 7
  std::vector<int64_t> v(100, 5), got(100, 0);
  std::thread sender([&] { (void)w->comms[1]->Send(std::span<const int64_t>(v), 0, 5); });
  const Status st = w->comms[0]->Recv(std::span<int64_t>(got), 1, 5);
  sender.join();
  const std::string log = ::testing::internal::GetCapturedStderr();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("a chunk of an earlier process of site 1 (membership epoch 4; its "
                              "process now is of epoch 7)"),
            std::string::npos)
      << st.ToString();
  EXPECT_NE(log.find("an earlier process of site 1"), std::string::npos) << log;
  EXPECT_EQ(got, std::vector<int64_t>(100, 0));
}

TEST(WanRejoin, ReconnectFailsNamingWhatIsMissing) {
  // Two endpoints that each connected with the other absent.
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::string> addr;
  ASSERT_NO_FATAL_FAILURE(ListenOnLoopback(2, &eps, &addr));
  Status st = eps[0]->Reconnect(1, addr[1]);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << st.ToString();
  EXPECT_NE(st.message().find("Connect has not succeeded"), std::string::npos) << st.message();
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int s = 0; s < 2; ++s) {
    auto c = eps[s]->Connect(AloneOptions(*eps[s], s, 2, 1));
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
  const DeadAddress nobody;
  const std::string& dead = nobody.str();
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

// The coordinator's verdict fails a Reconnect to the incarnation it declared dead at once, not
// after timeout_s: whether it comes while the link connects (nobody listens), while this site
// waits for the peer's hello (it listens but will never answer), or before the call.
TEST(WanRejoin, ReconnectToAPeerDeclaredDeadFailsAtOnce) {
  std::vector<std::unique_ptr<WanEndpoint>> eps;
  std::vector<std::string> addr;
  ASSERT_NO_FATAL_FAILURE(ListenOnLoopback(2, &eps, &addr));
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int s = 0; s < 2; ++s) {
    auto c = eps[s]->Connect(AloneOptions(*eps[s], s, 2, 60));
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    comms.push_back(std::move(*c));
  }
  const DeadAddress nobody;
  for (const std::string& target : {nobody.str(), addr[1]}) {
    const double t0 = NowSeconds();
    std::thread verdict([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      eps[0]->PeerLost(1, target, "the coordinator declared it dead (epoch 7)");
    });
    Status st = eps[0]->Reconnect(1, target);
    verdict.join();
    EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
    EXPECT_NE(st.message().find("the coordinator declared it dead (epoch 7)"), std::string::npos)
        << st.message();
    EXPECT_LT(NowSeconds() - t0, 10) << target;  // not timeout_s (60)
  }
  // Declared dead before the call: at once.
  const double t0 = NowSeconds();
  Status st = eps[0]->Reconnect(1, nobody.str());
  EXPECT_EQ(st.code(), StatusCode::kUnavailable) << st.ToString();
  EXPECT_NE(st.message().find("is lost: the coordinator declared it dead"), std::string::npos)
      << st.message();
  EXPECT_LT(NowSeconds() - t0, 1);
  // A new incarnation of site 1 at another address is not held to the old verdict.
  comms.pop_back();
  eps.pop_back();
  auto e1 = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(e1.ok());
  const std::string a1 = (*e1)->address();
  auto c1 = (*e1)->Connect(AloneOptions(**e1, 1, 2, 60));
  ASSERT_TRUE(c1.ok()) << c1.status().ToString();
  auto rs = Concurrently(
      {[&] { return eps[0]->Reconnect(1, a1); }, [&] { return (*e1)->Reconnect(0, addr[0]); }});
  for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
  ExpectMessage(*comms[0], **c1, 2, 1000);
  ExpectMessage(**c1, *comms[0], 2, 1000);
  comms.clear();
  c1->reset();
}

// A new process may listen where a dead one did (a fixed --wan-listen port): once the
// coordinator counts it live there (PeerAlive), a Reconnect to that address works again.
TEST(WanRejoin, ANewProcessAtADeadOnesAddressIsReconnectedOncePeerAlive) {
  auto e0 = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(e0.ok());
  auto e1 = WanEndpoint::Listen("127.0.0.1:0", Insecure());
  ASSERT_TRUE(e1.ok());
  const std::string a0 = (*e0)->address(), a1 = (*e1)->address();
  auto c0 = (*e0)->Connect(AloneOptions(**e0, 0, 2, 30));
  ASSERT_TRUE(c0.ok()) << c0.status().ToString();
  {
    auto c1 = (*e1)->Connect(AloneOptions(**e1, 1, 2, 30));
    ASSERT_TRUE(c1.ok()) << c1.status().ToString();
    auto rs = Concurrently(
        {[&] { return (*e0)->Reconnect(1, a1); }, [&] { return (*e1)->Reconnect(0, a0); }});
    for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
    c1->reset();
  }
  e1->reset();  // site 1's process dies; the coordinator says so
  (*e0)->PeerLost(1, a1, "the coordinator declared it dead (epoch 3)");
  Status st = (*e0)->Reconnect(1, a1);
  EXPECT_NE(st.message().find("is lost"), std::string::npos) << st.ToString();
  // Its new process listens at the same address and registers: live there again.
  auto n1 = WanEndpoint::Listen(a1, Insecure());
  ASSERT_TRUE(n1.ok()) << n1.status().ToString();
  auto d1 = (*n1)->Connect(AloneOptions(**n1, 1, 2, 30));
  ASSERT_TRUE(d1.ok()) << d1.status().ToString();
  (*e0)->PeerAlive(1, a1, 0);
  auto rs = Concurrently(
      {[&] { return (*e0)->Reconnect(1, a1); }, [&] { return (*n1)->Reconnect(0, a0); }});
  for (const Status& r : rs) ASSERT_TRUE(r.ok()) << r.ToString();
  ExpectMessage(**c0, **d1, 4, 1000);
  ExpectMessage(**d1, **c0, 4, 1000);
  d1->reset();
  c0->reset();
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
  {
    // Published while the first piece is on its way (the server has taken its snapshot by then),
    // however slowly the fetch got going.
    std::atomic<bool> published{false};
    FetchHookGuard g([&](int, int, wan::FetchChunk&) {
      if (!published.exchange(true)) w->eps[0]->Publish(2, RandomBlob(1 << 20, 3));
    });
    f = FetchSnapshot(w->eps[0]->address(), Insecure(), 1, 1, 5);
    EXPECT_TRUE(published.load());
  }
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

}  // namespace
}  // namespace atl
