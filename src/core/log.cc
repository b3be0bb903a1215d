#include "core/log.h"

#include <atomic>
#include <cstdio>

namespace atl {

namespace {
std::atomic<int> g_level{static_cast<int>(LogLevel::kInfo)};
}

void SetLogLevel(LogLevel level) { g_level = static_cast<int>(level); }
LogLevel GetLogLevel() { return static_cast<LogLevel>(g_level.load()); }

void LogLine(LogLevel level, const std::string& msg) {
  static const char* kTag[] = {"debug", "info", "warning", "error"};
  std::string line = fmt::format("[atoll {}] {}\n", kTag[static_cast<int>(level)], msg);
  std::fwrite(line.data(), 1, line.size(), stderr);
}

}  // namespace atl
