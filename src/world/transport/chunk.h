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
