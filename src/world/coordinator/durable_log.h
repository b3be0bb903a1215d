// An append-only log of JSON records, one per line: what makes the coordinator's membership
// (STATE/coordinator.log) and the parameter server's decisions (STATE/ops.jsonl) survive a crash.
//
// Reading (ReadLog): every complete line is a record: a JSON object with a string "t" (its type).
// A last line without its newline was torn by a crash in the middle of an append; it was never
// acknowledged, so it is left out (LogContents::torn_bytes) and Open cuts it off. Any other bad
// line is kCorruption naming the file and the line: such a log was damaged, not merely cut short.
//
// Writing: Append writes a record (with a "time" field) at the end of the file; Sync makes every
// record appended so far durable (fdatasync). They are apart so that a server can append under
// its state lock (the log's order is the order of the state changes) and sync after releasing it
// (a slow disk then delays only the replies that wait for it, never heartbeats or other calls):
//   ticket = log.Append(record)     // under the server's lock; then change the state
//   ... unlock ...
//   log.Sync(ticket)                // before answering anyone who may have seen the change
// Concurrent Syncs are grouped: one fdatasync covers every record appended before it started.
//
// Failures: if a write fails (disk full, a partial write), the file is cut back to its length
// before the append, so what is on disk stays a valid log; a failed fdatasync cannot be undone.
// Either way the log refuses every later Append and Sync with the first error (kIoError naming
// the file and the system's reason): its owner must stop, not go on ahead of its log.
//
// Thread-safety: Append and Sync may be called from any thread; ReadLog is a function.
#pragma once

#include <cstdint>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace atl {

struct LogRecord {
  nlohmann::json json;  // an object with a string "t"
  int line = 0;         // 1-based, for messages
};

struct LogContents {
  std::vector<LogRecord> records;
  size_t good_bytes = 0;  // the length of the complete lines
  size_t torn_bytes = 0;  // a torn last line after them (0: none)
};

// Reads the log at `path`; a missing file has no records. `what` names the kind of record in
// errors ("coordinator record", "op log record").
StatusOr<LogContents> ReadLog(const std::string& path, const std::string& what = "log record");
// The same for the log's bytes; `name` stands for the path in messages.
StatusOr<LogContents> ParseLog(std::string_view text, const std::string& name,
                               const std::string& what = "log record");

class DurableLog {
 public:
  DurableLog() = default;
  ~DurableLog();
  DurableLog(const DurableLog&) = delete;
  DurableLog& operator=(const DurableLog&) = delete;

  // Opens `path` for appending, creating it (and syncing its directory) when missing. A torn
  // last line is cut off first (logged). A damaged log is refused (ReadLog's kCorruption).
  Status Open(const std::string& path);
  // The same for a log its owner has just read with ReadLog (`contents`), without reading it
  // again. REQUIRES: nothing has written to `path` since.
  Status Open(const std::string& path, const LogContents& contents);
  bool is_open() const;
  // Appends one record, adding "time" (seconds since the epoch). Returns a ticket for Sync.
  StatusOr<uint64_t> Append(nlohmann::json record);
  // The ticket of everything appended so far.
  uint64_t End() const;
  // Returns once every record up to `ticket` is durable (at once, even after a failure, when it
  // is already).
  Status Sync(uint64_t ticket);
  // Append, then Sync.
  Status Write(nlohmann::json record);
  // OK, or the first failure (the log is unusable from then on).
  Status error() const;
  const std::string& path() const { return path_; }

 private:
  Status FailLocked(Status s);  // REQUIRES: mu_ held

  mutable std::mutex mu_;  // the file's end and the error
  int fd_ = -1;
  std::string path_;
  uint64_t end_ = 0;  // bytes written (the ticket of the last record)
  Status error_;
  std::mutex sync_mu_;   // one fdatasync at a time
  uint64_t synced_ = 0;  // guarded by mu_
};

// Test only: how the logs of this process reach the disk. `write` replaces ::write (it may write
// part of the bytes and fail, as a full disk does); `before_sync` runs before every fdatasync (a
// slow disk) and may fail it: a nonzero return is the errno the fdatasync fails with (EIO).
// Process-wide; empty functions restore the defaults.
struct DurableLogHooks {
  std::function<long(int fd, const char* data, size_t bytes)> write;
  std::function<int(const std::string& path)> before_sync;
};
void SetDurableLogHooksForTesting(DurableLogHooks hooks);

}  // namespace atl
