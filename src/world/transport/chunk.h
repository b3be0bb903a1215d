// Chunks: what every message of the WAN transport is cut into (world/proto/transport.proto). One
// builder for the chunks of collectives, sends and control messages, and one validator for what
// a collective or a receive expects of the next chunk it takes.
//
// Thread-safety: functions on values.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "world/proto/transport.pb.h"

namespace atl::transport {

// The info tags (Chunk.tag of a kWanOpInfo control message).
constexpr uint32_t kExchangeHello = 1;  // every incoming stream works
constexpr uint32_t kExchangeReady = 2;  // every outgoing stream works (+ the link measurements)
// Reconnect's hello (payload: the call's nonce), first on its new stream, and ready (payload:
// the nonce of a hello that arrived on the peer's current stream).
constexpr uint32_t kExchangeRejoin = 3;
constexpr uint32_t kExchangeRejoinReady = 4;
// Bounds on what a peer's control messages (pings, probes, infos, aborts) make this site hold:
// each payload's bytes, and the entries of each set or map they fill (the protocol sends a few).
constexpr size_t kMaxControlBytes = 1 << 20;  // above kWanProbeBytes (a bandwidth probe)
constexpr size_t kMaxControlEntries = 65536;

// A collective's chunks (as opposed to a send's and the control messages).
bool IsCollectiveOp(uint32_t op);

// Whether a send's chunk is the last of its message (a message's chunks are consecutive on the
// stream, so the next one starts the next message).
inline bool EndsMessage(const ::atl::wan::Chunk& c) {
  return c.count() >= c.total() || c.offset() >= c.total() - c.count();
}

// What a data chunk kept in an inbox counts toward WanOptions::max_queued_bytes: its payload plus
// the message object around it, so that empty chunks are not free to pile up.
constexpr uint64_t kChunkHeldOverhead = 256;
inline uint64_t HeldBytes(const ::atl::wan::Chunk& c) {
  return c.payload().size() + kChunkHeldOverhead;
}

// The header fields of a chunk.
struct ChunkHeader {
  int from_site = 0;
  uint32_t op = 0;      // a CommOp, or a control kind (world/wan_internal.h kWanOp*)
  uint64_t op_seq = 0;  // the collective's or the message's number (0 for most controls)
  uint32_t tag = 0;     // the ring step, the message's tag, or a control's detail
  uint32_t dtype = 0;
  uint64_t offset = 0, count = 0, total = 0;  // elements
  uint32_t root = 0;                          // broadcast
};

// A chunk of the current protocol version with these fields; the caller sets the payload and its
// checksum (or leaves them to the sender thread: transport/core.h OutItem).
std::unique_ptr<::atl::wan::Chunk> NewChunk(const ChunkHeader& h);

// Empty if chunk `c`, which arrived on the stream of site `from`, speaks this protocol version,
// names that site and carries an epoch of at least `min_epoch` (that of the site's process this
// receiver knows: a lower one is an earlier process's); otherwise why the peer is refused.
std::string CheckChunkOrigin(const ::atl::wan::Chunk& c, int from, int64_t min_epoch);

// What a peer has made this site hold so far (its inbox at the receiver).
struct InboxLoad {
  uint64_t queued_bytes = 0;  // data chunks not yet taken by a collective or a receive
  size_t rejoin_readies = 0, pongs = 0, probe_arrivals = 0;
  size_t aborts = 0;  // of every peer
};
// Empty if a chunk may be kept, given what its peer has made this site hold: a known op (and
// info tag), data within max_queued_bytes, control messages within kMaxControlBytes and
// kMaxControlEntries. Otherwise why the peer is refused (every later operation with it fails).
std::string ScreenChunk(const ::atl::wan::Chunk& c, const InboxLoad& load,
                        uint64_t max_queued_bytes);

// What the receiver expects of the next chunk of an operation.
struct ChunkExpectation {
  const char* kind = "operation";  // "operation" (a collective) or "message" (a send), in errors
  uint64_t op_seq = 0;
  std::optional<uint32_t> op;  // a collective's kind (a send's chunks are sorted by kind already)
  uint32_t dtype = 0;
  uint64_t total = 0;            // elements of the whole operation
  std::optional<uint32_t> root;  // collectives
  std::optional<uint32_t> step;  // collectives: the ring step (the chunk's tag)
  uint64_t offset = 0;           // the first element expected
  uint64_t count = 0;            // exactly (exact_count) or at most this many
  bool exact_count = true;
  size_t element_bytes = 1;
};

// Empty if `c`, whose payload hashes (XXH3-64) to `hash`, is the chunk expected; otherwise what is
// wrong, e.g. "checksum mismatch (payload XXH3 ..., the chunk says ...)" or "the operation has 100
// elements there, 101 here".
std::string CheckChunk(const ::atl::wan::Chunk& c, uint64_t hash, const ChunkExpectation& e);

}  // namespace atl::transport
