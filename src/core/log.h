// Minimal leveled logging to stderr, and a monotonic clock.
//
// Thread-safety: each log line is written with one fwrite call.
#pragma once

#include <fmt/format.h>

#include <chrono>
#include <string>

namespace atl {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarning = 2, kError = 3 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, const std::string& msg);

template <class... Args>
void LogInfo(fmt::format_string<Args...> f, Args&&... args) {
  if (GetLogLevel() <= LogLevel::kInfo)
    LogLine(LogLevel::kInfo, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void LogWarning(fmt::format_string<Args...> f, Args&&... args) {
  if (GetLogLevel() <= LogLevel::kWarning)
    LogLine(LogLevel::kWarning, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void LogError(fmt::format_string<Args...> f, Args&&... args) {
  LogLine(LogLevel::kError, fmt::format(f, std::forward<Args>(args)...));
}
template <class... Args>
void LogDebug(fmt::format_string<Args...> f, Args&&... args) {
  if (GetLogLevel() <= LogLevel::kDebug)
    LogLine(LogLevel::kDebug, fmt::format(f, std::forward<Args>(args)...));
}

// Seconds on a monotonic clock.
inline double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
// `s` seconds as a steady-clock duration.
inline std::chrono::steady_clock::duration SteadySeconds(double s) {
  return std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(s));
}
// The steady-clock instant at which NowSeconds() == s.
inline std::chrono::steady_clock::time_point SteadyAt(double s) {
  return std::chrono::steady_clock::time_point(SteadySeconds(s));
}
// The same instant on the system clock (what gRPC deadlines are).
inline std::chrono::system_clock::time_point ToSystemClock(
    std::chrono::steady_clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             t - std::chrono::steady_clock::now());
}

}  // namespace atl
