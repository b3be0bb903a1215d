// Internals of the WAN transport (world/wan.h) that tests and benchmarks reach into.
//
// Thread-safety: SetWanChunkHookForTesting and SetWanFetchHookForTesting may be called from any
// thread; the chunk hook runs on the endpoints' sender threads, the fetch hook on their server
// threads (all of them, in every endpoint of the process).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace atl {

namespace wan {
class Chunk;
class FetchChunk;
}  // namespace wan

// Test only: called for every data chunk (a collective's or a send's, not the transport's own
// control messages) just before a sender thread writes it to its stream, after its checksum was
// computed; it may change the chunk to simulate corruption or a confused peer. Process-wide;
// an empty function removes it.
using WanChunkHook = std::function<void(int from_site, int to_site, wan::Chunk& chunk)>;
void SetWanChunkHookForTesting(WanChunkHook hook);

// Test only: called for every piece of a snapshot an endpoint serves (FetchSnapshot), after its
// checksum was set and just before it is written; it may change the piece to simulate corruption.
// from_site is the serving site (-1 before its Connect), to_site the asking one. Process-wide; an
// empty function removes it.
using WanFetchHook = std::function<void(int from_site, int to_site, wan::FetchChunk& piece)>;
void SetWanFetchHookForTesting(WanFetchHook hook);

// Control message kinds carried in Chunk.op next to the CommOp values (see transport.proto).
inline constexpr uint32_t kWanOpPing = 100;
inline constexpr uint32_t kWanOpPong = 101;
inline constexpr uint32_t kWanOpProbe = 102;
inline constexpr uint32_t kWanOpInfo = 103;
inline constexpr uint32_t kWanOpAbort = 104;

// Bandwidth probe at Connect: this many chunks of this many bytes to every peer, back to back.
inline constexpr int kWanProbeChunks = 8;
inline constexpr size_t kWanProbeBytes = 128 << 10;

// The largest chunk a WanEndpoint accepts (its server's receive limit is a little above).
inline constexpr size_t kWanMaxChunkBytes = size_t{256} << 20;

// A snapshot is served in pieces of at most this many bytes.
inline constexpr size_t kWanSnapshotPieceBytes = size_t{1} << 20;

}  // namespace atl
