// The coordinator when things go wrong, on purpose: sites that stop beating (declared dead
// after the configured beats, and never falsely while the disk is slow or the coordinator itself
// is stopped), a disk that fills up (no torn record, the coordinator stops and resumes cleanly),
// a dead site that must rejoin, a stale retried Round, replies that must never reveal what the
// log could still lose, votes across a restart, and a new process rejoining at the round it
// names.
#include <gtest/gtest.h>
#include <signal.h>
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
#include "world/coordinator.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/test_fixture.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/ps.h"
#include "world/transport/test_world.h"

namespace atl {
namespace {

using namespace testing_coordinator;  // NOLINT: the shared fixture
namespace fs = std::filesystem;

TEST_F(CoordinatorTest, DeclaresASilentSiteDeadAfterTheConfiguredBeats) {
  for (int beats : {3, 5}) {
    SCOPED_TRACE(fmt::format("dead after {} beats", beats));
    auto coord = StartCoordinator(3, "127.0.0.1:0", kHeartbeat,
                                  [&](CoordinatorOptions& o) { o.dead_after_beats = beats; });
    ASSERT_NE(coord, nullptr);
    auto clients = Clients(coord->address(), 3);
    auto m = RegisterAll(clients);
    const int64_t epoch = coord->membership().epoch;
    const double t_kill = NowSeconds();
    clients[1].reset();  // stops heartbeating without leaving: a crash
    const double waited = WaitDead(coord.get(), 1, 30);
    ASSERT_GE(waited, 0) << "site 1 was never declared dead";
    const double since_kill = NowSeconds() - t_kill;
    // Not before it was silent for the configured beats (the coordinator's own measure, in its
    // death record: when the last beat came before the kill depends on scheduling); and soon
    // after, from the kill (the monitor looks every 1/20 interval; the slack is for a loaded
    // machine, ctest -j2 beside a build).
    const std::string log = LogText();
    const size_t at = log.find("\"silent_s\":");
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_GE(std::stod(log.substr(at + 11)), beats * kHeartbeat);
    EXPECT_LE(since_kill, beats * kHeartbeat + 1.5);
    auto after = coord->membership();
    EXPECT_EQ(after.epoch, epoch + 1);
    EXPECT_TRUE(after.sites[0].alive);
    EXPECT_TRUE(after.sites[2].alive);
    std::this_thread::sleep_for(std::chrono::duration<double>(4 * kHeartbeat));
    EXPECT_EQ(coord->membership().live(), 2);
    EXPECT_EQ(coord->membership().epoch, epoch + 1);
    EXPECT_NE(LogText().find("\"death\""), std::string::npos);
    clients.clear();
    coord.reset();
    fs::remove_all(state_);
  }
}

// A slow disk: every fdatasync takes 1.5 heartbeat intervals while three sites run rounds as fast
// as they can (every completed round is a record to make durable). Over 200 beats no site may be
// declared dead: the sync runs outside the coordinator's lock and heartbeats never wait for it.
// A site that really stops beating is still declared dead within the configured time.
TEST_F(CoordinatorTest, ASlowLogDeclaresNoFalseDeaths) {
  const double hb = 0.2;
  std::atomic<int> syncs{0};
  DurableLogHooks hooks;
  hooks.before_sync = [&](const std::string&) {
    ++syncs;
    std::this_thread::sleep_for(std::chrono::duration<double>(1.5 * hb));
    return 0;
  };
  ScopedLogHooks slow_disk(hooks);
  auto coord =
      StartCoordinator(3, "127.0.0.1:0", hb, [](CoordinatorOptions& o) { o.dead_after_beats = 3; });
  ASSERT_NE(coord, nullptr);
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < 3; ++i) {
    auto o = ClientOptions(coord->address(), i, 60);
    o.heartbeat_s = hb;
    clients.push_back(Client(o));
  }
  RegisterAll(clients);
  const int64_t epoch = coord->membership().epoch;
  // Every site runs rounds 0, 1, 2, ... until they all reach stop_at.
  std::atomic<int64_t> stop_at{std::numeric_limits<int64_t>::max()}, reached{0};
  std::vector<std::thread> sites;
  std::vector<Status> errors(3);
  for (int i = 0; i < 3; ++i)
    sites.emplace_back([&, i] {
      for (int64_t r = 0; r < stop_at.load(); ++r) {
        auto m = clients[size_t(i)]->Round(r);
        if (!m.ok()) {
          errors[size_t(i)] = m.status();
          return;
        }
        int64_t seen = reached.load();
        while (seen < r && !reached.compare_exchange_weak(seen, r)) {
        }
      }
    });
  const double t0 = NowSeconds();
  while (NowSeconds() - t0 < 200 * hb / 2) {  // 200 beats
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    if (coord->membership().epoch != epoch) break;
  }
  stop_at = reached.load() + 2;
  for (auto& t : sites) t.join();
  for (const Status& e : errors) EXPECT_TRUE(e.ok()) << e.ToString();
  EXPECT_EQ(coord->membership().epoch, epoch) << "a site was declared dead: " << LogText();
  EXPECT_EQ(LogText().find("\"death\""), std::string::npos);
  EXPECT_GT(reached.load(), 10) << "the rounds hardly ran";
  EXPECT_GT(syncs.load(), 10);
  // A crash is still seen in time, fsyncs as slow as before.
  clients[2].reset();
  const double waited = WaitDead(coord.get(), 2, 30);
  ASSERT_GE(waited, 0) << "site 2 was never declared dead";
  EXPECT_LE(waited, 3 * hb + 1.5);
  EXPECT_EQ(coord->membership().live(), 2);
}

// The coordinator's own process stopped (SIGSTOP; as a VM losing its CPU, or a debugger) for
// three dead-site times while both sites beat on: when it runs again it heard none of their
// beats, but that silence is its own, so no site is declared dead (it counts silence again from
// when it resumed). A site that really stops afterwards is still declared dead in time.
TEST_F(CoordinatorTest, ACoordinatorStoppedForAWhileDeclaresNoSiteDeadForIt) {
  const double dead_s = kDeadAfterBeats * kHeartbeat;
  testing_wan::Pipe from_child;
  const pid_t pid = ::fork();  // before this process starts any gRPC thread
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(from_child.fd[0]);
    from_child.fd[0] = -1;
    auto coord = StartCoordinator(2);
    if (coord == nullptr) ::_exit(10);
    from_child.Write(coord->address());
    for (;;) ::pause();
  }
  // The child's end alone stays open: a child that exits without an address ends the read.
  ::close(from_child.fd[1]);
  from_child.fd[1] = -1;
  testing_wan::ReapAtExit reap{pid};
  const std::string address = from_child.Read();
  ASSERT_FALSE(address.empty()) << "the coordinator did not start";
  std::vector<std::unique_ptr<CoordinatorClient>> clients;
  for (int i = 0; i < 2; ++i) clients.push_back(Client(ClientOptions(address, i, 60)));
  const int64_t epoch = RegisterAll(clients)[0].epoch;
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * dead_s));
  ASSERT_EQ(::kill(pid, SIGCONT), 0);
  // Three dead-site times more: a death declared for the pause would be known by then.
  std::this_thread::sleep_for(std::chrono::duration<double>(3 * dead_s));
  auto m = clients[0]->Peek();
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->epoch, epoch) << Show(*m);
  EXPECT_EQ(m->live(), 2) << Show(*m);
  EXPECT_EQ(LogText().find("\"death\""), std::string::npos) << LogText();
  clients[1].reset();  // stops beating without leaving: a crash
  const double t_kill = NowSeconds();
  for (;;) {
    m = clients[0]->Peek();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    if (!m->sites[1].alive) break;
    ASSERT_LT(NowSeconds() - t_kill, dead_s + 10) << "site 1 was never declared dead";
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_EQ(m->epoch, epoch + 1);
}

// The disk fills up while site 1 registers: its register record is written half-way. The
// coordinator cuts the partial record off, does not register site 1, stops (every call refused,
// failure() and on_failure say why), and a restart on the same directory resumes from the log,
// which reads back cleanly with site 0 alone registered.
TEST_F(CoordinatorTest, AFailedAppendStopsTheCoordinatorWithAnIntactLog) {
  std::atomic<int> failures{0};
  auto coord = StartCoordinator(2, "127.0.0.1:0", kHeartbeat,
                                [&](CoordinatorOptions& o) { o.on_failure = [&] { ++failures; }; });
  ASSERT_NE(coord, nullptr);
  auto c0 = Client(ClientOptions(coord->address(), 0, 5));
  auto r0 = std::async(std::launch::async, [&] { return c0->Register("10.0.0.0:9000"); });
  // Site 0's record is in before the disk fills up.
  const double t0 = NowSeconds();
  while (LogText().find("\"register\"") == std::string::npos && NowSeconds() - t0 < 10)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  const std::string before = LogText();
  std::optional<ScopedLogHooks> full;
  full.emplace(FullDisk());
  auto c1 = Client(ClientOptions(coord->address(), 1, 3));
  auto r1 = c1->Register("10.0.0.1:9001");
  ASSERT_FALSE(r1.ok());
  EXPECT_NE(r1.status().message().find("the coordinator stopped"), std::string::npos)
      << r1.status().ToString();
  EXPECT_FALSE(r0.get().ok());
  const Status why = coord->failure();
  ASSERT_FALSE(why.ok());
  EXPECT_NE(why.message().find("coordinator.log"), std::string::npos) << why.message();
  EXPECT_NE(why.message().find("No space left on device"), std::string::npos) << why.message();
  EXPECT_EQ(failures.load(), 1);
  EXPECT_FALSE(coord->membership().sites[1].alive);
  EXPECT_EQ(LogText(), before) << "the partial record was left behind";
  full.reset();  // the disk is fixed
  coord->Shutdown();
  coord.reset();
  c0.reset();
  c1.reset();
  coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr) << "the log did not survive the failed append";
  EXPECT_TRUE(coord->membership().sites[0].alive);
  EXPECT_FALSE(coord->membership().sites[1].alive);
  EXPECT_TRUE(coord->failure().ok());
}

TEST_F(CoordinatorTest, ADeadSiteIsToldSoAndMustRejoin) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  // Site 1 speaks the protocol by hand and never sends a heartbeat.
  RawSite site1(coord->address(), Sec("site-1"), 1, 77);
  coord::RegisterRequest reg = site1.Registration();
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return site1.Call(&coord::Coordinator::Stub::Register, reg, &reply);
  });
  auto c0 = Client(ClientOptions(coord->address(), 0));
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(raw.get().ok());
  ASSERT_GE(WaitDead(coord.get(), 1), 0);
  coord::Reply reply;
  grpc::Status st = site1.Round(1, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::ABORTED);
  EXPECT_NE(st.error_message().find("site 1 was declared dead"), std::string::npos)
      << st.error_message();
  // A plain registration cannot bring it back after the quorum: it would join with no round,
  // holding up every round from 0. It is refused, and nothing changes.
  const int64_t epoch = coord->membership().epoch;
  st = site1.Call(&coord::Coordinator::Stub::Register, reg, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(st.error_message().find("must rejoin"), std::string::npos) << st.error_message();
  EXPECT_EQ(coord->membership().epoch, epoch);
  EXPECT_FALSE(coord->membership().sites[1].alive);
  // The same through the client: a clear refusal, not a retry until the timeout.
  auto fresh = Client(ClientOptions(coord->address(), 1, 5));
  auto plain = fresh->Register("10.0.0.1:9101");
  ASSERT_FALSE(plain.ok());
  EXPECT_EQ(plain.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(plain.status().message().find("must rejoin"), std::string::npos)
      << plain.status().ToString();
  // Rejoining at a round is how it comes back.
  reg.set_rejoin(true);
  reg.set_join_round(4);
  ASSERT_TRUE(site1.Call(&coord::Coordinator::Stub::Register, reg, &reply).ok());
  // (From the reply: the coordinator's state may by now have declared the beatless site dead.)
  EXPECT_EQ(reply.membership().epoch(), epoch + 1);
  EXPECT_TRUE(reply.membership().sites(1).alive());
  EXPECT_EQ(reply.membership().sites(1).last_round(), 3);
}

// A retried Round (a reply lost, the call sent again) may arrive after the site went further:
// it must not lower the site's round, which would hold up the rounds the site has passed.
TEST_F(CoordinatorTest, AStaleRoundNeverLowersASitesRound) {
  auto coord = StartCoordinator(2, "127.0.0.1:0", 1.0);  // nobody dies of a slow machine here
  ASSERT_NE(coord, nullptr);
  RawSite site1(coord->address(), Sec("site-1"), 1, 78);
  site1.StartBeats();  // refused until registered; then they count
  coord::RegisterRequest reg = site1.Registration();
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return site1.Call(&coord::Coordinator::Stub::Register, reg, &reply);
  });
  auto c0 = Client(ClientOptions(coord->address(), 0));
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(raw.get().ok());
  auto r0 = std::async(std::launch::async, [&] { return c0->Round(5); });
  coord::Reply reply;
  ASSERT_TRUE(site1.Round(5, &reply).ok());
  ASSERT_TRUE(r0.get().ok());
  ASSERT_TRUE(site1.Round(3, &reply).ok());  // the stale retry: round 3 is long complete
  EXPECT_EQ(coord->membership().sites[1].last_round, 5);
  // Round 5 is still done for everyone, and round 6 waits for both.
  auto r6 = std::async(std::launch::async, [&] { return c0->Round(6); });
  EXPECT_EQ(r6.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout);
  ASSERT_TRUE(site1.Round(6, &reply).ok());
  ASSERT_TRUE(r6.get().ok());
}

// No reply may reveal a change the log could still lose, and a hung disk holds up neither
// heartbeats nor the monitor: site 1 dies while the disk hangs, so its death record is appended
// but not durable. Heartbeats are answered at once, with the durable membership (site 1 alive);
// site 0's beats count; site 2, which stops beating meanwhile, is declared dead too. Once the
// disk is back, the replies show both deaths.
TEST_F(CoordinatorTest, NoReplyRevealsAChangeTheLogCouldStillLose) {
  std::mutex mu;
  std::condition_variable cv;
  bool hold = false, held = false;
  DurableLogHooks hooks;
  hooks.before_sync = [&](const std::string&) {
    std::unique_lock<std::mutex> lk(mu);
    if (hold) {
      held = true;
      cv.notify_all();
      cv.wait(lk, [&] { return !hold; });
    }
    return 0;
  };
  ScopedLogHooks slow_disk(hooks);
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  // Whatever fails below, the disk comes back before the coordinator shuts down (its syncer
  // would wait for it forever).
  struct Release {
    std::mutex& mu;
    std::condition_variable& cv;
    bool& hold;
    ~Release() {
      {
        std::lock_guard<std::mutex> lk(mu);
        hold = false;
      }
      cv.notify_all();
    }
  } release{mu, cv, hold};
  RawSite site0(coord->address(), Sec("site-0"), 0, 91);
  site0.StartBeats();  // site 0 stays alive by its own beats, whatever the disk does
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return site0.Call(&coord::Coordinator::Stub::Register, site0.Registration(), &reply);
  });
  auto c1 = Client(ClientOptions(coord->address(), 1));
  auto c2 = Client(ClientOptions(coord->address(), 2));
  auto r2 = std::async(std::launch::async, [&] { return c2->Register("10.0.0.2:9002"); });
  ASSERT_TRUE(c1->Register("10.0.0.1:9001").ok());
  ASSERT_TRUE(r2.get().ok());
  ASSERT_TRUE(raw.get().ok());
  {
    std::lock_guard<std::mutex> lk(mu);
    hold = true;
  }
  c1.reset();  // a crash: the death record is appended, its fdatasync hangs
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(20), [&] { return held; }));
  }
  ASSERT_FALSE(coord->membership().sites[1].alive);  // the state moved on ...
  for (int i = 0; i < 3; ++i) {
    coord::Reply reply;
    grpc::Status st = site0.Call(&coord::Coordinator::Stub::Heartbeat, site0.Beat(), &reply, 5);
    // ... but no reply says so, and none waits for the disk.
    ASSERT_TRUE(st.ok()) << st.error_message();
    EXPECT_TRUE(reply.membership().sites(1).alive()) << "a reply showed the death";
  }
  c2.reset();  // the monitor is not stuck behind the disk: this death is declared too
  EXPECT_GE(WaitDead(coord.get(), 2, 20), 0) << "the monitor waited for the disk";
  EXPECT_TRUE(coord->membership().sites[0].alive) << "site 0's beats did not count";
  {
    std::lock_guard<std::mutex> lk(mu);
    hold = false;
  }
  cv.notify_all();
  // Durable now: a reply soon shows both deaths.
  const double t0 = NowSeconds();
  coord::Reply reply;
  do {
    ASSERT_TRUE(site0.Call(&coord::Coordinator::Stub::Heartbeat, site0.Beat(), &reply).ok());
    if (!reply.membership().sites(1).alive() && !reply.membership().sites(2).alive()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (NowSeconds() - t0 < 20);
  EXPECT_FALSE(reply.membership().sites(1).alive());
  EXPECT_FALSE(reply.membership().sites(2).alive());
  EXPECT_TRUE(coord->membership().sites[0].alive);
}

// Votes: every site of a round gets every live site's vote, the same map, and a coordinator
// restarted before a site saw the reply answers its retried Round with the same votes.
TEST_F(CoordinatorTest, RoundVotesReachEverySiteAndSurviveARestart) {
  auto coord = StartCoordinator(3);
  ASSERT_NE(coord, nullptr);
  const std::string address = coord->address();
  auto clients = Clients(address, 3);
  RegisterAll(clients);
  const RoundVote votes[3] = {{false, 0x1111}, {true, 0x2222}, {false, 0x1111}};
  std::vector<std::future<StatusOr<Membership>>> f;
  for (int i = 0; i < 3; ++i)
    f.push_back(std::async(std::launch::async, [&, i] {
      return i == 2 ? clients[2]->Round(7) : clients[size_t(i)]->Round(7, votes[i]);
    }));
  std::vector<Membership> got;
  for (auto& x : f) {
    auto m = x.get();
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    got.push_back(*m);
  }
  for (const Membership& m : got) {
    ASSERT_EQ(m.votes.size(), 2u);  // site 2 cast none
    EXPECT_EQ(m.votes.at(0), votes[0]);
    EXPECT_EQ(m.votes.at(1), votes[1]);
  }
  coord->Shutdown();
  coord.reset();
  coord = StartCoordinator(3, address);
  ASSERT_NE(coord, nullptr);
  auto again = clients[0]->Round(7, votes[0]);
  ASSERT_TRUE(again.ok()) << again.status().ToString();
  EXPECT_EQ(again->votes, got[0].votes);
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

}  // namespace
}  // namespace atl
