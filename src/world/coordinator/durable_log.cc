#include "world/coordinator/durable_log.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <memory>

#include "core/file.h"
#include "core/log.h"

namespace atl {

namespace {

std::mutex g_hooks_mu;
std::shared_ptr<const DurableLogHooks> g_hooks;

std::shared_ptr<const DurableLogHooks> Hooks() {
  std::lock_guard<std::mutex> lk(g_hooks_mu);
  return g_hooks;
}

double UnixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

void SetDurableLogHooksForTesting(DurableLogHooks hooks) {
  std::lock_guard<std::mutex> lk(g_hooks_mu);
  if (!hooks.write && !hooks.before_sync)
    g_hooks = nullptr;
  else
    g_hooks = std::make_shared<const DurableLogHooks>(std::move(hooks));
}

StatusOr<LogContents> ReadLog(const std::string& path, const std::string& what) {
  if (!FileExists(path)) return LogContents{};
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
  return ParseLog(text, path, what);
}

StatusOr<LogContents> ParseLog(std::string_view text, const std::string& path,
                               const std::string& what) {
  LogContents out;
  const size_t end = text.rfind('\n');
  out.good_bytes = end == std::string::npos ? 0 : end + 1;
  out.torn_bytes = text.size() - out.good_bytes;
  size_t pos = 0;
  int line = 0;
  while (pos < out.good_bytes) {
    const size_t nl = text.find('\n', pos);
    const std::string_view l(text.data() + pos, nl - pos);
    pos = nl + 1;
    ++line;
    if (l.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object() || !j.contains("t") || !j["t"].is_string())
      return Status::Corruption(
          fmt::format("{} line {}: not a valid {}: {}", path, line, what, l.substr(0, 200)));
    out.records.push_back({std::move(j), line});
  }
  return out;
}

DurableLog::~DurableLog() {
  if (fd_ >= 0) ::close(fd_);
}

Status DurableLog::Open(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(const LogContents contents, ReadLog(path));
  return Open(path, contents);
}

Status DurableLog::Open(const std::string& path, const LogContents& contents) {
  const bool existed = FileExists(path);
  const size_t good_bytes = contents.good_bytes, torn_bytes = contents.torn_bytes;
  if (torn_bytes > 0) {
    LogWarning("{}: dropping a torn last record ({} bytes, never acknowledged)", path, torn_bytes);
    if (::truncate(path.c_str(), off_t(good_bytes)) != 0)
      return Status::IoError(
          fmt::format("truncating the torn tail of {}: {}", path, std::strerror(errno)));
  }
  const int fd = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(fmt::format("opening {}: {}", path, std::strerror(errno)));
  {
    std::lock_guard<std::mutex> lk(mu_);
    fd_ = fd;
    path_ = path;
    end_ = synced_ = good_bytes;
  }
  if (!existed) {
    const size_t slash = path.rfind('/');
    return SyncDir(slash == std::string::npos ? "." : path.substr(0, slash));
  }
  return Status::Ok();
}

bool DurableLog::is_open() const {
  std::lock_guard<std::mutex> lk(mu_);
  return fd_ >= 0;
}

Status DurableLog::error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return error_;
}

Status DurableLog::FailLocked(Status s) {
  if (error_.ok()) {
    error_ = s;
    LogWarning("{}: the log is unusable from now on: {}", path_, s.message());
  }
  return error_;
}

StatusOr<uint64_t> DurableLog::Append(nlohmann::json record) {
  record["time"] = UnixNow();
  const std::string line = record.dump() + "\n";
  const auto hooks = Hooks();
  std::lock_guard<std::mutex> lk(mu_);
  if (!error_.ok()) return error_;
  if (fd_ < 0) return Status::Internal(fmt::format("{}: Append before Open", path_));
  size_t done = 0;
  while (done < line.size()) {
    const long n = hooks && hooks->write
                       ? hooks->write(fd_, line.data() + done, line.size() - done)
                       : long(::write(fd_, line.data() + done, line.size() - done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? std::strerror(errno) : "no bytes written";
      // Cut the partial record off, so the file stays a valid log (O_APPEND: the end moves with
      // the truncation).
      std::string cut;
      if (::ftruncate(fd_, off_t(end_)) != 0)
        cut = fmt::format(
            " (and cutting the partial record off failed too: {}; the next start "
            "drops it as a torn tail only if it is the last line)",
            std::strerror(errno));
      return FailLocked(
          Status::IoError(fmt::format("appending the {} record to {}: {} after {} of {} bytes{}",
                                      record.value("t", "?"), path_, why, done, line.size(), cut)));
    }
    done += size_t(n);
  }
  end_ += line.size();
  return end_;
}

uint64_t DurableLog::End() const {
  std::lock_guard<std::mutex> lk(mu_);
  return end_;
}

Status DurableLog::Sync(uint64_t ticket) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    ticket = std::min(ticket, end_);  // UINT64_MAX: everything appended so far
    if (synced_ >= ticket) return Status::Ok();
    if (!error_.ok()) return error_;
  }
  std::lock_guard<std::mutex> one(sync_mu_);
  uint64_t upto;
  int fd;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (synced_ >= ticket) return Status::Ok();  // another caller's sync covered it
    if (!error_.ok()) return error_;
    upto = end_;
    fd = fd_;
  }
  int injected = 0;
  if (const auto hooks = Hooks(); hooks && hooks->before_sync) injected = hooks->before_sync(path_);
  const int rc = injected != 0 ? -1 : ::fdatasync(fd);
  const int err = injected != 0 ? injected : errno;
  std::lock_guard<std::mutex> lk(mu_);
  if (rc != 0)
    return FailLocked(
        Status::IoError(fmt::format("fdatasync of {}: {}", path_, std::strerror(err))));
  synced_ = std::max(synced_, upto);
  return Status::Ok();
}

Status DurableLog::Write(nlohmann::json record) {
  ATOLL_ASSIGN_OR_RETURN(const uint64_t ticket, Append(std::move(record)));
  return Sync(ticket);
}

}  // namespace atl
