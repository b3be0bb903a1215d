// Who may call the parameter server the coordinator hosts (world/ps.h): unregistered callers and
// other incarnations refused, a retried push answered once (across a restart too), a push of a
// process taken over from refused, a site of another build named in the op log.
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <string>
#include <vector>

#include "core/build_info.h"
#include "core/file.h"
#include "world/codec.h"
#include "world/coordinator.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/ps_service.h"
#include "world/coordinator/test_fixture.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/ps.h"

namespace atl {
namespace {

using namespace testing_coordinator;  // NOLINT: the shared fixture

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
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec, kCoordinatorParty));
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
  // A restarted coordinator answers the retry alike: the decision and its pusher are logged.
  const std::string address = coord->address();
  coord->Shutdown();
  coord.reset();
  o.listen = address;
  started = Coordinator::Start(o);
  ASSERT_TRUE(started.ok()) << started.status().ToString();
  coord = std::move(started).value();
  stub = coord::Coordinator::NewStub(MakeChannel(address, sec, kCoordinatorParty));
  coord::PsPushReply after;
  st = call(&coord::Coordinator::Stub::PsPush, push, &after, sec);
  ASSERT_TRUE(st.ok()) << st.error_message();
  EXPECT_EQ(after.update_id(), a.update_id());
  EXPECT_EQ(after.applied_version(), 1);
  log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok());
  EXPECT_EQ(log->entries.size(), 1u);
}

// The caller check and the push's lock are apart: a process's push can pass the check just
// before a new process of its site takes it over (Init). Its push then must not count: the new
// process goes on after the site's last decided step, and the old one's steps would be counted
// twice. (The check is made to let every incarnation through, as in that race.)
TEST_F(CoordinatorTest, ParameterServerRefusesAPushOfAProcessTakenOverFrom) {
  PsService ps(
      state_, 2, /*coordinator_id=*/7,
      [](const grpc::ServerContext&, const char*, int, uint64_t) { return grpc::Status::OK; });
  ASSERT_TRUE(ps.Start().ok());
  grpc::ServerContext ctx;
  const std::vector<float> params = Floats(64, 41);
  auto init = [&](uint64_t incarnation) {
    coord::PsInitRequest req;
    req.set_site(1);
    req.set_incarnation(incarnation);
    req.set_params(reinterpret_cast<const char*>(params.data()), params.size() * 4);
    coord::PsInitReply reply;
    const grpc::Status st = ps.Init(&ctx, req, &reply);
    EXPECT_TRUE(st.ok()) << st.error_message();
    return reply;
  };
  std::vector<uint8_t> enc;
  Encode(Codec::kNone, Floats(64, 42), &enc);
  auto push = [&](uint64_t incarnation, uint64_t seq, int64_t base, int64_t first, int64_t last,
                  coord::PsPushReply* reply) {
    coord::PsPushRequest req;
    req.set_site(1);
    req.set_incarnation(incarnation);
    req.set_seq(seq);
    req.set_base_version(base);
    req.set_first_step(first);
    req.set_last_step(last);
    req.set_weight(1.0f);
    req.set_encoded(reinterpret_cast<const char*>(enc.data()), enc.size());
    return ps.Push(&ctx, req, reply);
  };
  init(77);
  coord::PsPushReply a;
  ASSERT_TRUE(push(77, 1, 0, 1, 4, &a).ok());
  ASSERT_TRUE(a.accepted());
  EXPECT_EQ(init(78).last_step(), 4);  // a new process takes site 1 over after its step 4
  coord::PsPushReply late;
  const grpc::Status refused = push(77, 2, 1, 5, 8, &late);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_NE(refused.error_message().find("a newer process"), std::string::npos)
      << refused.error_message();
  coord::PsPushReply b;
  ASSERT_TRUE(push(78, 1, 1, 5, 8, &b).ok());  // the new process's own push counts
  EXPECT_TRUE(b.accepted());
  EXPECT_EQ(b.applied_version(), 2);
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  ASSERT_EQ(log->entries.size(), 2u);  // the old process's late push is not in the log
  EXPECT_EQ(log->entries[1].first_step, 5);
}

// A site that runs another build or CPU than the one that initialized the server is named in
// the op log (once per process), so a replay can say why it cannot be bitwise.
TEST_F(CoordinatorTest, ParameterServerLogsASiteOfAnotherBuild) {
  auto coord = StartCoordinator(2, "127.0.0.1:0", 30);  // the raw site sends no heartbeats
  ASSERT_NE(coord, nullptr);
  RawSite site1(coord->address(), Sec("site-1"), 1, 81);
  auto raw = std::async(std::launch::async, [&] {
    coord::Reply reply;
    return site1.Call(&coord::Coordinator::Stub::Register, site1.Registration(), &reply);
  });
  auto c0 = Client(ClientOptions(coord->address(), 0));
  ASSERT_TRUE(c0->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(raw.get().ok());
  const std::vector<float> params = Floats(64, 41);
  ASSERT_TRUE(c0->ps()->Init(params, 2).ok());
  coord::PsInitRequest init;
  init.set_site(1);
  init.set_incarnation(81);
  init.set_params(reinterpret_cast<const char*>(params.data()), params.size() * 4);
  init.set_build_id("0123456789abcdef");
  init.set_cpu("Another CPU | avx2");
  const WorldSecurity sec = Sec("site-1");
  auto stub = coord::Coordinator::NewStub(MakeChannel(coord->address(), sec, kCoordinatorParty));
  for (int attempt = 0; attempt < 2; ++attempt) {  // the second: a retry of the same process
    grpc::ClientContext ctx;
    AddToken(&ctx, sec);
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    coord::PsInitReply reply;
    grpc::Status st = stub->PsInit(&ctx, init, &reply);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->build, BuildId());
  ASSERT_EQ(log->other_builds.size(), 1u);
  EXPECT_EQ(log->other_builds[0].site, 1);
  EXPECT_EQ(log->other_builds[0].build, "0123456789abcdef");
  EXPECT_EQ(log->other_builds[0].cpu, "Another CPU | avx2");
}

}  // namespace
}  // namespace atl
