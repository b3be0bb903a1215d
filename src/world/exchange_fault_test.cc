// A world of three sites with a real coordinator, one site in a child process that is stopped
// (SIGSTOP) in the middle of an exchange: it is declared dead after the configured heartbeats,
// the others learn it from their heartbeat replies, their receives from it fail at once
// (WanEndpoint::PeerLost), and the exchange is redone over the two survivors — within the
// dead-site time, not after the transport's timeout (60 s here; keepalive 60 s too, so only the
// coordinator's word can end the wait).
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <thread>

#include "core/log.h"
#include "world/coordinator.h"
#include "world/exchange.h"
#include "world/proto/transport.pb.h"
#include "world/transport/test_world.h"
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl {
namespace {

constexpr double kHeartbeat = 0.2;
constexpr int kDeadAfter = 3;
constexpr double kPatience = 60;  // the transport's timeout and keepalive

using namespace testing_wan;  // NOLINT: Insecure, Pipe

// What a site's leader holds in a world (as `atoll train` does): its endpoint, its coordinator
// client, whose membership changes fail operations with dead peers, the WAN and the exchange.
struct Site {
  std::unique_ptr<WanEndpoint> ep;
  std::unique_ptr<CoordinatorClient> client;
  std::unique_ptr<Communicator> wan;
  std::unique_ptr<SiteExchange> exchange;
};

StatusOr<std::unique_ptr<Site>> Join(int site, const std::string& coordinator) {
  auto s = std::make_unique<Site>();
  ATOLL_ASSIGN_OR_RETURN(s->ep, WanEndpoint::Listen("127.0.0.1:0", Insecure(), kPatience));
  CoordinatorClientOptions co;
  co.address = coordinator;
  co.site = site;
  co.heartbeat_s = kHeartbeat;
  co.timeout_s = kPatience;
  co.security = Insecure();
  WanEndpoint* ep = s->ep.get();
  co.on_membership = [ep, site](const Membership& m) {
    for (const SiteInfo& i : m.Dead(site)) ep->PeerLost(i.site, i.wan_address, "declared dead");
  };
  ATOLL_ASSIGN_OR_RETURN(s->client, CoordinatorClient::Connect(co));
  ATOLL_ASSIGN_OR_RETURN(const Membership m, s->client->Register(s->ep->address()));
  WanOptions wo;
  wo.site = site;
  for (const SiteInfo& i : m.sites) wo.peers.push_back({i.site, i.wan_address});
  wo.choose_ring = false;
  wo.timeout_s = kPatience;
  wo.keepalive_s = kPatience;
  wo.link = [](int, int) { return LinkProfile{2, 400, 0}; };
  ATOLL_ASSIGN_OR_RETURN(s->wan, s->ep->Connect(wo));
  ExchangeOptions eo;
  eo.site = site;
  eo.sites = 3;
  eo.quorum = 2;
  CoordinatorClient* client = s->client.get();
  eo.round = [client](int64_t r, std::optional<RoundVote> v) { return client->Round(r, v); };
  s->exchange = std::make_unique<SiteExchange>(s->wan.get(), eo);
  return s;
}

std::vector<float> Contribution(int site, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = float(site + 1) + float(i % 97) * 0.25f;
  return v;
}

constexpr size_t kFloats = size_t{1} << 20;
constexpr int64_t kStopRound = 3;

// The child: site 2. Runs exchanges until one fails; tells the parent when it is in the middle
// of exchange kStopRound's all-gather (its first piece of it is about to go out).
[[noreturn]] void RunChild(const Pipe& to_child, const Pipe& from_child) {
  const std::string coordinator = to_child.Read();
  std::atomic<bool> told{false};
  // exchange.cc's tags: ((round * 8 + attempt) * 2 + phase); phase 1 is the all-gather.
  const uint32_t all_gather = uint32_t((kStopRound * 8 + 0) * 2 + 1);
  SetWanChunkHookForTesting([&](int from, int, wan::Chunk& c) {
    if (from == 2 && c.tag() == all_gather && !told.exchange(true)) {
      from_child.Write("all-gather");
      std::this_thread::sleep_for(std::chrono::milliseconds(300));  // stopped in here
    }
  });
  auto site = Join(2, coordinator);
  if (!site.ok()) ::_exit(10);
  for (int64_t r = 0;; ++r) {
    auto data = Contribution(2, kFloats);
    if (!(*site)->exchange->Average(r, data, {}).ok()) ::_exit(0);
  }
}

TEST(ExchangeFault, ASiteStoppedMidExchangeIsLeftOutWithinTheDeadSiteTime) {
  Pipe to_child, from_child;
  const pid_t pid = ::fork();  // before this process starts any gRPC thread
  ASSERT_GE(pid, 0);
  if (pid == 0) RunChild(to_child, from_child);
  ReapAtExit reap{pid};

  std::string state = (std::filesystem::temp_directory_path() / "atoll_xfault_XXXXXX").string();
  ASSERT_NE(::mkdtemp(state.data()), nullptr);
  CoordinatorOptions o;
  o.sites = 3;
  o.heartbeat_s = kHeartbeat;
  o.dead_after_beats = kDeadAfter;
  o.state_dir = state;
  o.security = Insecure();
  auto coordinator = Coordinator::Start(o);
  ASSERT_TRUE(coordinator.ok()) << coordinator.status().ToString();
  to_child.Write((*coordinator)->address());

  std::vector<Status> status(2);
  std::vector<ExchangeResult> last(2);
  std::vector<std::vector<float>> result(2);
  std::atomic<double> stopped_at{0};
  std::vector<double> took(2, -1);
  std::vector<std::thread> threads;
  for (int s = 0; s < 2; ++s)
    threads.emplace_back([&, s] {
      auto site = Join(s, (*coordinator)->address());
      if (!site.ok()) {
        status[size_t(s)] = site.status();
        return;
      }
      for (int64_t r = 0; r <= kStopRound; ++r) {
        auto data = Contribution(s, kFloats);
        auto x = (*site)->exchange->Average(r, data, {});
        if (!x.ok()) {
          status[size_t(s)] = x.status();
          return;
        }
        last[size_t(s)] = *x;
        result[size_t(s)] = std::move(data);
      }
      took[size_t(s)] = NowSeconds() - stopped_at.load();
    });
  ASSERT_EQ(from_child.Read(), "all-gather") << "the child never reached the exchange";
  ::kill(pid, SIGSTOP);
  stopped_at = NowSeconds();
  for (auto& t : threads) t.join();

  const auto a = Contribution(0, kFloats), b = Contribution(1, kFloats);
  for (int s = 0; s < 2; ++s) {
    ASSERT_TRUE(status[size_t(s)].ok()) << "site " << s << ": " << status[size_t(s)].ToString();
    EXPECT_EQ(last[size_t(s)].sites, (std::vector<int>{0, 1})) << "site " << s;
    EXPECT_GE(last[size_t(s)].attempts, 2) << "site " << s;  // begun with site 2, redone without
    for (size_t i = 0; i < kFloats; i += 4099)
      ASSERT_EQ(result[size_t(s)][i], (0.0f + a[i] + b[i]) * 0.5f) << "site " << s << " at " << i;
    // Dead after 3 x 0.2 s, known at the next beat (0.1 s); the rest is slack for a loaded
    // machine. The transport alone would have waited 60 s.
    EXPECT_LT(took[size_t(s)], kDeadAfter * kHeartbeat + 10) << "site " << s;
    LogInfo("exchange_fault_test: site {} finished round {} {:.2f} s after site 2 stopped", s,
            kStopRound, took[size_t(s)]);
  }
  EXPECT_FALSE((*coordinator)->membership().sites[2].alive);
  (*coordinator)->Shutdown();
  std::filesystem::remove_all(state);
}

}  // namespace
}  // namespace atl
