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
// the stream claimed when it opened; with TLS, the client certificate must name that site,
// "site-N", and the server's must name the site dialled: world/security.h), the operation's
// sequence number, kind, dtype and size, root, ring step, the exact offset and length expected
// next, payload size, and an XXH3 checksum of the payload. Every RPC's token and certificate
// are checked (security.h); refusals are logged. A bad chunk fails the operation with
// an error naming the peer, the operation and the check ("site 1: all_reduce of 1000 float32:
// bad chunk from site 0 (HOST:PORT): checksum mismatch ..."); the site that fails a collective
// tells every peer (they fail it at once, "site 1 gave it up: ..."), and late chunks of a failed
// collective are dropped, so the next operation can run. A bad version or sender makes that
// peer unusable. Collective results are staged: the caller's buffers (all-reduce's input among
// them) are written only when every chunk has been received and checked, so a failed collective
// leaves them as they were; receives likewise unless stage_receives = false. A peer that
// vanishes fails the operation at once; one that goes silent without closing anything, within
// keepalive_s (unanswered keepalive pings), or at once when PeerLost says it is dead; one that
// stalls while answering pings, after timeout_s without progress.
//
// Memory and copies: a chunk's payload is copied once into a pooled block that gRPC sends from;
// received chunks are recycled; each Communicator keeps one staging buffer the size of its
// largest collective. gRPC allocates a buffer per socket read, so Listen sets glibc's malloc
// thresholds once per process (mallopt: mmap above 32 MiB, trim above 128 MiB, two arenas) to
// keep that memory for reuse instead of page-faulting it in again, without every thread's arena
// keeping its own; ATOLL_WAN_MALLOPT=0 keeps the defaults.
// Both ends of every stream send keepalive pings (every keepalive_s / 2) so an idle WAN
// connection stays open and a dead peer is noticed.
//
// Absent sites and rejoining: a site that dropped out of the world may come back at a round
// boundary as a new process (a new endpoint at a new address, the same site index):
//   - Absent peers. In WanOptions::peers an empty address for another site means that site is
//     absent. Connect opens no link to it and does not wait for it (the hello and ready exchanges
//     skip it); with any site absent the ring is in site order and the links are not measured.
//     A send to or receive from a peer that is not connected fails at once with kUnavailable
//     ("site 2 is not connected (absent when this site connected; see Reconnect)"), as does every
//     collective while a site is absent. A Connect where every other site is absent returns at
//     once: that is how a rejoining site starts, before it calls Reconnect for each live peer.
//   - Reconnect(k, address) replaces the link with site k: the old outgoing stream is cancelled,
//     a new one opened to `address` (same emulated LinkProfile), and k's new stream into this
//     site accepted in place of its old one, whose state is dropped. Both sides call it for each
//     other (either first, within timeout_s); see Reconnect below. Point-to-point state with k
//     starts fresh: the next message on every (k, tag) is message 1 again on both sides, so
//     tags may be reused, and nothing of the old incarnation (queued chunks, received messages, a
//     poisoned stream) reaches the new one. Collectives are not supported after any Reconnect
//     (their operation numbers would no longer agree across sites): they fail at once with
//     kInvalidArgument.
//   - Snapshots. Publish stores the endpoint's current snapshot (opaque bytes, e.g. the model's
//     parameters, with an increasing index); a rejoining site fetches it with FetchSnapshot from
//     a live peer before it rejoins. The transfer is chunked (1 MiB), paced like the emulated link
//     from the serving site to the asking one, counted in the server's bytes_sent, and verified
//     by the client (offsets, size, an XXH3-64 checksum of the whole snapshot).
//
// Stats: payload bytes of operations sent and received, operations started, and the seconds
// callers spent waiting for them (blocking calls and Wait()), for the live view and benchmarks.
// Snapshot bytes served count as sent. Stats accumulate across Reconnects.
//
// Thread-safety: as Communicator (one thread issues operations); the endpoint's server threads are
// internal. WanEndpoint's methods may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "world/link.h"
#include "world/security.h"

namespace atl {

inline constexpr uint32_t kWanProtocolVersion = 3;  // 2: streams name their address; 3: epochs

struct WanPeer {
  int site = 0;
  std::string address;  // host:port of its WanEndpoint; empty: the site is absent (not this one)
  // The membership epoch its process registered at (0: unknown). This site's own entry: what
  // every chunk it sends carries; another's: chunks of a lower epoch from it are refused (an
  // earlier process of that site, taken over since).
  int64_t epoch = 0;
};

struct WanOptions {
  int site = 0;  // this site (its rank in the returned Communicator)
  // Every site, this one included, ordered by site. Another site with an empty address is
  // absent: no link to it until Reconnect.
  std::vector<WanPeer> peers;
  // The emulated profile of the directed link from -> to (default: no emulation).
  std::function<LinkProfile(int from, int to)> link;
  size_t chunk_bytes = 1 << 20;  // 1 .. 256 MiB
  // Connect's limit; an operation fails after this long without progress (no chunk arrived
  // from the peer it waits for, or none of its chunks could be written).
  double timeout_s = 120;
  // A peer that stops answering this endpoint's keepalive pings for this long (nothing closed:
  // a hung process, power loss, a partition) has its link broken, which fails the operations
  // that send to it or wait for it. `atoll train` sets max(20 s, twice the coordinator's dead-site
  // time): the coordinator's verdict (PeerLost) comes first; this is the backstop for a peer the
  // coordinator still hears. Set the same on Listen (the server's side of the streams).
  double keepalive_s = 10;
  uint64_t seed = 0;        // jitter draws
  bool choose_ring = true;  // false: ring in site order (no probes)
  // Payload bytes a peer may have waiting here, not yet taken by a receive (collective chunks
  // and messages). A peer over it (one that floods, or sends what is never received) is
  // refused: every later operation with it fails. Far above what the protocol keeps in flight
  // (a ring step's piece or a message per peer).
  uint64_t max_queued_bytes = uint64_t{16} << 30;
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

// Fault injection (train/sdc/faults.h, kind wan): called on the sending site for every data
// chunk (a collective's or a send's, not the transport's control messages) with the site it goes
// to, its operation (CommOp) and its payload, which it may change. The chunk's checksum is then
// taken over the changed bytes, so the receiver accepts them: corruption of a payload in the
// sender's memory before it was checksummed, which the transport cannot see. Runs on the
// endpoint's sender threads.
using WanPayloadFault = std::function<void(int to_site, uint32_t op, std::string* payload)>;

class WanEndpoint {
 public:
  // Starts the server on host:port (port 0: any free port). keepalive_s: a peer whose stream
  // into this endpoint stops answering the server's keepalive pings for this long is gone (its
  // stream is closed), as if it had exited. Errors name the address.
  static StatusOr<std::unique_ptr<WanEndpoint>> Listen(const std::string& address,
                                                       const WorldSecurity& security,
                                                       double keepalive_s = 10);
  virtual ~WanEndpoint() = default;
  // host:port with the bound port.
  virtual std::string address() const = 0;
  // Connects to every peer (waiting up to options.timeout_s for them to listen), measures the
  // links and agrees on the ring. Collective over the sites that are not absent (an empty
  // address): absent ones are skipped, and with any absent the ring is in site order, unmeasured.
  // Call once (a failed Connect leaves the endpoint unusable). Errors name the site and what is
  // missing, e.g. "site 0: connect: site 2 (HOST:PORT) did not answer within 120 s (last: ...)",
  // or "... refused this site: ... missing or wrong token".
  virtual StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options) = 0;
  // After a successful Connect: makes a fresh link with `site`, whose endpoint is at `address`
  // (a new process after a crash, or the same one), and returns once both directions work:
  // this site's new stream to it is open, its new stream into this site has been accepted, and a
  // hello from each side has reached the other (with a second message each way confirming it).
  // The peer must call Reconnect(this site, ...) too, within timeout_s of this call (either side
  // may be first). The old outgoing stream is cancelled, chunks still queued on it are dropped;
  // the old incoming stream is cancelled when the new one is accepted, and what it had delivered
  // (messages not yet received, a poisoned state) is dropped. Works the same for a peer that was
  // absent at Connect. Point-to-point messages with `site` restart at message 1 on every tag;
  // collectives fail from the first Reconnect on (not supported). May be called from any thread,
  // also for several peers at once (one call per peer at a time); the caller guarantees that no
  // operation involving `site` runs meanwhile. Errors: kInvalidArgument (no Connect yet, a bad site
  // or address); kUnavailable after timeout_s naming the peer and what is missing ("site 0:
  // reconnect: site 2 (HOST:PORT) did not answer within 120 s (last: ...)", "... no hello on a new
  // stream from it within 120 s: it has not opened a new stream to this site"). After a failed
  // Reconnect, both sides call Reconnect again before using the link.
  virtual Status Reconnect(int site, const std::string& address) = 0;
  // Stores (replaces) the snapshot served to FetchSnapshot: opaque bytes (null: empty) with an
  // increasing index. The blob is shared, not copied, and must not change afterwards; a fetch in
  // progress keeps serving the snapshot it started with. Cheap: the checksum is computed by the
  // first fetch. Allowed before Connect: the endpoint serves what is published from Listen on
  // (to any site number until Connect; paced by the emulated link only once Connect has set it).
  virtual void Publish(uint64_t index, std::shared_ptr<const std::string> blob) = 0;
  // `site`, whose endpoint is at `address`, is dead (the coordinator declared it so: a hung
  // process, power loss, a partition): every operation waiting for it or sending to it fails at
  // once ("site 2 (HOST:PORT) is lost: <why>"), and so does every later one, until Reconnect
  // gives the site a fresh link. Ignored when the site's link is to another address now (a new
  // process took it over). Any thread.
  virtual void PeerLost(int site, const std::string& address, const std::string& why) = 0;
  // The coordinator counts a process of `site` at `address` live (a later membership), registered
  // at membership epoch `epoch`: a Reconnect to that address is allowed again (a new process may
  // listen where a dead one did, e.g. a fixed --wan-listen port), and chunks from that site
  // carrying a lower epoch (an earlier process's) are refused from now on. Any thread.
  virtual void PeerAlive(int site, const std::string& address, int64_t epoch) = 0;
  // The membership epoch this process registered at, carried by every chunk it sends from now on
  // (Connect takes it from its own WanPeer entry; a process that registers later, a rejoin, sets
  // it here before it reconnects). Any thread.
  virtual void SetEpoch(int64_t epoch) = 0;
  // Installs (null: removes) the payload fault of every link of this endpoint (WanPayloadFault).
  // Any thread; chunks already written are not changed.
  virtual void SetPayloadFault(WanPayloadFault fault) = 0;
  // The ring order chosen by Connect (site indices; empty before).
  virtual std::vector<int> ring() const = 0;
  virtual WanStats stats() const = 0;
};

// Asks the WanEndpoint at `address` for its published snapshot, as site `site` (token and TLS of
// `security`, as every call of the transport), if its index is at least min_index: returns the
// index and the bytes. The transfer is paced like the emulated link from that endpoint's site to
// `site` and must finish within timeout_s. Errors name the address: kNotFound when nothing (or
// only an older index) is published there (poll again later); kCorruption when the pieces do not
// fit together or the bytes do not match the checksum of the whole snapshot; kUnavailable when
// the endpoint cannot be reached, refuses this site (token, certificate) or runs out of time;
// kInvalidArgument for bad arguments. A snapshot announced over kMaxSnapshotBytes is refused
// (kCorruption); memory grows with the bytes received, not with the size announced. server_site:
// the site whose endpoint is at `address` (with TLS its certificate must name it; required then).
inline constexpr uint64_t kMaxSnapshotBytes = uint64_t{64} << 30;
StatusOr<std::pair<uint64_t, std::string>> FetchSnapshot(const std::string& address,
                                                         const WorldSecurity& security, int site,
                                                         uint64_t min_index, double timeout_s,
                                                         int server_site = -1);

// The ring (a permutation of 0..n-1 starting with 0) maximizing the minimum of
// bandwidth[ring[i]][ring[i+1 mod n]] (bytes/s), ties broken by the smaller total latency
// (seconds), then lexicographically. Exhaustive for n <= 8, greedy nearest-fastest beyond.
std::vector<int> ChooseRing(const std::vector<std::vector<double>>& bandwidth,
                            const std::vector<std::vector<double>>& latency);

}  // namespace atl
