// The WAN transport: collectives among the leaders of a world's sites over gRPC streams, with
// the links' latency, bandwidth and jitter emulated inside the transport (world/link.h).
//
// Each site leader runs a WanEndpoint: a gRPC server (world/proto/transport.proto) that peers
// stream chunks to, and client streams to every peer. Two phases, because a leader must be
// listening before it can tell the coordinator its address:
//   auto ep = WanEndpoint::Listen("127.0.0.1:0", security);   // ep->address(): the bound port
//   ... register ep->address() with the coordinator, learn every site's address ...
//   auto wan = ep->Connect(options);   // a Communicator over the sites, rank = site index
//
// The Communicator (comm/communicator.h) it returns has one rank per site. Collectives are
// chunked (WanOptions::chunk_bytes) and pipelined: all-reduce is a ring reduce-scatter then
// all-gather in which each chunk is forwarded as soon as it is reduced, so large messages keep
// every link busy; reduce-scatter / all-gather are the two halves; broadcast pipelines chunks
// along the ring; send/recv go direct. The ring order is chosen at Connect from measured link
// speeds (a latency ping and a bandwidth probe per directed pair, exchanged so every site
// computes the same order): the permutation (site 0 first) that maximizes the slowest link of
// the ring, ties broken by total latency, then lexicographically. Sums of floats are in a fixed
// order for a given ring (the same bits on every site), not in site order.
//
// Validation: every received chunk is checked before use — protocol version, the sender is the
// expected peer (the TLS certificate's site when secure), the operation's sequence number (a
// "round"), dtype, offset and length inside the operation's buffer, and an XXH3 checksum of the
// payload. A bad chunk fails the operation with an error naming the peer, the operation and what
// was wrong; the caller's buffer is left as it was before the call for all-reduce's input
// (results are staged and copied out only when every chunk has been received and checked).
// A peer that vanishes or stalls fails the operation after WanOptions::timeout_s.
//
// Stats: bytes sent and received, and seconds spent inside collectives, per operation, for the
// live view and the benchmarks.
//
// Thread-safety: as Communicator (one thread issues operations); the endpoint's server threads are
// internal.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "world/link.h"
#include "world/security.h"

namespace atl {

inline constexpr uint32_t kWanProtocolVersion = 1;

struct WanPeer {
  int site = 0;
  std::string address;  // host:port of its WanEndpoint
};

struct WanOptions {
  int site = 0;                // this site (its rank in the returned Communicator)
  std::vector<WanPeer> peers;  // every site, this one included, ordered by site
  // The emulated profile of the directed link from -> to (default: no emulation).
  std::function<LinkProfile(int from, int to)> link;
  size_t chunk_bytes = 1 << 20;
  double timeout_s = 120;
  uint64_t seed = 0;         // jitter draws
  bool choose_ring = true;   // false: ring in site order (no probes)
};

struct WanStats {
  uint64_t bytes_sent = 0, bytes_received = 0;
  double seconds = 0;       // inside collectives (blocking time of the caller)
  int64_t operations = 0;
};

class WanEndpoint {
 public:
  // Starts the server on host:port (port 0: any free port). Errors name the address.
  static StatusOr<std::unique_ptr<WanEndpoint>> Listen(const std::string& address,
                                                      const WorldSecurity& security);
  virtual ~WanEndpoint() = default;
  // host:port with the bound port.
  virtual std::string address() const = 0;
  // Connects to every peer (waiting up to options.timeout_s for them to listen), measures the
  // links and agrees on the ring. Collective over the sites. Call once.
  virtual StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options) = 0;
  // The ring order chosen by Connect (site indices).
  virtual std::vector<int> ring() const = 0;
  virtual WanStats stats() const = 0;
};

// The ring (a permutation of 0..n-1 starting with 0) maximizing the minimum of
// bandwidth[ring[i]][ring[i+1 mod n]] (bytes/s), ties broken by the smaller total latency
// (seconds), then lexicographically. Exhaustive for n <= 8, greedy nearest-fastest beyond.
std::vector<int> ChooseRing(const std::vector<std::vector<double>>& bandwidth,
                            const std::vector<std::vector<double>>& latency);

}  // namespace atl
