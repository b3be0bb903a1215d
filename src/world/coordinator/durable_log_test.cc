// The durable log under faults: a torn tail is dropped and cut off, a damaged middle line is
// corruption, a write that fails half-way (a full disk) leaves no partial record behind and
// makes the log refuse every later append, a failed fdatasync likewise; concurrent syncs are
// grouped.
#include "world/coordinator/durable_log.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <filesystem>
#include <fstream>
#include <thread>

#include "core/file.h"

namespace atl {
namespace {

namespace fs = std::filesystem;

class DurableLogTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::temp_directory_path() / "atoll_log_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
    path_ = dir_ + "/x.log";
  }
  void TearDown() override {
    SetDurableLogHooksForTesting({});
    fs::remove_all(dir_);
  }
  std::string Text() const {
    auto t = ReadFile(path_);
    return t.ok() ? *t : "";
  }
  void Put(const std::string& text) const { std::ofstream(path_, std::ios::binary) << text; }

  std::string dir_, path_;
};

TEST_F(DurableLogTest, RecordsRoundTripWithLineNumbers) {
  {
    DurableLog log;
    ASSERT_TRUE(log.Open(path_).ok());
    ASSERT_TRUE(log.Write({{"t", "a"}, {"x", 1}}).ok());
    auto ticket = log.Append({{"t", "b"}, {"x", 2}});
    ASSERT_TRUE(ticket.ok());
    ASSERT_TRUE(log.Sync(*ticket).ok());
  }
  auto c = ReadLog(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->records.size(), 2u);
  EXPECT_EQ(c->records[0].json["t"], "a");
  EXPECT_EQ(c->records[1].json["x"], 2);
  EXPECT_EQ(c->records[1].line, 2);
  EXPECT_TRUE(c->records[1].json.contains("time"));
  EXPECT_EQ(c->torn_bytes, 0u);
  EXPECT_TRUE(ReadLog(dir_ + "/missing.log").ok());  // no file: no records
}

TEST_F(DurableLogTest, ATornTailIsDroppedAndCutOffAtOpen) {
  Put("{\"t\":\"a\"}\n{\"t\":\"b\"}\n{\"t\":\"c\",\"x");
  auto c = ReadLog(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  EXPECT_EQ(c->records.size(), 2u);
  EXPECT_EQ(c->torn_bytes, 11u);  // {"t":"c","x
  DurableLog log;
  ASSERT_TRUE(log.Open(path_).ok());
  ASSERT_TRUE(log.Write({{"t", "d"}}).ok());
  c = ReadLog(path_);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  ASSERT_EQ(c->records.size(), 3u);
  EXPECT_EQ(c->records[2].json["t"], "d");
}

TEST_F(DurableLogTest, ADamagedMiddleLineIsCorruptionNamingIt) {
  Put("{\"t\":\"a\"}\n{\"t\":\"b\"\n{\"t\":\"c\"}\n");
  auto c = ReadLog(path_, "coordinator record");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kCorruption);
  EXPECT_NE(c.status().message().find("x.log line 2: not a valid coordinator record"),
            std::string::npos)
      << c.status().message();
  DurableLog log;
  EXPECT_FALSE(log.Open(path_).ok());
}

// A full disk: the write of the second record stops half-way. The partial record is cut off
// (the file is the first record alone, a valid log), the append reports why, and every later
// append and sync is refused even once the disk has room again.
TEST_F(DurableLogTest, AWriteFailingHalfWayLeavesNoPartialRecord) {
  DurableLog log;
  ASSERT_TRUE(log.Open(path_).ok());
  ASSERT_TRUE(log.Write({{"t", "a"}}).ok());
  const std::string before = Text();
  std::atomic<int> calls{0};
  DurableLogHooks hooks;
  hooks.write = [&](int fd, const char* data, size_t n) -> long {
    if (calls++ == 0) return long(::write(fd, data, n / 2));  // half of it reaches the file
    errno = ENOSPC;
    return -1;
  };
  SetDurableLogHooksForTesting(hooks);
  auto t = log.Append({{"t", "b"}, {"payload", std::string(100, 'x')}});
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(t.status().code(), StatusCode::kIoError);
  EXPECT_NE(t.status().message().find("No space left on device"), std::string::npos)
      << t.status().message();
  EXPECT_NE(t.status().message().find("x.log"), std::string::npos) << t.status().message();
  EXPECT_EQ(Text(), before) << "the partial record was left in the file";
  SetDurableLogHooksForTesting({});
  EXPECT_FALSE(log.Append({{"t", "c"}}).ok());  // unusable from now on
  EXPECT_FALSE(log.error().ok());
  EXPECT_TRUE(log.Sync(UINT64_MAX).ok());  // what it holds (the first record) is durable
  auto c = ReadLog(path_);
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->records.size(), 1u);
  EXPECT_EQ(c->torn_bytes, 0u);
}

TEST_F(DurableLogTest, SyncsAreGroupedAndAFailedSyncIsFinal) {
  DurableLog log;
  ASSERT_TRUE(log.Open(path_).ok());
  std::atomic<int> syncs{0};
  DurableLogHooks hooks;
  std::atomic<bool> fail{false};
  hooks.before_sync = [&](const std::string&) {
    ++syncs;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    return fail.load() ? EIO : 0;
  };
  SetDurableLogHooksForTesting(hooks);
  // Eight threads append and sync at once: far fewer fdatasyncs than records.
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i)
    threads.emplace_back([&, i] {
      auto t = log.Append({{"t", "r"}, {"i", i}});
      ASSERT_TRUE(t.ok());
      ASSERT_TRUE(log.Sync(*t).ok());
    });
  for (auto& t : threads) t.join();
  EXPECT_LT(syncs.load(), 8);
  EXPECT_GE(syncs.load(), 1);
  const int before = syncs.load();
  EXPECT_TRUE(log.Sync(UINT64_MAX).ok());  // nothing new: no fdatasync
  EXPECT_EQ(syncs.load(), before);
  // The disk fails the next fdatasync: that record cannot be shown durable, and the log is done.
  const uint64_t durable = log.End();
  fail = true;
  auto t = log.Append({{"t", "last"}});
  ASSERT_TRUE(t.ok());
  Status st = log.Sync(*t);
  EXPECT_EQ(st.code(), StatusCode::kIoError);
  EXPECT_NE(st.message().find("fdatasync of"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("Input/output error"), std::string::npos) << st.message();
  fail = false;
  EXPECT_FALSE(log.Append({{"t", "more"}}).ok());
  // What was durable before the failure still is: a reply that depends only on it may go.
  EXPECT_TRUE(log.Sync(durable).ok());
}

}  // namespace
}  // namespace atl
