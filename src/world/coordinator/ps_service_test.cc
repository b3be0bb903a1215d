// The parameter server the coordinator hosts (world/ps.h), over gRPC: init, pull, push, staleness,
// bad updates, its op log, large parameters, a restart that lost its state. Who may call it:
// ps_callers_test.cc.
#include "world/coordinator/ps_service.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <limits>
#include <random>
#include <string_view>
#include <thread>

#include "core/build_info.h"
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

namespace atl {
namespace {

using namespace testing_coordinator;  // NOLINT: the shared fixture
namespace fs = std::filesystem;

// ---------------------------------------------------------------------------------------------
// The parameter server.

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
  // A non-finite value in the update, whatever the codec, changes nothing.
  for (Codec c : {Codec::kNone, Codec::kBf16, Codec::kInt8}) {
    std::vector<float> nan = Floats(kN, 5);
    nan[kN / 2] = std::nanf("");
    bad = MakeUpdate(1, 2, 5, 9, 1.0f, c, nan);
    EXPECT_EQ(ps1->Push(bad).status().code(), StatusCode::kCorruption) << CodecName(c);
  }
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
  // Where the arithmetic came from: both sites run this build on this CPU.
  EXPECT_EQ(log->build, BuildId());
  EXPECT_EQ(log->cpu, CpuDescription());
  EXPECT_TRUE(log->other_builds.empty());
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

// The disk fills up under the op log: the update's record is written half-way. The partial
// record is cut off, the push fails naming the error and changes nothing, later calls are refused
// with the same reason, the membership calls go on, and the log reads back cleanly with what was
// decided before.
TEST_F(CoordinatorTest, ParameterServerStopsWhenItsLogCannotBeWritten) {
  auto coord = StartCoordinator(2);
  ASSERT_NE(coord, nullptr);
  auto clients = Clients(coord->address(), 2);
  RegisterAll(clients);
  const std::vector<float> init = Floats(200, 7);
  ParameterServer* ps = clients[0]->ps();
  ASSERT_TRUE(ps->Init(init, 4).ok());
  const PsUpdate u0 = MakeUpdate(0, 0, 1, 5, 0.5f, Codec::kInt8, Floats(200, 8));
  ASSERT_TRUE(ps->Push(u0).ok());
  std::vector<float> before(200);
  ASSERT_TRUE(ps->Pull(before).ok());
  const std::string log_before = *ReadFile(state_ + "/ops.jsonl");
  std::optional<ScopedLogHooks> full;
  full.emplace(FullDisk([](std::string_view r) { return r.find("\"update\"") != r.npos; }));
  auto pushed = ps->Push(MakeUpdate(0, 1, 6, 10, 0.5f, Codec::kInt8, Floats(200, 9)));
  ASSERT_FALSE(pushed.ok());
  EXPECT_NE(pushed.status().message().find("No space left on device"), std::string::npos)
      << pushed.status().ToString();
  full.reset();
  std::vector<float> after(200);
  auto pulled = clients[1]->ps()->Pull(after);
  ASSERT_FALSE(pulled.ok());
  EXPECT_NE(pulled.status().message().find("the parameter server stopped"), std::string::npos)
      << pulled.status().ToString();
  EXPECT_TRUE(clients[1]->Peek().ok());  // membership is another log: it goes on
  EXPECT_EQ(*ReadFile(state_ + "/ops.jsonl"), log_before) << "the partial record was left";
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->entries.size(), 1u);
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

// The parameters survive a restart (the snapshot beside the op log); a coordinator killed between
// logging an update and its snapshot loses that unanswered update (its site retries it); without
// the snapshot the state is lost and refused.
TEST_F(CoordinatorTest, ParameterServerStateSurvivesARestart) {
  auto coord = StartCoordinator(1);
  ASSERT_NE(coord, nullptr);
  const std::string address = coord->address();
  auto c = Client(ClientOptions(address, 0));
  ASSERT_TRUE(c->Register("10.0.0.0:9000").ok());
  ASSERT_TRUE(c->ps()->Init(Floats(300, 11), 0).ok());
  ASSERT_TRUE(c->ps()->Push(MakeUpdate(0, 0, 0, 1, 1.0f, Codec::kInt8, Floats(300, 12))).ok());
  std::vector<float> v1(300), got(300);
  ASSERT_EQ(*c->ps()->Pull(v1), 1);
  const std::string snapshot = state_ + "/ps_params.bin";
  fs::copy_file(snapshot, state_ + "/v1.bin");
  ASSERT_TRUE(c->ps()->Push(MakeUpdate(0, 1, 2, 3, 1.0f, Codec::kInt8, Floats(300, 13))).ok());
  coord->Shutdown();
  coord.reset();
  coord = StartCoordinator(1, address);
  ASSERT_NE(coord, nullptr);
  // The same client carries on (registering again): version 2 and its two updates.
  auto v = c->ps()->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 2);
  auto r = c->ps()->Push(MakeUpdate(0, 2, 4, 5, 1.0f, Codec::kInt8, Floats(300, 14)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->update_id, 2);
  EXPECT_EQ(r->applied_version, 3);

  // Killed after logging update 1 and before its snapshot: the snapshot of version 1 and a log
  // ending with update 1 (version 2). Update 2 is dropped from the log to make that state.
  coord->Shutdown();
  coord.reset();
  fs::copy_file(state_ + "/v1.bin", snapshot, fs::copy_options::overwrite_existing);
  {
    const std::string ops = state_ + "/ops.jsonl";
    std::string text = *ReadFile(ops);
    text.erase(text.rfind('\n', text.size() - 2) + 1);
    ASSERT_TRUE(WriteFileAtomic(ops, text).ok());
  }
  coord = StartCoordinator(1, address);
  ASSERT_NE(coord, nullptr);
  v = c->ps()->Pull(got);
  ASSERT_TRUE(v.ok()) << v.status().ToString();
  EXPECT_EQ(*v, 1);
  EXPECT_TRUE(SameBits(got, v1));
  auto log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->entries.size(), 1u);  // update 1 cut: never answered, its site pushes it again
  r = c->ps()->Push(MakeUpdate(0, 1, 2, 3, 1.0f, Codec::kInt8, Floats(300, 13)));
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->update_id, 1);
  EXPECT_EQ(r->applied_version, 2);

  // No snapshot: the state is lost, and refused; the log is left for the replay.
  coord->Shutdown();
  coord.reset();
  fs::remove(snapshot);
  coord = StartCoordinator(1, address);
  ASSERT_NE(coord, nullptr);
  v = c->ps()->Pull(got);
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), StatusCode::kInternal);
  EXPECT_NE(v.status().message().find("the parameter server's state was lost with the "
                                      "coordinator's restart (replay the op log with `atoll "
                                      "replay`)"),
            std::string::npos)
      << v.status().message();
  EXPECT_NE(c->ps()->Init(Floats(300, 11), 0).status().message().find("state was lost"),
            std::string::npos);
  log = ReadOpLog(state_ + "/ops.jsonl");
  ASSERT_TRUE(log.ok()) << log.status().ToString();
  EXPECT_EQ(log->entries.size(), 2u);
  EXPECT_TRUE(c->Round(1).ok());  // membership carries on
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

}  // namespace
}  // namespace atl
