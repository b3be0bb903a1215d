#include "world/transport/chunk.h"

#include <fmt/format.h>

#include "comm/communicator.h"
#include "core/hash.h"
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl::transport {

namespace {

std::string OpNameOf(uint32_t op) {
  if (op <= uint32_t(CommOp::kSplit)) return CommOpName(static_cast<CommOp>(op));
  return fmt::format("op {}", op);
}

std::string DTypeNameOf(uint32_t t) {
  if (t <= uint32_t(DType::kByte)) return DTypeName(static_cast<DType>(t));
  return fmt::format("dtype {}", t);
}

}  // namespace

bool IsCollectiveOp(uint32_t op) {
  return op == uint32_t(CommOp::kAllReduce) || op == uint32_t(CommOp::kReduceScatter) ||
         op == uint32_t(CommOp::kAllGather) || op == uint32_t(CommOp::kBroadcast) ||
         op == uint32_t(CommOp::kBarrier);
}

std::string CheckChunkOrigin(const ::atl::wan::Chunk& c, int from, int64_t min_epoch) {
  if (c.version() != kWanProtocolVersion)
    return fmt::format("a chunk has protocol version {} (this site speaks {})", c.version(),
                       kWanProtocolVersion);
  if (c.from_site() != static_cast<uint32_t>(from))
    return fmt::format("a chunk claims from_site {} on the stream of site {}", c.from_site(), from);
  if (c.epoch() < min_epoch)
    return fmt::format(
        "a chunk of an earlier process of site {} (membership epoch {}; its process now is of "
        "epoch {})",
        from, c.epoch(), min_epoch);
  return "";
}

std::string ScreenChunk(const ::atl::wan::Chunk& c, const InboxLoad& load,
                        uint64_t max_queued_bytes) {
  const uint32_t op = c.op();
  const uint64_t bytes = c.payload().size();
  if (IsCollectiveOp(op) || op == uint32_t(CommOp::kSend)) {
    const uint64_t held = HeldBytes(c);
    if (held > max_queued_bytes || load.queued_bytes > max_queued_bytes - held)
      return fmt::format(
          "it has sent {} bytes more than this site has received from it (the limit is {})",
          load.queued_bytes + held, max_queued_bytes);
    return "";
  }
  if (op < kWanOpPing || op > kWanOpAbort) return fmt::format("a chunk has unknown op {}", op);
  if (bytes > kMaxControlBytes)
    return fmt::format("a control message (op {}) of {} bytes, over the {} allowed", op, bytes,
                       kMaxControlBytes);
  const bool full = (op == kWanOpInfo && c.tag() == kExchangeRejoinReady &&
                     load.rejoin_readies >= kMaxControlEntries) ||
                    (op == kWanOpPong && load.pongs >= kMaxControlEntries) ||
                    (op == kWanOpProbe && load.probe_arrivals >= kMaxControlEntries) ||
                    (op == kWanOpAbort && load.aborts >= kMaxControlEntries);
  if ((op == kWanOpInfo && (c.tag() < kExchangeHello || c.tag() > kExchangeRejoinReady)) || full)
    return fmt::format("more control messages (op {}, tag {}) than the protocol sends", op,
                       c.tag());
  return "";
}

std::unique_ptr<::atl::wan::Chunk> NewChunk(const ChunkHeader& h) {
  auto c = std::make_unique<::atl::wan::Chunk>();
  c->set_version(kWanProtocolVersion);
  c->set_from_site(static_cast<uint32_t>(h.from_site));
  c->set_op(h.op);
  c->set_op_seq(h.op_seq);
  c->set_tag(h.tag);
  c->set_dtype(h.dtype);
  c->set_offset(h.offset);
  c->set_count(h.count);
  c->set_total(h.total);
  c->set_root(h.root);
  return c;
}

std::string CheckChunk(const ::atl::wan::Chunk& c, uint64_t hash, const ChunkExpectation& e) {
  if (c.op_seq() != e.op_seq)
    return fmt::format("op_seq {}, expected {} (a chunk of another {})", c.op_seq(), e.op_seq,
                       e.kind);
  if (e.op && c.op() != *e.op)
    return fmt::format(
        "it is part of {} where this site runs {} (collectives must be called in the same order "
        "on every site)",
        OpNameOf(c.op()), OpNameOf(*e.op));
  if (c.dtype() != e.dtype)
    return fmt::format("dtype {}, expected {}", DTypeNameOf(c.dtype()), DTypeNameOf(e.dtype));
  if (c.total() != e.total)
    return fmt::format("the {} has {} elements there, {} here", e.kind, c.total(), e.total);
  if (e.root && c.root() != *e.root)
    return fmt::format("root {} there, {} here", c.root(), *e.root);
  if (e.step && c.tag() != *e.step)
    return fmt::format("ring step {}, expected {}", c.tag(), *e.step);
  if (c.offset() > e.total || c.count() > e.total - c.offset())
    return fmt::format("elements {}..{} lie outside the buffer of {}", c.offset(),
                       c.offset() + c.count(), e.total);
  if (e.exact_count && (c.offset() != e.offset || c.count() != e.count))
    return fmt::format("elements {}..{}, expected {}..{}", c.offset(), c.offset() + c.count(),
                       e.offset, e.offset + e.count);
  if (!e.exact_count && (c.offset() != e.offset || c.count() > e.count))
    return fmt::format("elements {}..{}, expected the next from {} of {}", c.offset(),
                       c.offset() + c.count(), e.offset, e.total);
  if (c.payload().size() != c.count() * e.element_bytes)
    return fmt::format("a payload of {} bytes for {} elements", c.payload().size(), c.count());
  if (hash != c.checksum())
    return fmt::format("checksum mismatch (payload XXH3 {}, the chunk says {})", HashToHex(hash),
                       HashToHex(c.checksum()));
  return "";
}

}  // namespace atl::transport
