#include "world/link.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "core/rng.h"

namespace atl {

std::string DescribeLink(const LinkProfile& p) {
  const std::string bw =
      p.bandwidth_mbps > 0 ? fmt::format("{:g} Mbit/s", p.bandwidth_mbps) : "unlimited";
  if (p.jitter_ms > 0)
    return fmt::format("{:g} ms, {}, jitter {:g} ms", p.latency_ms, bw, p.jitter_ms);
  return fmt::format("{:g} ms, {}", p.latency_ms, bw);
}

std::string ValidateLink(const LinkProfile& p) {
  for (auto [name, v] : {std::pair{"latency_ms", p.latency_ms},
                         {"bandwidth_mbps", p.bandwidth_mbps},
                         {"jitter_ms", p.jitter_ms}})
    if (!std::isfinite(v) || v < 0)
      return fmt::format("{} must be a finite number >= 0, got {}", name, v);
  return "";
}

LinkEmulator::LinkEmulator(LinkProfile profile, uint64_t seed, uint64_t stream)
    : profile_(profile), seed_(seed), stream_(stream) {}

LinkEmulator::Times LinkEmulator::Send(double now_s, size_t bytes) {
  const double start = std::max(now_s, link_free_s_);
  const double serialize =
      profile_.bandwidth_mbps > 0 ? double(bytes) * 8.0 / (profile_.bandwidth_mbps * 1e6) : 0.0;
  link_free_s_ = start + serialize;
  double delay = profile_.latency_ms * 1e-3;
  if (profile_.jitter_ms > 0) {
    const double u = double(RandomUniform(seed_, stream_, RngPurpose::kJitter, count_));
    delay += (2.0 * u - 1.0) * profile_.jitter_ms * 1e-3;
  }
  ++count_;
  const double arrive = std::max(link_free_s_ + std::max(delay, 0.0), last_arrive_s_);
  last_arrive_s_ = arrive;
  return {link_free_s_, arrive};
}

}  // namespace atl
