// The coordinator on loopback: registration checks, quorum, round barriers, leaving, the durable
// log across a restart, authentication (token, TLS from another CA), options. Faults:
// coordinator_fault_test; the parameter server: ps_service_test (both in world/coordinator/).
#include "world/coordinator.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <thread>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "world/certs.h"
#include "world/codec.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/test_fixture.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/ps.h"

namespace atl {
namespace {

using namespace testing_coordinator;  // NOLINT: the shared fixture
namespace fs = std::filesystem;

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
  std::this_thread::sleep_for(std::chrono::duration<double>((kDeadAfterBeats + 2) * kHeartbeat));
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
  EXPECT_LT(NowSeconds() - t0, 5.0);  // its timeout is 1.5 s
}

TEST_F(CoordinatorTest, RefusesAWrongProtocolVersion) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  const WorldSecurity sec = Sec("site-0");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec, kCoordinatorParty));
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
  EXPECT_NE(
      st.error_message().find(fmt::format("protocol version {}", kCoordinatorProtocolVersion + 98)),
      std::string::npos)
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

  // Refused on its metadata, before the server reads its body (32 MB of parameters here): the
  // refusal is the auth processor's, not a handler's.
  const WorldSecurity sec = o.security;
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec, kCoordinatorParty));
  coord::PsInitRequest init;
  init.set_site(0);
  init.set_params(std::string(size_t{32} << 20, '\0'));
  coord::PsInitReply reply;
  grpc::ClientContext ctx;
  AddToken(&ctx, sec);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  ::testing::internal::CaptureStderr();
  const grpc::Status st = stub->PsInit(&ctx, init, &reply);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << st.error_message();
  EXPECT_NE(log.find("refused a caller with the certificate of \"site-0\" before reading its "
                     "call: missing or wrong token"),
            std::string::npos)
      << log;
  EXPECT_EQ(log.find("coordinator: refused PsInit"), std::string::npos) << log;
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
  // Dead after kDeadAfterBeats intervals; the slack is for a loaded machine.
  EXPECT_LE(NowSeconds() - t_kill, kDeadAfterBeats * kHeartbeat + 1.5);
  EXPECT_TRUE(Same(m[0], m[1])) << Show(m[0]) << " vs " << Show(m[1]);
  EXPECT_EQ(m[0].epoch, epoch + 1);
  EXPECT_FALSE(m[0].sites[2].alive);
  EXPECT_FALSE(m[0].sites[2].left);  // dead, not left: what waits for it must fail
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
  EXPECT_TRUE(r->sites[1].left);  // its part is done: nothing waiting for it fails
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
  std::this_thread::sleep_for(std::chrono::duration<double>((kDeadAfterBeats + 2) * kHeartbeat));
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

TEST_F(CoordinatorTest, RefusesBadOptions) {
  CoordinatorOptions o;
  o.state_dir = state_;
  o.sites = 0;
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.sites = 1;
  o.heartbeat_s = 0;
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.heartbeat_s = 1;
  o.dead_after_beats = 1;  // one late beat would kill a site
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
  o.dead_after_beats = 3;
  o.state_dir = "";
  EXPECT_EQ(Coordinator::Start(o).status().code(), StatusCode::kInvalidArgument);
}

// Identities (world/security.h): a site's valid certificate used to claim another site is refused
// (PERMISSION_DENIED naming both), and nothing about that site changes; a server holding a site's
// certificate cannot pose as the coordinator (the client checks the server's name).
TEST_F(CoordinatorTest, ACertificateOfAnotherPartyIsRefused) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  CoordinatorClientOptions o = ClientOptions(coord->address(), 2, /*timeout_s=*/3);
  o.security = Sec("site-1");  // site 1's key, claiming site 2
  auto impostor = Client(o);
  ASSERT_NE(impostor, nullptr);
  auto m = impostor->Register("10.0.0.2:9000");
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("its certificate is for \"site-1\" but it claims to be "
                                      "site-2"),
            std::string::npos)
      << m.status().ToString();
  EXPECT_EQ(coord->membership().live(), 0);
  EXPECT_TRUE(coord->membership().sites[2].wan_address.empty());
  // Every other site call is held to the same check (a heartbeat, a round, a pull of the
  // parameter server's state, a peek at the membership, leaving).
  const WorldSecurity one = Sec("site-1");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), one, kCoordinatorParty));
  auto denied = [&](auto rpc, auto req, auto reply) {
    req.set_site(2);
    grpc::ClientContext ctx;
    AddToken(&ctx, one);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    const grpc::Status st = ((*stub).*rpc)(&ctx, req, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::PERMISSION_DENIED) << st.error_message();
  };
  denied(&coord::Coordinator::Stub::Heartbeat, coord::HeartbeatRequest(), coord::Reply());
  denied(&coord::Coordinator::Stub::Round, coord::RoundRequest(), coord::Reply());
  denied(&coord::Coordinator::Stub::Peek, coord::PeekRequest(), coord::Reply());
  denied(&coord::Coordinator::Stub::Leave, coord::LeaveRequest(), coord::Reply());
  denied(&coord::Coordinator::Stub::PsPull, coord::PsPullRequest(), coord::PsPullReply());
  denied(&coord::Coordinator::Stub::PsInit, coord::PsInitRequest(), coord::PsInitReply());
  denied(&coord::Coordinator::Stub::PsPush, coord::PsPushRequest(), coord::PsPushReply());

  // A "coordinator" serving with site 0's certificate: site 1 refuses it.
  auto fake = StartCoordinator(3, "127.0.0.1:0", kHeartbeat,
                               [](CoordinatorOptions& c) { c.security = Sec("site-0"); });
  ASSERT_NE(fake, nullptr);
  auto victim = Client(ClientOptions(fake->address(), 1, /*timeout_s=*/3));
  ASSERT_NE(victim, nullptr);
  auto r = victim->Register("10.0.0.1:9000");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("Peer name coordinator is not in peer certificate"),
            std::string::npos)
      << r.status().ToString();
  EXPECT_EQ(fake->membership().live(), 0);
}

}  // namespace
}  // namespace atl
