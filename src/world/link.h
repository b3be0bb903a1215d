// WAN link profiles and their emulation inside the transport (this kernel has no netem).
//
// A LinkProfile describes one direction of a link between two sites: one-way latency, bandwidth
// and jitter. LinkEmulator turns it into departure and arrival times for the chunks a sender
// writes: chunks leave no faster than the bandwidth (a serializing link: a chunk occupies the
// link for bytes / bandwidth after the previous one), and each arrives latency + jitter later,
// jitter drawn per chunk from the counter-based RNG (uniform in [-jitter, +jitter], the total
// clamped at >= 0) and arrivals kept in order (a chunk never overtakes its predecessor, as on a
// TCP stream). The sender holds each chunk until its arrival time (a delay queue), so emulation
// needs no clock agreement between machines.
//
// Thread-safety: LinkEmulator is used by one sender thread.
#pragma once

#include <cstdint>
#include <string>

#include "core/status.h"

namespace atl {

struct LinkProfile {
  double latency_ms = 0;      // one way
  double bandwidth_mbps = 0;  // megabits (10^6 bits) per second; 0: unlimited
  double jitter_ms = 0;       // +- uniform per chunk
  bool operator==(const LinkProfile&) const = default;
};

// "40 ms, 100 Mbit/s, jitter 5 ms" ("unlimited" bandwidth when 0).
std::string DescribeLink(const LinkProfile& p);
// Empty if valid (finite, >= 0, jitter <= latency is NOT required), else what is wrong.
std::string ValidateLink(const LinkProfile& p);

class LinkEmulator {
 public:
  // seed and stream pick the jitter draws (stream: e.g. the ordered site pair).
  LinkEmulator(LinkProfile profile, uint64_t seed, uint64_t stream);

  // A chunk of `bytes` handed to the link at time now_s (seconds, any monotonic clock): the time
  // it has fully left the sender (pacing) and the time it arrives at the receiver.
  struct Times {
    double depart_s, arrive_s;
  };
  Times Send(double now_s, size_t bytes);

  const LinkProfile& profile() const { return profile_; }

 private:
  LinkProfile profile_;
  uint64_t seed_, stream_;
  uint64_t count_ = 0;
  double link_free_s_ = 0;   // when the link finishes serializing the previous chunk
  double last_arrive_s_ = 0;
};

}  // namespace atl
