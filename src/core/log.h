// Minimal leveled logging to stderr, and a monotonic clock.
//
// Thread-safety: each log line is written with one fwrite call.
#pragma once

#include <chrono>
#include <string>

#include <fmt/format.h>

namespace atl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, const std::string& msg);

template <class... Args>
void LogInfo(fmt::format_string<Args...> f, Args&&... args) {
  if (GetLogLevel() <= LogLevel::kInfo) LogLine(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void LogWarning(fmt::format_string<Args...> f, Args&&... args) {
  LogLine(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void LogDebug(fmt::format_string<Args...> f, Args&&... args) {
  if (GetLogLevel() <= LogLevel::kDebug) LogLine(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

// Seconds on a monotonic clock.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace atl
