// The WAN transport: collectives among the leaders of a world's sites over gRPC streams, with
// the links' latency, bandwidth and jitter emulated inside the transport (world/link.h).
//
// Each site leader runs a WanEndpoint: a gRPC server (world/proto/transport.proto) that peers
// stream chunks to, and client streams to every peer. Two phases, because a leader must be
// listening before it can tell the coordinator its address:
//   auto ep = WanEndpoint::Listen("127.0.0.1:0", security);   // ep->address(): the bound port
//   ... register ep->address() with the coordinator, learn every site's address ...
//   auto wan = ep->Connect(options);   // a Communicator over the sites, rank = site index
// Connect waits (up to timeout_s) for every peer to listen and call Connect, opens one stream
// to each, checks that every stream works both ways, measures the links and agrees on the ring.
// Keep the endpoint alive while its Communicator is used (both share the transport; the last
// one destroyed closes the streams and stops the server).
//
// The Communicator (comm/communicator.h) it returns has one rank per site; its label() is
// "site N". Collectives are chunked (WanOptions::chunk_bytes) and pipelined: all-reduce is a
// ring reduce-scatter then all-gather in which each chunk is forwarded as soon as it is reduced,
// so large messages keep every link busy; reduce-scatter / all-gather are the two halves;
// broadcast pipelines chunks along the ring from the root; barrier passes a token around the
// ring n - 1 times; send/recv go direct. Collectives run in call order on one worker thread per
// Communicator (the non-blocking calls return at once). A send is queued when called and
// completes when its last chunk has been written to the stream (on an emulated link: at its
// emulated arrival time); a receive does its work in Wait(), so point-to-point messages never
// wait behind a collective. Split is not supported (an error).
//
// Link emulation is on the sender: each directed link's LinkEmulator gives every chunk its
// departure (pacing by bandwidth) and arrival time when it is queued, and the link's sender
// thread writes it to the stream at its arrival time (a delay queue), so several chunks are in
// flight on a link, as on a real one.
//
// The ring order is chosen at Connect from measured link speeds: every site sends every peer a
// burst of probe chunks (the receiver times their arrivals: the bandwidth of the link into it)
// and then 3 pings (round trip; latency = half the fastest), all through the emulated links;
// the measurements are exchanged so every site computes the same order with ChooseRing, on
// values rounded to a grid (bandwidth in steps of 2^(1/4), latency to 0.5 ms) so that links
// alike measure alike. Skipped with choose_ring = false and for 2 sites or fewer. Sums of floats
// are in a fixed order for a given ring (the same bits on every site), not in site order.
//
// Validation: every received chunk is checked before use: protocol version and sender (the site
// the stream claimed when it opened; with TLS, a client certificate whose common name is
// "site-N" must be for the site it claims, while certificates for the shared name "atoll" bind
// no site), the operation's sequence number, kind, dtype and size, root, ring step, the exact
// offset and length expected next, payload size, and an XXH3 checksum of the payload. Every
// RPC's token is checked (security.h); refusals are logged. A bad chunk fails the operation with
// an error naming the peer, the operation and the check ("site 1: all_reduce of 1000 float32:
// bad chunk from site 0 (HOST:PORT): checksum mismatch ..."); the site that fails a collective
// tells every peer (they fail it at once, "site 1 gave it up: ..."), and late chunks of a failed
// collective are dropped, so the next operation can run. A bad version or sender makes that
// peer unusable. Collective results are staged: the caller's buffers (all-reduce's input among
// them) are written only when every chunk has been received and checked, so a failed collective
// leaves them as they were; receives likewise unless stage_receives = false. A peer that
// vanishes fails the operation at once; one that stalls, after timeout_s without progress.
//
// Memory and copies: a chunk's payload is copied once into a pooled block that gRPC sends from;
// received chunks are recycled; each Communicator keeps one staging buffer the size of its
// largest collective. gRPC allocates a buffer per socket read, so Listen sets glibc's malloc
// thresholds once per process (mallopt: mmap above 32 MiB, trim above 128 MiB) to keep that
// memory for reuse instead of page-faulting it in again; ATOLL_WAN_MALLOPT=0 keeps the defaults.
// Streams send keepalive pings (20 s) so an idle WAN connection stays open and a dead one is
// noticed.
//
// Stats: payload bytes of operations sent and received, operations started, and the seconds
// callers spent waiting for them (blocking calls and Wait()), for the live view and benchmarks.
//
// Thread-safety: as Communicator (one thread issues operations); the endpoint's server threads are
// internal. WanEndpoint's methods may be called from any thread.
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
  size_t chunk_bytes = 1 << 20;  // 1 .. 256 MiB
  // Connect's limit; an operation fails after this long without progress (no chunk arrived
  // from the peer it waits for, or none of its chunks could be written).
  double timeout_s = 120;
  uint64_t seed = 0;        // jitter draws
  bool choose_ring = true;  // false: ring in site order (no probes)
  // true: a receive keeps its verified chunks and writes the caller's buffer only when the whole
  // message has arrived (a failed receive leaves the buffer as it was). false: each chunk is
  // written into the caller's buffer as soon as it has been verified, overlapping that copy with
  // the transfer (faster for large messages; a failed receive may leave the buffer partly
  // written, with verified data only).
  bool stage_receives = true;
};

struct WanStats {
  uint64_t bytes_sent = 0, bytes_received = 0;  // payload bytes of operations (not probes)
  double seconds = 0;  // callers' time waiting for operations (blocking calls and Wait())
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
  // links and agrees on the ring. Collective over the sites. Call once (a failed Connect leaves
  // the endpoint unusable). Errors name the site and what is missing, e.g. "site 0: connect:
  // site 2 (HOST:PORT) did not answer within 120 s (last: ...)", or "... refused this site:
  // ... missing or wrong token".
  virtual StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options) = 0;
  // The ring order chosen by Connect (site indices; empty before).
  virtual std::vector<int> ring() const = 0;
  virtual WanStats stats() const = 0;
};

// The ring (a permutation of 0..n-1 starting with 0) maximizing the minimum of
// bandwidth[ring[i]][ring[i+1 mod n]] (bytes/s), ties broken by the smaller total latency
// (seconds), then lexicographically. Exhaustive for n <= 8, greedy nearest-fastest beyond.
std::vector<int> ChooseRing(const std::vector<std::vector<double>>& bandwidth,
                            const std::vector<std::vector<double>>& latency);

}  // namespace atl
