// The WAN transport's chunk validators (world/transport/chunk.h): a peer's chunk, parsed from its
// protobuf bytes, screened for its origin and for what it would make this site hold
// (CheckChunkOrigin, ScreenChunk), then checked against what a collective expects (CheckChunk).
// The first 38 bytes of the input set the receiver's side: its inbox load and its expectation
// (fuzz/make_seeds.cc writes them in this order).
#include "comm/communicator.h"
#include "fuzz/fuzz_util.h"
#include "world/proto/transport.pb.h"
#include "world/transport/chunk.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  atl::fuzz::Input in(data, size);
  const int from = in.Take<uint8_t>() % 4;
  atl::transport::InboxLoad load;
  load.queued_bytes = in.Take<uint32_t>();
  load.pongs = in.Take<uint16_t>() * 2;  // up to 2 * 65535, past kMaxControlEntries
  load.aborts = in.Take<uint16_t>() * 2;
  load.rejoin_readies = in.Take<uint16_t>() * 2;
  load.probe_arrivals = in.Take<uint16_t>() * 2;
  const uint64_t max_queued = in.Take<uint32_t>();
  atl::transport::ChunkExpectation e;
  const uint8_t flags = in.Take<uint8_t>();
  e.op_seq = in.Take<uint8_t>();
  const uint8_t op = in.Take<uint8_t>() % 8, root = in.Take<uint8_t>() % 4;
  const uint8_t step = in.Take<uint8_t>();
  if (flags & 1) e.op = op;
  if (flags & 2) e.root = root;
  if (flags & 4) e.step = step;
  e.exact_count = flags & 8;
  e.dtype = in.Take<uint8_t>() % 4;
  e.element_bytes = 1 + in.Take<uint8_t>() % 8;
  e.total = in.Take<uint16_t>();
  e.offset = in.Take<uint16_t>();
  e.count = in.Take<uint16_t>();
  const uint64_t hash = in.Take<uint64_t>();

  atl::wan::Chunk c;
  if (!c.ParseFromArray(in.data(), int(in.size()))) return 0;
  const int64_t min_epoch = (flags >> 4) & 3;
  const std::string origin = atl::transport::CheckChunkOrigin(c, from, min_epoch);
  if (origin.empty()) FUZZ_CHECK(c.epoch() >= min_epoch && c.from_site() == uint32_t(from));
  const std::string screen = atl::transport::ScreenChunk(c, load, max_queued);
  if (screen.empty()) {
    if (atl::transport::IsCollectiveOp(c.op()) || c.op() == uint32_t(atl::CommOp::kSend))
      FUZZ_CHECK(load.queued_bytes + atl::transport::HeldBytes(c) <= max_queued);
    else
      FUZZ_CHECK(c.payload().size() <= atl::transport::kMaxControlBytes);
  }
  const std::string check = atl::transport::CheckChunk(c, hash, e);
  if (check.empty()) {  // an accepted chunk fits the receiver's buffer exactly as it says
    FUZZ_CHECK(c.offset() <= e.total && c.count() <= e.total - c.offset());
    FUZZ_CHECK(c.payload().size() == c.count() * e.element_bytes);
    FUZZ_CHECK(c.checksum() == hash);
  }
  return 0;
}
