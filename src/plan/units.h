// Parsing and printing of the quantities the planner talks about: counts ("100T" parameters),
// bandwidths ("400Gbps"), durations ("20ms"), bytes, FLOP.
//
// Parsers accept a plain number too ("1e14", "0.02") and return InvalidArgument naming the text
// and what was expected. Printers give short, fixed-width-friendly strings for tables.
//
// Thread-safety: pure functions.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"

namespace atl::plan {

// "100T", "1.5B", "7e9", "16k" -> count. Suffixes (case-insensitive): k, M, B or G, T, P.
StatusOr<double> ParseCount(std::string_view text);

// "400Gbps", "400Gb/s", "50GB/s", "1e9" (bits/s) -> bits per second. "B" = bytes, "b" = bits.
StatusOr<double> ParseBitsPerSecond(std::string_view text);

// "20ms", "1.5us", "3s", "2h", "0.02" (seconds) -> seconds.
StatusOr<double> ParseSeconds(std::string_view text);

// 1.234e28 -> "1.23e28"; 0 -> "0".
std::string FormatSci(double x, int digits = 3);
// 1536 -> "1.5k", 3.2e14 -> "320T" (k, M, B, T, P).
std::string FormatCount(double x);
// Bytes with binary-free decimal prefixes: 1.2e12 -> "1.20 TB".
std::string FormatBytes(double bytes);
// Seconds in the most readable unit: "4.5 us", "12.0 ms", "3.2 s", "5.1 h", "2.9 mo".
std::string FormatSeconds(double seconds);
// Bits per second: 4e11 -> "400 Gbps".
std::string FormatBitsPerSecond(double bps);

// Length of a month as the reference model counts it: a year of 3.154e7 s over 12.
inline constexpr double kSecondsPerYear = 3.154e7;
inline constexpr double kSecondsPerMonth = kSecondsPerYear / 12.0;

}  // namespace atl::plan
