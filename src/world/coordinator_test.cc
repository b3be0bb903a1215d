// The coordinator on loopback: registration checks, quorum, heartbeats and deaths, round
// barriers, the durable log across a restart, and authentication (token, TLS from another CA);
// the parameter server it hosts (world/ps.h): init, pull, push, staleness, bad updates, its op
// log, large parameters, a restart that lost its state, and unregistered callers.
#include "world/coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <random>
#include <thread>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "world/certs.h"
#include "world/codec.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/ps.h"

namespace atl {
namespace {

namespace fs = std::filesystem;
constexpr double kHeartbeat = 0.2;

std::string TempDir(const char* what) {
  std::string tmpl =
      (fs::temp_directory_path() / (std::string("atoll_coord_") + what + "_XXXXXX")).string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

bool Same(const Membership& a, const Membership& b) {
  if (a.epoch != b.epoch || a.sites.size() != b.sites.size()) return false;
  for (size_t i = 0; i < a.sites.size(); ++i) {
    const auto &x = a.sites[i], &y = b.sites[i];
    if (x.site != y.site || x.wan_address != y.wan_address || x.alive != y.alive ||
        x.last_round != y.last_round)
      return false;
  }
  return true;
}

std::string Show(const Membership& m) {
  std::string s = fmt::format("epoch {}:", m.epoch);
  for (const auto& x : m.sites)
    s += fmt::format(" [{} {} {} r{}]", x.site, x.wan_address, x.alive ? "alive" : "dead",
                     x.last_round);
  return s;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    root_ = new std::string(TempDir("certs"));
    ASSERT_TRUE(MakeCerts(*root_ + "/world", 4).ok());
    ASSERT_TRUE(MakeCerts(*root_ + "/other", 4).ok());  // another CA
  }
  static void TearDownTestSuite() {
    fs::remove_all(*root_);
    delete root_;
  }
  void SetUp() override { state_ = TempDir("state"); }
  void TearDown() override { fs::remove_all(state_); }

  static WorldSecurity Sec(const std::string& name, const char* world = "world") {
    auto s = LoadSecurity(*root_ + "/" + world, name);
    EXPECT_TRUE(s.ok()) << s.status().ToString();
    return s.ok() ? *s : WorldSecurity{};
  }

  std::unique_ptr<Coordinator> StartCoordinator(int sites, std::string listen = "127.0.0.1:0",
                                                double heartbeat_s = kHeartbeat) {
    CoordinatorOptions o;
    o.listen = std::move(listen);
    o.sites = sites;
    o.heartbeat_s = heartbeat_s;
    o.state_dir = state_;
    o.security = Sec("coordinator");
    auto c = Coordinator::Start(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  static CoordinatorClientOptions ClientOptions(const std::string& address, int site,
                                                double timeout_s = 20) {
    CoordinatorClientOptions o;
    o.address = address;
    o.site = site;
    o.config_hash = 0xabcdef;
    o.heartbeat_s = kHeartbeat;
    o.timeout_s = timeout_s;
    o.security = Sec(fmt::format("site-{}", site < 4 && site >= 0 ? site : 0));
    return o;
  }

  static std::unique_ptr<CoordinatorClient> Client(const CoordinatorClientOptions& o) {
    auto c = CoordinatorClient::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(c).value() : nullptr;
  }

  // Registers sites 0..n-1 concurrently; their memberships.
  static std::vector<Membership> RegisterAll(
      std::vector<std::unique_ptr<CoordinatorClient>>& clients) {
    std::vector<std::future<StatusOr<Membership>>> f;
    for (size_t i = 0; i < clients.size(); ++i)
      f.push_back(std::async(std::launch::async, [&, i] {
        return clients[i]->Register(fmt::format("10.0.0.{}:900{}", i, i));
      }));
    std::vector<Membership> out;
    for (auto& x : f) {
      auto m = x.get();
      EXPECT_TRUE(m.ok()) << m.status().ToString();
      out.push_back(m.ok() ? *m : Membership{});
    }
    return out;
  }

  std::vector<std::unique_ptr<CoordinatorClient>> Clients(const std::string& address, int n) {
    std::vector<std::unique_ptr<CoordinatorClient>> c;
    for (int i = 0; i < n; ++i) c.push_back(Client(ClientOptions(address, i)));
    return c;
  }

  // Polls until site `site` is not alive; seconds waited, or -1 after `limit_s`.
  static double WaitDead(Coordinator* c, int site, double limit_s = 5) {
    const double t0 = NowSeconds();
    while (NowSeconds() - t0 < limit_s) {
      if (!c->membership().sites[size_t(site)].alive) return NowSeconds() - t0;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return -1;
  }

  std::string LogText() const {
    auto t = ReadFile(state_ + "/coordinator.log");
    return t.ok() ? *t : "";
  }

  static std::string* root_;
  std::string state_;
};

std::string* CoordinatorTest::root_ = nullptr;

TEST_F(CoordinatorTest, ThreeSitesRegisterAndSeeTheSameMembership) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 3);
  auto m = RegisterAll(clients);
  ASSERT_EQ(m.size(), 3u);
  EXPECT_TRUE(Same(m[0], m[1])) << Show(m[0]) << " vs " << Show(m[1]);
  EXPECT_TRUE(Same(m[0], m[2])) << Show(m[0]) << " vs " << Show(m[2]);
  EXPECT_EQ(m[0].epoch, 3);  // one per registration
  ASSERT_EQ(m[0].sites.size(), 3u);
  EXPECT_EQ(m[0].live(), 3);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(m[0].sites[size_t(i)].site, i);
    EXPECT_EQ(m[0].sites[size_t(i)].wan_address, fmt::format("10.0.0.{}:900{}", i, i));
  }
  EXPECT_TRUE(Same(coord->membership(), m[0]));
  // Heartbeats keep everyone alive well past the death limit.
  std::this_thread::sleep_for(std::chrono::duration<double>(5 * kHeartbeat));
  EXPECT_EQ(coord->membership().live(), 3);
  EXPECT_EQ(coord->membership().epoch, 3);
  EXPECT_NE(LogText().find("\"quorum\""), std::string::npos);
}

TEST_F(CoordinatorTest, RegisterTimesOutNamingTheMissingSites) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto c = Client(ClientOptions(coord->address(), 0, /*timeout_s=*/1.5));
  const double t0 = NowSeconds();
  auto m = c->Register("10.0.0.0:9000");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(m.status().message().find("waiting for site(s) 1, 2"), std::string::npos)
      << m.status().message();
  EXPECT_LT(NowSeconds() - t0, 3.0);
}

TEST_F(CoordinatorTest, RefusesAWrongProtocolVersion) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  const WorldSecurity sec = Sec("site-0");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec));
  grpc::ClientContext ctx;
  AddToken(&ctx, sec);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  coord::RegisterRequest req;
  req.set_version(kCoordinatorProtocolVersion + 98);
  req.set_site(0);
  req.set_wan_address("10.0.0.0:9000");
  coord::Reply reply;
  grpc::Status st = stub->Register(&ctx, req, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("protocol version 99"), std::string::npos)
      << st.error_message();
  EXPECT_EQ(coord->membership().live(), 0);
}

TEST_F(CoordinatorTest, RefusesAnotherConfigHash) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto c0 = Client(ClientOptions(coord->address(), 0));
  auto first = std::async(std::launch::async, [&] { return c0->Register("10.0.0.0:9000"); });
  while (coord->membership().live() < 1) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  auto o = ClientOptions(coord->address(), 1);
  o.config_hash = 0x1234;
  auto m = Client(o)->Register("10.0.0.1:9001");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(m.status().ExitCode(), 2);
  EXPECT_NE(m.status().message().find("config hash 0000000000001234 differs from "
                                      "0000000000abcdef registered by site 0"),
            std::string::npos)
      << m.status().message();
  // The right config completes the quorum.
  auto c1 = Client(ClientOptions(coord->address(), 1));
  EXPECT_TRUE(c1->Register("10.0.0.1:9001").ok());
  EXPECT_TRUE(first.get().ok());
}

TEST_F(CoordinatorTest, RefusesADuplicateSite) {
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  auto c0 = Client(ClientOptions(coord->address(), 0));
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  auto again = Client(ClientOptions(coord->address(), 0));
  auto m = again->Register("10.0.0.9:9009");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("site 0 is already registered by another live process"),
            std::string::npos)
      << m.status().message();
  EXPECT_EQ(coord->membership().sites[0].wan_address, "10.0.0.0:9000");
  // The same process registering again is not a duplicate.
  EXPECT_TRUE(c0->Register("10.0.0.0:9000").ok());
  EXPECT_EQ(coord->membership().epoch, 1);
}

TEST_F(CoordinatorTest, RefusesASiteOutOfRange) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto m = Client(ClientOptions(coord->address(), 2))->Register("10.0.0.2:9002");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("site 2 is out of range: this coordinator expects 2 "
                                      "sites (0..1)"),
            std::string::npos)
      << m.status().message();
  EXPECT_EQ(CoordinatorClient::Connect(ClientOptions(coord->address(), -1)).status().code(),
            StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, RefusesAWrongToken) {
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  auto o = ClientOptions(coord->address(), 0);
  o.security.token = std::string(64, 'f');
  auto m = Client(o)->Register("10.0.0.0:9000");
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m.status().message().find("missing or wrong token"), std::string::npos)
      << m.status().message();
  EXPECT_EQ(coord->membership().live(), 0);
}

TEST_F(CoordinatorTest, RefusesACertificateFromAnotherCa) {
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  // Trusts the world's CA and has the token, but its certificate comes from another CA.
  auto o = ClientOptions(coord->address(), 0, /*timeout_s=*/4);
  const WorldSecurity other = Sec("site-0", "other");
  o.security.cert_pem = other.cert_pem;
  o.security.key_pem = other.key_pem;
  const double t0 = NowSeconds();
  auto m = Client(o)->Register("10.0.0.0:9000");
  EXPECT_FALSE(m.ok());
  EXPECT_LT(NowSeconds() - t0, 6.0);
  // TLS 1.3: the client sees the connection closed after its handshake, not a TLS error.
  EXPECT_NE(m.status().message().find("signed by the coordinator's CA"), std::string::npos)
      << m.status().message();
  // Entirely another world's credentials: the server is not trusted either.
  auto o2 = ClientOptions(coord->address(), 0, /*timeout_s=*/4);
  o2.security = other;
  auto m2 = Client(o2)->Register("10.0.0.0:9000");
  ASSERT_FALSE(m2.ok());
  EXPECT_EQ(m2.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(m2.status().message().find("TLS handshake with the coordinator"), std::string::npos)
      << m2.status().message();
  EXPECT_EQ(coord->membership().live(), 0);
  // The right certificate still works.
  EXPECT_TRUE(Client(ClientOptions(coord->address(), 0))->Register("10.0.0.0:9000").ok());
}

TEST_F(CoordinatorTest, InsecureModeWorksWhenAskedFor) {
  CoordinatorOptions o;
  o.sites = 1;
  o.heartbeat_s = kHeartbeat;
  o.state_dir = state_;
  o.security.insecure = true;
  auto coord = Coordinator::Start(o);
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  auto co = ClientOptions((*coord)->address(), 0);
  co.security = WorldSecurity{};
  co.security.insecure = true;
  auto m = Client(co)->Register("10.0.0.0:9000");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->live(), 1);
}

TEST_F(CoordinatorTest, DeclaresASilentSiteDeadWithinTwoIntervals) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 3);
  auto m = RegisterAll(clients);
  const int64_t epoch = coord->membership().epoch;
  clients[1].reset();  // stops heartbeating without leaving: a crash
  const double waited = WaitDead(coord.get(), 1);
  ASSERT_GE(waited, 0) << "site 1 was never declared dead";
  EXPECT_LE(waited, 2 * kHeartbeat + 0.3);
  EXPECT_GE(waited, kHeartbeat);  // not before it could have missed a beat
  auto after = coord->membership();
  EXPECT_EQ(after.epoch, epoch + 1);
  EXPECT_TRUE(after.sites[0].alive);
  EXPECT_TRUE(after.sites[2].alive);
  std::this_thread::sleep_for(std::chrono::duration<double>(4 * kHeartbeat));
  EXPECT_EQ(coord->membership().live(), 2);
  EXPECT_EQ(coord->membership().epoch, epoch + 1);
  EXPECT_NE(LogText().find("\"death\""), std::string::npos);
}

TEST_F(CoordinatorTest, RoundBarrierReleasesWhenAllArrive) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 3);
  RegisterAll(clients);
  for (int64_t round : {0, 1, 2}) {
    std::vector<double> arrive(3), leave(3);
    std::vector<std::future<StatusOr<Membership>>> f;
    for (int i = 0; i < 3; ++i)
      f.push_back(std::async(std::launch::async, [&, i] {
        std::this_thread::sleep_for(std::chrono::milliseconds(150 * i));
        arrive[size_t(i)] = NowSeconds();
        auto m = clients[size_t(i)]->Round(round);
        leave[size_t(i)] = NowSeconds();
        return m;
      }));
    std::vector<Membership> m;
    for (auto& x : f) {
      auto r = x.get();
      ASSERT_TRUE(r.ok()) << r.status().ToString();
      m.push_back(*r);
    }
    for (int i = 0; i < 3; ++i) EXPECT_GE(leave[size_t(i)], arrive[2]) << "site " << i;
    EXPECT_TRUE(Same(m[0], m[1])) << Show(m[0]) << " vs " << Show(m[1]);
    EXPECT_TRUE(Same(m[0], m[2])) << Show(m[0]) << " vs " << Show(m[2]);
    EXPECT_EQ(m[0].live(), 3);
    for (const auto& s : m[0].sites) EXPECT_EQ(s.last_round, round);
  }
  EXPECT_NE(LogText().find("\"round\":2"), std::string::npos);
}

TEST_F(CoordinatorTest, RoundBarrierReleasesWhenASiteDies) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 3);
  RegisterAll(clients);
  const int64_t epoch = coord->membership().epoch;
  std::vector<std::future<StatusOr<Membership>>> f;
  for (int i = 0; i < 2; ++i)
    f.push_back(std::async(std::launch::async, [&, i] { return clients[size_t(i)]->Round(7); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  for (auto& x : f)
    EXPECT_EQ(x.wait_for(std::chrono::seconds(0)), std::future_status::timeout)
        << "released before site 2 arrived or died";
  const double t_kill = NowSeconds();
  clients[2].reset();
  std::vector<Membership> m;
  for (auto& x : f) {
    auto r = x.get();
    ASSERT_TRUE(r.ok()) << r.status().ToString();
    m.push_back(*r);
  }
  EXPECT_LE(NowSeconds() - t_kill, 2 * kHeartbeat + 0.5);
  EXPECT_TRUE(Same(m[0], m[1])) << Show(m[0]) << " vs " << Show(m[1]);
  EXPECT_EQ(m[0].epoch, epoch + 1);
  EXPECT_FALSE(m[0].sites[2].alive);
  EXPECT_EQ(m[0].live(), 2);
  // The next round needs only the live sites.
  auto next = std::async(std::launch::async, [&] { return clients[0]->Round(8); });
  auto r1 = clients[1]->Round(8);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  ASSERT_TRUE(next.get().ok());
}

TEST_F(CoordinatorTest, LeaveReleasesTheOthersAndIsNotADeath) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 2);
  RegisterAll(clients);
  auto f = std::async(std::launch::async, [&] { return clients[0]->Round(1); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  ASSERT_TRUE(clients[1]->Leave().ok());
  auto r = f.get();
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_FALSE(r->sites[1].alive);
  EXPECT_EQ(r->live(), 1);
  const std::string log = LogText();
  EXPECT_NE(log.find("\"leave\""), std::string::npos);
  EXPECT_EQ(log.find("\"death\""), std::string::npos);
  // Round after Leave is a usage error; a dead site's Round says why.
  EXPECT_FALSE(clients[1]->Round(2).ok());
}

TEST_F(CoordinatorTest, RestartKeepsEpochMembersAndRounds) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  const std::string address = coord->address();
  auto clients = Clients(address, 2);
  RegisterAll(clients);
  for (int64_t round : {1, 2}) {
    auto f = std::async(std::launch::async, [&] { return clients[0]->Round(round); });
    ASSERT_TRUE(clients[1]->Round(round).ok());
    ASSERT_TRUE(f.get().ok());
  }
  const Membership before = coord->membership();
  // Site 0 waits in round 3 while the coordinator goes away and comes back.
  auto waiting = std::async(std::launch::async, [&] { return clients[0]->Round(3); });
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  coord->Shutdown();
  coord.reset();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  coord = StartCoordinator(2, address);
  ASSERT_NE(coord, nullptr);
  const Membership after = coord->membership();
  EXPECT_EQ(after.epoch, before.epoch);
  ASSERT_EQ(after.sites.size(), 2u);
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(after.sites[size_t(i)].alive);
    EXPECT_EQ(after.sites[size_t(i)].wan_address, before.sites[size_t(i)].wan_address);
    EXPECT_EQ(after.sites[size_t(i)].last_round, 2);
  }
  // The clients carry on: round 3 completes, and nobody is declared dead or re-counted.
  auto r1 = clients[1]->Round(3);
  ASSERT_TRUE(r1.ok()) << r1.status().ToString();
  auto r0 = waiting.get();
  ASSERT_TRUE(r0.ok()) << r0.status().ToString();
  EXPECT_EQ(r0->live(), 2);
  std::this_thread::sleep_for(std::chrono::duration<double>(2.0 + 4 * kHeartbeat));
  EXPECT_EQ(coord->membership().live(), 2);
  EXPECT_EQ(coord->membership().epoch, before.epoch);
  EXPECT_NE(LogText().find("\"restart\""), std::string::npos);
}

TEST_F(CoordinatorTest, RestartRefusesAnotherSiteCountAndCorruptLogs) {
  {
    auto coord = StartCoordinator(1);
    ASSERT_NE(coord, nullptr);
    ASSERT_TRUE(Client(ClientOptions(coord->address(), 0))->Register("10.0.0.0:9000").ok());
  }
  CoordinatorOptions o;
  o.sites = 3;
  o.heartbeat_s = kHeartbeat;
  o.state_dir = state_;
  o.security = Sec("coordinator");
  auto c = Coordinator::Start(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(c.status().message().find("world of 1 sites, not 3"), std::string::npos)
      << c.status().message();
  // A torn last record (a crash mid-append, never acknowledged) is dropped.
  const std::string log = LogText();
  {
    std::ofstream out(state_ + "/coordinator.log", std::ios::app);
    out << "{\"t\":\"death\",\"si";
  }
  o.sites = 1;
  c = Coordinator::Start(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_TRUE((*c)->membership().sites[0].alive);
  EXPECT_EQ((*c)->membership().epoch, 1);
  (*c)->Shutdown();
  c = Status::Internal("reset");
  // A damaged complete record is an error naming the line.
  ASSERT_TRUE(WriteFileAtomic(state_ + "/coordinator.log", log + "garbage\n").ok());
  c = Coordinator::Start(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_NE(c.status().message().find("coordinator.log line 4"), std::string::npos)
      << c.status().message();
}

TEST_F(CoordinatorTest, LongWaitsDoNotBlockOtherCalls) {
  constexpr int kSites = 12;
  CoordinatorOptions o;
  o.sites = kSites;
  o.heartbeat_s = kHeartbeat;
  o.state_dir = state_;
  o.security.insecure = true;
  auto coord = Coordinator::Start(o);
  ASSERT_TRUE(coord.ok()) << coord.status().ToString();
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < kSites; ++i) {
    auto co = ClientOptions((*coord)->address(), i);
    co.security = WorldSecurity{};
    co.security.insecure = true;
    clients.push_back(Client(co));
  }
  // Eleven sites wait for the quorum longer than the death limit: waiting is not dying.
  std::vector<std::future<StatusOr<Membership>>> f;
  for (int i = 0; i + 1 < kSites; ++i)
    f.push_back(std::async(std::launch::async, [&, i] {
      return clients[size_t(i)]->Register(fmt::format("10.0.1.{}:9000", i));
    }));
  std::this_thread::sleep_for(std::chrono::duration<double>(5 * kHeartbeat));
  EXPECT_EQ((*coord)->membership().live(), kSites - 1);
  ASSERT_TRUE(clients.back()->Register("10.0.1.11:9000").ok());
  for (auto& x : f) ASSERT_TRUE(x.get().ok());
  for (int64_t round = 0; round < 5; ++round) {
    std::vector<std::future<StatusOr<Membership>>> r;
    for (int i = 0; i < kSites; ++i)
      r.push_back(
          std::async(std::launch::async, [&, i] { return clients[size_t(i)]->Round(round); }));
    for (auto& x : r) {
      auto m = x.get();
      ASSERT_TRUE(m.ok()) << m.status().ToString();
      EXPECT_EQ(m->live(), kSites);
    }
  }
  EXPECT_EQ((*coord)->membership().epoch, kSites);
  EXPECT_EQ(LogText().find("\"death\""), std::string::npos);
}

TEST_F(CoordinatorTest, ADeadSiteIsToldSoAndMayRejoin) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  // Site 1 speaks the protocol by hand and never sends a heartbeat.
  const WorldSecurity sec = Sec("site-1");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec));
  auto call = [&](auto rpc, const auto& req, coord::Reply* reply) {
    grpc::ClientContext ctx;
    AddToken(&ctx, sec);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ((*stub).*rpc)(&ctx, req, reply);
  };
  coord::RegisterRequest reg;
  reg.set_version(kCoordinatorProtocolVersion);
  reg.set_site(1);
  reg.set_wan_address("10.0.0.1:9001");
  reg.set_config_hash(0xabcdef);
  reg.set_incarnation(77);
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return call(&coord::Coordinator::Stub::Register, reg, &reply);
  });
  auto c0 = Client(ClientOptions(coord->address(), 0));
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(raw.get().ok());
  ASSERT_GE(WaitDead(coord.get(), 1), 0);
  coord::RoundRequest round;
  round.set_site(1);
  round.set_round(1);
  round.set_incarnation(77);
  coord::Reply reply;
  grpc::Status st = call(&coord::Coordinator::Stub::Round, round, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(st.error_message().find("site 1 was declared dead"), std::string::npos)
      << st.error_message();
  // Registering again rejoins (the quorum was reached long ago: no wait).
  const int64_t epoch = coord->membership().epoch;
  ASSERT_TRUE(call(&coord::Coordinator::Stub::Register, reg, &reply).ok());
  EXPECT_EQ(coord->membership().epoch, epoch + 1);
  EXPECT_TRUE(coord->membership().sites[1].alive);
  EXPECT_EQ(reply.membership().sites(1).last_round(), -1);
}

// A crashed site's new process rejoins at a round it names: refused when that round has been
// reached, invisible to the rounds before it, waited for from it on; it waits out the old
// process's death.
TEST_F(CoordinatorTest, ANewProcessRejoinsAtTheRoundItNames) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 3);
  RegisterAll(clients);
  auto round_all = [&](int64_t r, std::vector<int> sites) {
    std::vector<std::future<StatusOr<Membership>>> f;
    for (int i : sites)
      f.push_back(std::async(std::launch::async, [&, i] { return clients[size_t(i)]->Round(r); }));
    for (auto& x : f) ASSERT_TRUE(x.get().ok());
  };
  round_all(3, {0, 1, 2});
  clients[2].reset();  // a crash: no Leave, heartbeats stop
  // A new process for site 2, started at once: it waits until the old one is declared dead.
  auto fresh = Client(ClientOptions(coord->address(), 2));
  auto peek = fresh->Peek();  // no registration needed
  ASSERT_TRUE(peek.ok()) << peek.status().ToString();
  EXPECT_EQ(peek->sites[1].wan_address, "10.0.0.1:9001");
  auto too_late = fresh->Rejoin("10.0.0.2:9102", 3);
  ASSERT_FALSE(too_late.ok());
  EXPECT_EQ(too_late.status().code(), StatusCode::kNotFound) << too_late.status().ToString();
  EXPECT_NE(too_late.status().message().find("too late to rejoin at round 3"), std::string::npos)
      << too_late.status().ToString();
  const int64_t epoch = coord->membership().epoch;
  auto m = fresh->Rejoin("10.0.0.2:9102", 10);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_TRUE(m->sites[2].alive);
  EXPECT_EQ(m->sites[2].wan_address, "10.0.0.2:9102");
  EXPECT_EQ(m->sites[2].last_round, 9);
  EXPECT_GE(coord->membership().epoch, epoch + 1);
  // Rounds before 10 do not wait for it.
  round_all(5, {0, 1});
  // Round 10 does.
  auto r0 = std::async(std::launch::async, [&] { return clients[0]->Round(10); });
  auto r1 = std::async(std::launch::async, [&] { return clients[1]->Round(10); });
  EXPECT_EQ(r0.wait_for(std::chrono::milliseconds(400)), std::future_status::timeout);
  auto r2 = fresh->Round(10);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  ASSERT_TRUE(r0.get().ok());
  auto m1 = r1.get();
  ASSERT_TRUE(m1.ok());
  EXPECT_EQ(m1->live(), 3);
  EXPECT_NE(LogText().find("\"join_round\":10"), std::string::npos);
}

// ---------------------------------------------------------------------------------------------
// The parameter server.

std::vector<float> Floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

bool SameBits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

PsUpdate MakeUpdate(int site, int64_t base, int64_t first, int64_t last, float weight, Codec codec,
                    const std::vector<float>& x) {
  PsUpdate u;
  u.site = site;
  u.base_version = base;
  u.first_step = first;
  u.last_step = last;
  u.weight = weight;
  Encode(codec, x, &u.encoded);
  return u;
}

// What the server should compute: the same decoding and ApplyUpdate.
void Expect(std::vector<float>* params, const PsUpdate& u) {
  std::vector<float> d(params->size());
  ASSERT_TRUE(Decode(u.encoded, d).ok());
  ApplyUpdate(*params, d, u.weight);
}

TEST_F(CoordinatorTest, ParameterServerAppliesPushesInOrderAndLogsThem) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 2);
  RegisterAll(clients);
  constexpr size_t kN = 1000;  // not a multiple of the codec block
  const std::vector<float> init = Floats(kN, 1);
  ParameterServer* ps0 = clients[0]->ps();
  ParameterServer* ps1 = clients[1]->ps();
  ASSERT_TRUE(ps0->Init(init, /*max_staleness=*/1).ok());
  // The second site checks that it starts from the same floats; max_staleness is the first's.
  Status st = ps1->Init(init, 7).status();
  ASSERT_TRUE(st.ok()) << st.ToString();
  std::vector<float> got(kN, -1.0f);
  auto v = ps1->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
  EXPECT_TRUE(SameBits(got, init));
  // Another model or seed is refused.
  std::vector<float> other = init;
  other[17] += 1e-3f;
  st = ps1->Init(other, 1).status();
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("initial parameters (1000 floats, checksum " +
                              HashToHex(Hash64(other.data(), other.size() * 4)) + ") differ"),
            std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("set by site 0"), std::string::npos) << st.message();
  EXPECT_EQ(ps1->Init(std::vector<float>(kN + 1), 1).status().code(), StatusCode::kInvalidArgument);
  std::vector<float> small(kN - 1);
  EXPECT_EQ(ps1->Pull(small).status().code(), StatusCode::kInvalidArgument);

  std::vector<float> expect = init;
  std::vector<PsUpdate> pushed;
  std::vector<PsPushResult> results;
  auto push = [&](ParameterServer* ps, const PsUpdate& u) {
    auto r = ps->Push(u);
    EXPECT_TRUE(r.ok()) << r.status().ToString();
    pushed.push_back(u);
    results.push_back(r.ok() ? *r : PsPushResult{});
    return r.ok() ? *r : PsPushResult{};
  };
  // Site 0: none, weight 0.1 (not a short decimal); site 1 from version 0 (staleness 1): int8.
  PsUpdate u0 = MakeUpdate(0, 0, 0, 3, 0.1f, Codec::kNone, Floats(kN, 2));
  auto r = push(ps0, u0);
  EXPECT_TRUE(r.accepted);
  EXPECT_EQ(r.update_id, 0);
  EXPECT_EQ(r.applied_version, 1);
  EXPECT_EQ(r.current_version, 1);
  Expect(&expect, u0);
  PsUpdate u1 = MakeUpdate(1, 0, 0, 4, 0.5f, Codec::kInt8, Floats(kN, 3));
  r = push(ps1, u1);
  EXPECT_TRUE(r.accepted);
  EXPECT_EQ(r.update_id, 1);
  EXPECT_EQ(r.applied_version, 2);
  Expect(&expect, u1);
  v = ps0->Pull(got);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2);
  EXPECT_TRUE(SameBits(got, expect));
  // Staleness 2 > 1: refused, logged, nothing changes.
  PsUpdate stale = MakeUpdate(0, 0, 4, 7, 1.0f, Codec::kInt8, Floats(kN, 4));
  r = push(ps0, stale);
  EXPECT_FALSE(r.accepted);
  EXPECT_EQ(r.update_id, 2);
  EXPECT_EQ(r.applied_version, -1);
  EXPECT_EQ(r.current_version, 2);
  v = ps0->Pull(got);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2);
  EXPECT_TRUE(SameBits(got, expect));
  // Bad updates (damaged bytes, another count, a bad weight or base) change nothing and are not
  // logged.
  PsUpdate bad = MakeUpdate(1, 2, 5, 9, 1.0f, Codec::kInt8, Floats(kN, 5));
  bad.encoded[0] ^= 0xff;  // the magic
  auto rb = ps1->Push(bad);
  ASSERT_FALSE(rb.ok());
  EXPECT_EQ(rb.status().code(), StatusCode::kCorruption);
  EXPECT_NE(rb.status().message().find("site 1: update (steps 5..9"), std::string::npos)
      << rb.status().message();
  bad = MakeUpdate(1, 2, 5, 9, 1.0f, Codec::kNone, Floats(kN - 1, 5));
  EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kCorruption);
  bad = MakeUpdate(1, 2, 5, 9, 1.0f, Codec::kNone, Floats(kN, 5));
  bad.encoded.pop_back();
  EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kCorruption);
  bad = MakeUpdate(1, 2, 5, 9, std::numeric_limits<float>::infinity(), Codec::kNone, Floats(kN, 5));
  EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kInvalidArgument);
  bad = MakeUpdate(1, 3, 5, 9, 1.0f, Codec::kNone, Floats(kN, 5));  // from the future
  EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kInvalidArgument);
  bad = MakeUpdate(0, 2, 5, 9, 1.0f, Codec::kNone, Floats(kN, 5));  // another site's update
  EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kInvalidArgument);
  v = ps1->Pull(got);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 2);
  EXPECT_TRUE(SameBits(got, expect));
  // The next good updates get the next ids (a negative weight, small values).
  PsUpdate u3 = MakeUpdate(1, 2, 5, 9, -0.75f, Codec::kInt8, Floats(kN, 6, 1e-3f));
  r = push(ps1, u3);
  EXPECT_TRUE(r.accepted);
  EXPECT_EQ(r.update_id, 3);
  EXPECT_EQ(r.applied_version, 3);
  Expect(&expect, u3);
  PsUpdate u4 = MakeUpdate(0, 2, 4, 7, 0.3f, Codec::kNone, Floats(kN, 7));
  r = push(ps0, u4);
  EXPECT_TRUE(r.accepted);
  EXPECT_EQ(r.applied_version, 4);
  Expect(&expect, u4);
  v = ps0->Pull(got);
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(*v, 4);
  EXPECT_TRUE(SameBits(got, expect));

  // The op log holds every decided push, in order, with what replay needs.
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->count, kN);
  EXPECT_EQ(log->init_checksum, Hash64(init.data(), init.size() * sizeof(float)));
  EXPECT_EQ(log->max_staleness, 1);
  ASSERT_EQ(log->entries.size(), pushed.size());
  for (size_t i = 0; i < pushed.size(); ++i) {
    const PsLogEntry& e = log->entries[i];
    const PsUpdate& u = pushed[i];
    EXPECT_EQ(e.update_id, int64_t(i));
    EXPECT_EQ(e.update_id, results[i].update_id);
    EXPECT_EQ(e.site, u.site);
    EXPECT_EQ(e.base_version, u.base_version);
    EXPECT_EQ(e.first_step, u.first_step);
    EXPECT_EQ(e.last_step, u.last_step);
    EXPECT_EQ(e.applied_version, results[i].applied_version);
    EXPECT_EQ(e.checksum, Hash64(u.encoded.data(), u.encoded.size()));
    EXPECT_EQ(e.bytes, u.encoded.size());
    EXPECT_EQ(std::bit_cast<uint32_t>(e.weight), std::bit_cast<uint32_t>(u.weight)) << i;
  }
  // Replaying the log on the initial floats gives the server's parameters bitwise.
  std::vector<float> replay = init;
  for (size_t i = 0; i < pushed.size(); ++i)
    if (log->entries[i].applied_version >= 0) Expect(&replay, pushed[i]);
  EXPECT_TRUE(SameBits(replay, got));
}

// A new process that takes over a site which had pushed learns where to go on, and the op log
// says so (replay re-executes both processes from it).
TEST_F(CoordinatorTest, ParameterServerTellsARejoiningProcessWhereItsSiteStopped) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 2);
  RegisterAll(clients);
  const std::vector<float> init = Floats(300, 5);
  auto first = clients[0]->ps()->Init(init, 4);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  EXPECT_EQ(*first, 0);
  ASSERT_TRUE(clients[1]->ps()->Init(init, 4).ok());
  auto pushed = clients[1]->ps()->Push(MakeUpdate(1, 0, 1, 12, 0.5f, Codec::kInt8, Floats(300, 6)));
  ASSERT_TRUE(pushed.ok()) << pushed.status().ToString();
  clients[1].reset();  // a crash
  auto fresh = Client(ClientOptions(coord->address(), 1));
  ASSERT_TRUE(fresh->Rejoin("10.0.0.1:9101", 50).ok());
  auto again = fresh->ps()->Init(init, 4);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(*again, 12);
  auto retried = fresh->ps()->Init(init, 4);  // the same process again: logged once
  ASSERT_TRUE(retried.ok());
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_EQ(log->rejoins.size(), 1u);
  EXPECT_EQ(log->rejoins[0].site, 1);
  EXPECT_EQ(log->rejoins[0].step, 12);
  EXPECT_EQ(log->rejoins[0].version, 1);
  EXPECT_EQ(log->rejoins[0].next_update, 1);
}

TEST_F(CoordinatorTest, ReadOpLogDropsATornTailAndNamesABadLine) {
  const std::string path = state_ + "/ops.jsonl";
  const std::string good =
      "{\"t\":\"init\",\"count\":4,\"checksum\":\"00000000000000ff\",\"max_staleness\":2}\n"
      "{\"t\":\"update\",\"update_id\":0,\"site\":1,\"base_version\":0,\"first_step\":0,"
      "\"last_step\":9,\"applied_version\":1,\"checksum\":\"0123456789abcdef\",\"bytes\":32,"
      "\"weight\":0.10000000149011612}\n";
  ASSERT_TRUE(WriteFileAtomic(path, good + "{\"t\":\"update\",\"upd").ok());
  auto log = ReadOpLog(path);
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->count, 4u);
  EXPECT_EQ(log->init_checksum, 0xffu);
  EXPECT_EQ(log->max_staleness, 2);
  ASSERT_EQ(log->entries.size(), 1u);
  EXPECT_EQ(log->entries[0].checksum, 0x0123456789abcdefu);
  EXPECT_EQ(log->entries[0].last_step, 9);
  EXPECT_EQ(std::bit_cast<uint32_t>(log->entries[0].weight), std::bit_cast<uint32_t>(0.1f));
  for (const auto& [text, line] :
       std::vector<std::pair<std::string, int>>{{good + "garbage\n", 3},
                                                {good + "{\"t\":\"update\",\"update_id\":5}\n", 3},
                                                {good + good, 3},
                                                {"\n" + good.substr(good.find('\n') + 1), 2}}) {
    ASSERT_TRUE(WriteFileAtomic(path, text).ok());
    auto bad = ReadOpLog(path);
    ASSERT_FALSE(bad.ok());
    EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
    EXPECT_NE(bad.status().message().find(fmt::format("ops.jsonl line {}", line)),
              std::string::npos)
        << bad.status().message();
  }
  // A weight that is not a float32 is corruption too.
  std::string w = good;
  w.replace(w.find("0.10000000149011612"), 19, "0.1");
  ASSERT_TRUE(WriteFileAtomic(path, w).ok());
  EXPECT_EQ(ReadOpLog(path).status().code(), StatusCode::kCorruption);
}

TEST_F(CoordinatorTest, ParameterServerMovesLargeParameters) {
  // Heartbeats of 2 s: moving 80 MB on a loaded machine must not look like a death.
  auto coord = StartCoordinator(1, "127.0.0.1:0", /*heartbeat_s=*/2.0);
  ASSERT_NE(coord, nullptr);
  auto opts = ClientOptions(coord->address(), 0, /*timeout_s=*/60);
  opts.heartbeat_s = 2.0;
  auto c = Client(opts);
  ASSERT_TRUE(c->Register("10.0.0.0:9000").ok());
  constexpr size_t kN = 20'000'000;  // 80 MB
  std::vector<float> init(kN);
  for (size_t i = 0; i < kN; ++i) init[i] = float(i % 100003) * 1e-3f - 7.0f;
  double t0 = NowSeconds();
  ASSERT_TRUE(c->ps()->Init(init, 0).ok());
  std::vector<float> got(kN, 0.0f);
  auto v = c->ps()->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 0);
  EXPECT_TRUE(SameBits(got, init));
  // An 80 MB uncompressed push, then a pull of the result.
  std::vector<float> delta(kN, 0.5f);
  PsUpdate u = MakeUpdate(0, 0, 0, 0, 2.0f, Codec::kNone, delta);
  auto r = c->ps()->Push(u);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_TRUE(r->accepted);
  v = c->ps()->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);
  for (size_t i = 0; i < kN; i += 9973) ASSERT_EQ(got[i], init[i] + 1.0f) << i;
  LogInfo("80 MB init + pull + push + pull: {:.2f} s", NowSeconds() - t0);
}

TEST_F(CoordinatorTest, ParameterServerStateLostWithARestartIsRefused) {
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  const std::string address = coord->address();
  auto c = Client(ClientOptions(address, 0));
  ASSERT_TRUE(c->Register("10.0.0.0:9000").ok());
  const std::vector<float> init = Floats(300, 11);
  ASSERT_TRUE(c->ps()->Init(init, 0).ok());
  ASSERT_TRUE(c->ps()->Push(MakeUpdate(0, 0, 0, 1, 1.0f, Codec::kInt8, Floats(300, 12))).ok());
  coord->Shutdown();
  coord.reset();
  coord = StartCoordinator(1, address);
  ASSERT_NE(coord, nullptr);
  // The client finds the new coordinator (registering again) and is told the state is gone.
  std::vector<float> got(300);
  auto v = c->ps()->Pull(got);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
  EXPECT_NE(v.status().message().find("the parameter server's state was lost with the "
                                      "coordinator's restart (replay the op log with `atoll "
                                      "replay`)"),
            std::string::npos)
      << v.status().message();
  EXPECT_NE(c->ps()->Init(init, 0).status().message().find("state was lost"), std::string::npos);
  auto r = c->ps()->Push(MakeUpdate(0, 1, 2, 3, 1.0f, Codec::kNone, Floats(300, 13)));
  EXPECT_NE(r.status().message().find("state was lost"), std::string::npos);
  // The op log is left as it was for the replay; membership carries on.
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->entries.size(), 1u);
  EXPECT_TRUE(c->Round(1).ok());
}

TEST_F(CoordinatorTest, ParameterServerInitOnlyLogSurvivesARestart) {
  const std::vector<float> init = Floats(300, 21);
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  const std::string address = coord->address();
  auto c = Client(ClientOptions(address, 0));
  ASSERT_TRUE(c->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(c->ps()->Init(init, 3).ok());
  coord->Shutdown();
  coord.reset();
  // A torn record after the init (never acknowledged) is dropped.
  {
    std::ofstream out(state_ + "/ops.jsonl", std::ios::app);
    out << "{\"t\":\"update\",\"upd";
  }
  coord = StartCoordinator(1, address);
  ASSERT_NE(coord, nullptr);
  // The same client carries on with the restarted coordinator; its init must match the log's.
  EXPECT_EQ(c->ps()->Init(Floats(300, 22), 3).status().code(), StatusCode::kInvalidArgument);
  ASSERT_TRUE(c->ps()->Init(init, 0).ok());
  auto r = c->ps()->Push(MakeUpdate(0, 0, 0, 1, 1.0f, Codec::kNone, Floats(300, 23)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->update_id, 0);
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->max_staleness, 3);  // the first caller's, from the log
  EXPECT_EQ(log->entries.size(), 1u);
}

TEST_F(CoordinatorTest, ParameterServerRefusesUnregisteredCallersAndAnswersRetriesOnce) {
  CoordinatorOptions o;
  o.sites = 2;
  o.heartbeat_s = 30;  // the raw site below sends no heartbeats
  o.state_dir = state_;
  o.security = Sec("coordinator");
  auto started = Coordinator::Start(o);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  auto coord = std::move(started).value();
  const WorldSecurity sec = Sec("site-1");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec));
  auto call = [&](auto rpc, const auto& req, auto* reply, const WorldSecurity& s) {
    grpc::ClientContext ctx;
    AddToken(&ctx, s);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    return ((*stub).*rpc)(&ctx, req, reply);
  };
  coord::PsInitRequest init;
  init.set_site(1);
  init.set_incarnation(77);
  const std::vector<float> params = Floats(64, 31);
  init.set_params(reinterpret_cast<const char*>(params.data()), params.size() * 4);
  coord::PsInitReply init_reply;
  grpc::Status st = call(&coord::Coordinator::Stub::PsInit, init, &init_reply, sec);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_NE(st.error_message().find("site 1 is not registered"), std::string::npos)
      << st.error_message();
  WorldSecurity wrong = sec;
  wrong.token = std::string(64, 'f');
  st = call(&coord::Coordinator::Stub::PsInit, init, &init_reply, wrong);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  init.set_site(5);
  st = call(&coord::Coordinator::Stub::PsInit, init, &init_reply, sec);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  init.set_site(1);
  // A client that has not registered is told so before it calls.
  auto c0 = Client(ClientOptions(coord->address(), 0));
  EXPECT_EQ(c0->ps()->Init(params, 0).status().code(), StatusCode::kInternal);
  EXPECT_FALSE(FileExists(state_ + "/ops.jsonl"));

  // Register site 1 by hand (site 0 completes the quorum), then push the same seq twice.
  coord::RegisterRequest reg;
  reg.set_version(kCoordinatorProtocolVersion);
  reg.set_site(1);
  reg.set_wan_address("10.0.0.1:9001");
  reg.set_config_hash(0xabcdef);
  reg.set_incarnation(77);
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return call(&coord::Coordinator::Stub::Register, reg, &reply, sec);
  });
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(raw.get().ok());
  // Another incarnation of a live site is not that site.
  init.set_incarnation(78);
  EXPECT_EQ(call(&coord::Coordinator::Stub::PsInit, init, &init_reply, sec).error_code(),
            grpc::StatusCode::ALREADY_EXISTS);
  init.set_incarnation(77);
  ASSERT_TRUE(call(&coord::Coordinator::Stub::PsInit, init, &init_reply, sec).ok());
  coord::PsPushRequest push;
  push.set_site(1);
  push.set_incarnation(77);
  push.set_seq(1);
  push.set_weight(1.0f);
  std::vector<uint8_t> enc;
  Encode(Codec::kNone, Floats(64, 32), &enc);
  push.set_encoded(reinterpret_cast<const char*>(enc.data()), enc.size());
  coord::PsPushReply a, b;
  ASSERT_TRUE(call(&coord::Coordinator::Stub::PsPush, push, &a, sec).ok());
  ASSERT_TRUE(call(&coord::Coordinator::Stub::PsPush, push, &b, sec).ok());  // a retry
  EXPECT_TRUE(a.accepted());
  EXPECT_EQ(b.update_id(), a.update_id());
  EXPECT_EQ(b.applied_version(), 1);
  std::vector<float> got(64);
  auto v = c0->ps()->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);  // applied once
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->entries.size(), 1u);
}

TEST_F(CoordinatorTest, RefusesBadOptions) {
  CoordinatorOptions o;
  o.state_dir = state_;
  o.sites = 0;
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.sites = 1;
  o.heartbeat_s = 0;
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.heartbeat_s = 1;
  o.state_dir = "";
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace atl
