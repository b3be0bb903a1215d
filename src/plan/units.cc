#include "plan/units.h"

#include <cctype>
#include <charconv>
#include <cmath>
#include <string>

namespace atl::plan {
namespace {

// Splits "400Gbps" into 400 and "Gbps". The number may use exponent notation.
Status SplitNumber(std::string_view text, double* value, std::string_view* suffix) {
  size_t start = 0;
  while (start < text.size() && std::isspace(static_cast<unsigned char>(text[start]))) ++start;
  text.remove_prefix(start);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) {
    text.remove_suffix(1);
  }
  if (text.empty()) return Status::InvalidArgument("empty value");
  const char* begin = text.data();
  const char* end = text.data() + text.size();
  auto [ptr, ec] = std::from_chars(begin, end, *value);
  if (ec != std::errc() || ptr == begin) {
    return Status::InvalidArgument(fmt::format("'{}' does not start with a number", text));
  }
  if (!std::isfinite(*value) || *value < 0) {
    return Status::InvalidArgument(fmt::format("'{}' must be a finite, non-negative number", text));
  }
  *suffix = std::string_view(ptr, end - ptr);
  while (!suffix->empty() && std::isspace(static_cast<unsigned char>(suffix->front()))) {
    suffix->remove_prefix(1);
  }
  return Status::Ok();
}

// Decimal prefix of a unit: "k", "M", "G", "T", "P" (and "B" for billions in counts).
bool PrefixMultiplier(char c, bool billions_as_b, double* mult) {
  switch (c) {
    case 'k':
    case 'K':
      *mult = 1e3;
      return true;
    case 'M':
      *mult = 1e6;
      return true;
    case 'G':
    case 'g':
      *mult = 1e9;
      return true;
    case 'T':
    case 't':
      *mult = 1e12;
      return true;
    case 'P':
    case 'p':
      *mult = 1e15;
      return true;
    case 'B':
    case 'b':
      if (!billions_as_b) return false;
      *mult = 1e9;
      return true;
    default:
      return false;
  }
}

}  // namespace

StatusOr<double> ParseCount(std::string_view text) {
  double v = 0;
  std::string_view suffix;
  ATOLL_RETURN_IF_ERROR(SplitNumber(text, &v, &suffix));
  if (suffix.empty()) return v;
  double mult = 1;
  if (suffix.size() == 1 && PrefixMultiplier(suffix[0], /*billions_as_b=*/true, &mult)) {
    return v * mult;
  }
  return Status::InvalidArgument(
      fmt::format("'{}': unknown suffix '{}' (expected k, M, B, G, T or P)", text, suffix));
}

StatusOr<double> ParseBitsPerSecond(std::string_view text) {
  double v = 0;
  std::string_view s;
  ATOLL_RETURN_IF_ERROR(SplitNumber(text, &v, &s));
  if (s.empty()) return v;
  double mult = 1;
  if (PrefixMultiplier(s[0], /*billions_as_b=*/false, &mult)) s.remove_prefix(1);
  double bits_per_unit = 0;
  if (s == "bps" || s == "b/s" || s == "bit/s" || s == "b") {
    bits_per_unit = 1;
  } else if (s == "Bps" || s == "B/s" || s == "B") {
    bits_per_unit = 8;
  } else {
    return Status::InvalidArgument(
        fmt::format("'{}': expected a bandwidth such as 400Gbps, 400Gb/s or 50GB/s", text));
  }
  return v * mult * bits_per_unit;
}

StatusOr<double> ParseSeconds(std::string_view text) {
  double v = 0;
  std::string_view s;
  ATOLL_RETURN_IF_ERROR(SplitNumber(text, &v, &s));
  if (s.empty() || s == "s") return v;
  if (s == "ms") return v * 1e-3;
  if (s == "us") return v * 1e-6;
  if (s == "ns") return v * 1e-9;
  if (s == "min" || s == "m") return v * 60;
  if (s == "h") return v * 3600;
  if (s == "d") return v * 86400;
  return Status::InvalidArgument(
      fmt::format("'{}': expected a duration such as 20ms, 1.5us, 30s, 2h or 3d", text));
}

std::string FormatSci(double x, int digits) {
  if (x == 0) return "0";
  if (!std::isfinite(x)) return x > 0 ? "inf" : "-inf";
  int e = static_cast<int>(std::floor(std::log10(std::fabs(x))));
  double m = x / std::pow(10.0, e);
  // Rounding may carry the mantissa to 10.
  double scale = std::pow(10.0, digits - 1);
  m = std::round(m * scale) / scale;
  if (std::fabs(m) >= 10) {
    m /= 10;
    ++e;
  }
  return fmt::format("{:.{}f}e{}", m, digits - 1, e);
}

std::string FormatCount(double x) {
  static constexpr const char* kSuffix[] = {"", "k", "M", "B", "T", "P", "E"};
  if (!std::isfinite(x)) return "inf";
  int i = 0;
  double v = x;
  while (std::fabs(v) >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  if (i == 0) return fmt::format("{:.0f}", v);
  return fmt::format("{:.{}f}{}", v, std::fabs(v) < 10 ? 2 : (std::fabs(v) < 100 ? 1 : 0),
                     kSuffix[i]);
}

std::string FormatBytes(double bytes) {
  static constexpr const char* kSuffix[] = {"B", "kB", "MB", "GB", "TB", "PB", "EB"};
  if (!std::isfinite(bytes)) return "inf";
  int i = 0;
  double v = bytes;
  while (std::fabs(v) >= 1000 && i < 6) {
    v /= 1000;
    ++i;
  }
  return fmt::format("{:.{}f} {}", v, i == 0 ? 0 : 2, kSuffix[i]);
}

std::string FormatSeconds(double s) {
  if (!std::isfinite(s)) return "inf";
  double a = std::fabs(s);
  if (a == 0) return "0 s";
  if (a < 1e-3) return fmt::format("{:.1f} us", s * 1e6);
  if (a < 1) return fmt::format("{:.1f} ms", s * 1e3);
  if (a < 600) return fmt::format("{:.2f} s", s);
  if (a < 2 * 86400) return fmt::format("{:.2f} h", s / 3600);
  if (a < 2 * kSecondsPerMonth) return fmt::format("{:.1f} d", s / 86400);
  return fmt::format("{:.2f} mo", s / kSecondsPerMonth);
}

std::string FormatBitsPerSecond(double bps) {
  if (!std::isfinite(bps)) return "inf";
  static constexpr const char* kSuffix[] = {"bps", "kbps", "Mbps", "Gbps", "Tbps", "Pbps"};
  int i = 0;
  double v = bps;
  while (std::fabs(v) >= 1000 && i < 5) {
    v /= 1000;
    ++i;
  }
  return fmt::format("{:.{}f} {}", v, std::fabs(v) < 10 ? 2 : (std::fabs(v) < 100 ? 1 : 0),
                     kSuffix[i]);
}

}  // namespace atl::plan
