// Internals of the WAN transport (world/wan.h) that tests and benchmarks reach into.
//
// Thread-safety: SetWanChunkHookForTesting may be called from any thread; the hook runs on the
// endpoints' sender threads (all of them, in every endpoint of the process).
#pragma once

#include <cstdint>
#include <functional>

namespace atl {

namespace wan {
class Chunk;
}

// Test only: called for every data chunk (a collective's or a send's, not the transport's own
// control messages) just before a sender thread writes it to its stream, after its checksum was
// computed; it may change the chunk to simulate corruption or a confused peer. Process-wide;
// an empty function removes it.
using WanChunkHook = std::function<void(int from_site, int to_site, wan::Chunk& chunk)>;
void SetWanChunkHookForTesting(WanChunkHook hook);

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

}  // namespace atl
