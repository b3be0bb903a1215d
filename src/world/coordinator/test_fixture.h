// What the coordinator's tests share: a fixture with a run CA (and another CA) and a fresh state
// directory per test, clients and a coordinator on loopback, and a site that speaks the
// protocol by hand (RawSite). Included by coordinator_test.cc,
// coordinator/coordinator_fault_test.cc and coordinator/ps_service_test.cc (one binary each).
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "core/file.h"
#include "core/log.h"
#include "world/certs.h"
#include "world/coordinator.h"
#include "world/coordinator/durable_log.h"
#include "world/proto/coordinator.grpc.pb.h"

namespace atl::testing_coordinator {

// n normally distributed floats (a seeded draw): parameters and updates.
inline std::vector<float> Floats(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

namespace fs = std::filesystem;
constexpr double kHeartbeat = 0.2;
// Dead after this many silent intervals in the tests (1.2 s): more than the default 3, since a
// loaded machine (ctest -j2 beside a build) can stall a client's heartbeat thread for half a
// second. Tests of the detection time set their own.
constexpr int kDeadAfterBeats = 6;

inline std::string TempDir(const char* what) {
  std::string tmpl =
      (fs::temp_directory_path() / (std::string("atoll_coord_") + what + "_XXXXXX")).string();
  EXPECT_NE(::mkdtemp(tmpl.data()), nullptr);
  return tmpl;
}

inline bool Same(const Membership& a, const Membership& b) {
  if (a.epoch != b.epoch || a.sites.size() != b.sites.size()) return false;
  for (size_t i = 0; i < a.sites.size(); ++i) {
    const auto &x = a.sites[i], &y = b.sites[i];
    if (x.site != y.site || x.wan_address != y.wan_address || x.alive != y.alive ||
        x.last_round != y.last_round)
      return false;
  }
  return true;
}

inline std::string Show(const Membership& m) {
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

  std::unique_ptr<Coordinator> StartCoordinator(
      int sites, std::string listen = "127.0.0.1:0", double heartbeat_s = kHeartbeat,
      const std::function<void(CoordinatorOptions&)>& tweak = nullptr) {
    CoordinatorOptions o;
    o.listen = std::move(listen);
    o.sites = sites;
    o.heartbeat_s = heartbeat_s;
    o.dead_after_beats = kDeadAfterBeats;
    o.state_dir = state_;
    o.security = Sec("coordinator");
    if (tweak) tweak(o);
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

  inline static std::string* root_ = nullptr;
  std::string state_;
};

// How the logs reach the disk, replaced for the scope (world/coordinator/durable_log.h).
class ScopedLogHooks {
 public:
  explicit ScopedLogHooks(DurableLogHooks hooks) { SetDurableLogHooksForTesting(std::move(hooks)); }
  ~ScopedLogHooks() { SetDurableLogHooksForTesting({}); }
  ScopedLogHooks(const ScopedLogHooks&) = delete;
  ScopedLogHooks& operator=(const ScopedLogHooks&) = delete;
};

// A disk that fills up: the first write of a record that `picks` (any, when empty) gets half its
// bytes on disk, and every write after it fails with ENOSPC; the records before it are written.
inline DurableLogHooks FullDisk(std::function<bool(std::string_view record)> picks = nullptr) {
  auto writes = std::make_shared<std::atomic<int>>(0);
  DurableLogHooks h;
  h.write = [writes, picks](int fd, const char* data, size_t n) -> long {
    if (writes->load() == 0 && picks && !picks(std::string_view(data, n)))
      return long(::write(fd, data, n));
    if ((*writes)++ == 0) return long(::write(fd, data, n / 2));
    errno = ENOSPC;
    return -1;
  };
  return h;
}

// A site that speaks the protocol by hand, beating every 20 ms from its own thread.
class RawSite {
 public:
  RawSite(const std::string& address, const WorldSecurity& sec, int site, uint64_t incarnation)
      : sec_(sec),
        site_(site),
        incarnation_(incarnation),
        stub_(coord::Coordinator::NewStub(MakeChannel(address, sec, kCoordinatorParty))) {}
  ~RawSite() { StopBeats(); }

  template <class Rpc, class Req>
  grpc::Status Call(Rpc rpc, const Req& req, coord::Reply* reply, double deadline_s = 10) {
    grpc::ClientContext ctx;
    AddToken(&ctx, sec_);
    ctx.set_deadline(std::chrono::system_clock::now() +
                     std::chrono::milliseconds(int64_t(deadline_s * 1000)));
    return ((*stub_).*rpc)(&ctx, req, reply);
  }
  coord::HeartbeatRequest Beat() const {
    coord::HeartbeatRequest hb;
    hb.set_site(site_);
    hb.set_incarnation(incarnation_);
    return hb;
  }
  coord::RegisterRequest Registration() const {
    coord::RegisterRequest reg;
    reg.set_version(kCoordinatorProtocolVersion);
    reg.set_site(site_);
    reg.set_wan_address(fmt::format("10.0.0.{}:900{}", site_, site_));
    reg.set_config_hash(0xabcdef);
    reg.set_incarnation(incarnation_);
    return reg;
  }
  grpc::Status Round(int64_t r, coord::Reply* reply) {
    coord::RoundRequest req;
    req.set_site(site_);
    req.set_round(r);
    req.set_incarnation(incarnation_);
    return Call(&coord::Coordinator::Stub::Round, req, reply);
  }
  void StartBeats() {
    beating_ = true;
    beats_ = std::thread([this] {
      while (beating_) {
        coord::HeartbeatRequest hb;
        hb.set_site(site_);
        hb.set_incarnation(incarnation_);
        coord::Reply reply;
        Call(&coord::Coordinator::Stub::Heartbeat, hb, &reply);
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    });
  }
  void StopBeats() {
    beating_ = false;
    if (beats_.joinable()) beats_.join();
  }

 private:
  WorldSecurity sec_;
  int site_;
  uint64_t incarnation_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;
  std::atomic<bool> beating_{false};
  std::thread beats_;
};

}  // namespace atl::testing_coordinator
