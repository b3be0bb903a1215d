// The average of a vector over the live sites, tolerant of sites dropping out: what DiLoCo and
// streaming DiLoCo use to agree on their (quantized) pseudo-gradients across sites.
//
// Average(round, data, residual) replaces `data` (this site's contribution, n floats) with the
// mean over the sites that took part, the same bits on every one of them. One call is a few
// coordinator rounds and a two-phase exchange over the WAN Communicator (rank = site) using
// direct sends only, so a receive depends on its sender alone and a dead sender fails it at once:
//   1. begin: round function(R) gives the membership M; the live sites L (sorted) take part
//      (a rejoined site only from its join round on: SiteInfo::join_round <= R).
//      Fewer than `quorum` live sites: kUnavailable.
//   2. reduce-scatter: data is cut into |L| contiguous pieces (piece k owned by L[k], sizes as
//      even as possible, split at element boundaries); each site encodes its whole contribution
//      once with the codec and error feedback (residual; world/codec.h) and sends every other
//      owner the encoded bytes of that owner's piece (each piece is encoded separately, so a
//      piece's bytes are Encode(codec, piece of (data + residual))). The owner decodes the pieces
//      it receives and its own (the decoded value of its own encoding, never the raw floats) and
//      sums them in the order of L, in float32, then multiplies by 1/|L|.
//   3. all-gather: the owner encodes its averaged piece and sends it to every other site in L;
//      every site, the owner included, takes Decode of those bytes. So all sites hold identical
//      bits. The owner adds |L| * (average - decoded) to its residual over its piece (error
//      feedback for this phase too: its next contribution carries what the average lost).
//   Rejoined sites: before its exchange, a site reconnects (ExchangeOptions::reconnect) to
//   every site of L whose address in M differs from the one its link was made with; a failed
//   reconnect fails the receives from that site in this attempt (see commit).
//   4. commit: every site casts its vote in round R' (world/coordinator.h RoundVote): whether
//      its part failed (a receive, a piece that does not decode, a failed reconnect), a digest
//      of the result it would commit: digest(mean) when the caller passes one (DiLoCo hashes the
//      new global parameters the mean leads to), else the XXH3-64 of the mean's bytes, and its
//      pace (world.balance; ExchangeResult::paces). The round gives M' with every live site's
//      vote, the same on every site, so every site decides alike — the round commits everywhere
//      or nowhere:
//      - a site of L dead in M' (one died during the exchange): the whole exchange is redone over
//        the survivors (the residual is restored to its value at the call first);
//      - a site of L voted failure (or cast no vote): no site commits; the attempt is tried once
//        more (a stall or a corrupt chunk may not recur), then every site fails (kUnavailable
//        naming the sites whose part failed);
//      - the digests differ: no site commits, every site fails with kCorruption naming which
//        sites hold which digest (their arithmetic differs: another build, or silent data
//        corruption);
//      - otherwise the result is written into data and Average returns. data is untouched until
//        then.
// Coordinator rounds used by call `round` (>= 0, increasing across calls, the same on every
// site): kRoundsPerExchange * round + 2 * attempt + {0: begin, 1: commit}, attempt < 8.
// Message tags on the WAN: derived from (round, attempt, phase) so late messages of a failed
// attempt are never mistaken for a later one's.
//
// Details (exchange.cc):
// - Pieces: piece k of n floats over m = |L| sites has n / m floats, plus one for k < n % m.
// - Messages are kByte, exactly EncodedBytes(codec, piece size) long (the receiver knows both).
//   All receives and sends of a phase are posted at once, then waited on (receives in the order
//   of L, each decoded as it completes); a failed receive or a piece that does not decode is
//   recorded with its site and the others still waited on. A stalled (not vanished) peer costs
//   up to WanOptions::timeout_s per receive.
// - The mean: acc = 0.0f; acc += Decode(piece of L[0]); acc += ... (float32, in the order of L);
//   acc *= 1.0f / float(|L|) (a multiplication by the rounded reciprocal, not a division). With
//   codec none that is the float32 mean bit for bit.
// - An owner that failed to receive (or decode) a contribution cannot average its piece: it
//   sends, in place of its all-gather message, EncodedBytes zero bytes (a bad magic) so that its
//   receivers fail that receive too and nobody commits a mean that lacks a contribution.
// - Commit: the attempt commits when every site of L is live in M' (sites that became live
//   meanwhile do not matter), voted success and the same digest; it is redone when a site of L is
//   dead in M' (kUnavailable if this site itself is). After 8 attempts: kUnavailable.
// - A call that fails leaves both data and residual as they were at the call.
// - The all-gather's rounding has no error feedback: for inputs that change little from call to
//   call it rounds the same way every time, so the running sum of results drifts by up to half a
//   step of the mean per call (int4, 4 sites, the same inputs 30 times: worst drift 2.0 with error
//   feedback, 7.6 without, one step 0.6; exchange_test).
// - A message of a failed attempt that arrives after its receive gave up stays in the WAN
//   Communicator's inbox (its tag is never received again).
// - bytes_sent: the sizes of the messages handed to ISend, over every attempt (not headers of
//   the transport).
//
// Thread-safety: one Average at a time per SiteExchange; it may run on any thread (streaming
// DiLoCo runs it on a background thread while training goes on), as long as nothing else uses
// the WAN Communicator meanwhile.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "world/codec.h"
#include "world/coordinator.h"

namespace atl {

inline constexpr int64_t kRoundsPerExchange = 16;

struct ExchangeOptions {
  int site = 0;
  int sites = 1;
  Codec codec = Codec::kNone;
  int quorum = 1;  // fewest live sites a round may complete with
  // The coordinator's round barrier with votes (CoordinatorClient::Round, or a fake in tests).
  std::function<StatusOr<Membership>(int64_t round, std::optional<RoundVote> vote)> round;
  // Rejoins: the WAN address each site's link was made with (by site; empty: no link, e.g. a
  // site absent when this one connected), and the transport's WanEndpoint::Reconnect. When a
  // live site of a round has another address in the membership than here (a new process took
  // the site over), this site reconnects to it before the exchange (the new process does the
  // same towards every live site). Without reconnect, addresses are not checked.
  std::vector<std::string> addresses;
  std::function<Status(int site, const std::string& address)> reconnect;
};

struct ExchangeResult {
  std::vector<int> sites;  // the sites whose contributions were averaged
  int attempts = 1;
  uint64_t bytes_sent = 0;  // encoded bytes this site sent over the WAN, every attempt
  double seconds = 0;
  // By site: the pace (seconds per micro-batch, world.balance) each site of `sites` voted with
  // in the committed round, the same on every site; 0 for the others and a site that gave none.
  std::vector<double> paces;
};

class SiteExchange {
 public:
  // wan: the WAN Communicator among the sites' leaders (rank = site); not owned.
  SiteExchange(Communicator* wan, ExchangeOptions options);
  // What the sites must agree on, computed from the mean (e.g. the new global parameters it
  // leads to, hashed); must be the same function of the mean on every site.
  using Digest = std::function<uint64_t(std::span<const float> mean)>;
  // residual: empty or data.size() floats (this site's error feedback for the codec). digest:
  // empty for the XXH3-64 of the mean itself. pace: this site's measured seconds per micro-batch
  // (world.balance; 0: none), carried in its commit vote to every site (ExchangeResult::paces).
  StatusOr<ExchangeResult> Average(int64_t round, std::span<float> data, std::span<float> residual,
                                   const Digest& digest = nullptr, double pace = 0);

 private:
  Communicator* wan_;
  ExchangeOptions options_;
  std::vector<std::string> linked_;   // the address each site's link is made with now
  std::vector<int64_t> linked_join_;  // ... and that process's join round (0: the first one)
};

// SiteExchange::Average as a function (what DiLoCo and streaming are given; tests fake it).
using AverageFn = std::function<StatusOr<ExchangeResult>(
    int64_t round, std::span<float> data, std::span<float> residual,
    const SiteExchange::Digest& digest, double pace)>;

}  // namespace atl
