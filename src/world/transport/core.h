// The WAN transport's insides (world/wan.h), shared by the files of world/transport/:
//
//   core.h, core.cc       this: the shared state of an endpoint (WanCore), its data structures
//   pools.h               payload blocks and received chunks, reused
//   chunk.h, chunk.cc     one chunk builder, one chunk validator
//   server.cc             the gRPC server: accepting streams, filing chunks in the inboxes
//   sender.cc             the links: connecting, the delay queue, the sender thread, cancelling
//   inbox.cc              taking chunks out of the inboxes; why a peer is unusable
//   connect.cc            Connect: hellos, link measurements, the ring (ChooseRing)
//   rejoin.cc             Reconnect
//   snapshot.cc           Publish, serving and fetching snapshots
//   communicator.cc       the Communicator: collectives, sends, receives
//   endpoint.cc           WanEndpoint
//
// Shape of one endpoint (a WanCore, shared by the WanEndpoint and the Communicator it returns):
//   - a gRPC server: one Stream call per peer, whose handler thread reads chunks, checks the
//     stream's rules (protocol version, the sender's site), hashes the payload and files the chunk
//     in that peer's inbox (collective FIFO, per-tag send/recv slots, or control state);
//   - one Link per peer: a queue of outgoing chunks with the emulated arrival time of each
//     (LinkEmulator, computed when the chunk is queued) and a sender thread that writes each chunk
//     to the peer's stream at that time;
//   - a worker thread per Communicator (CollectiveThread) that runs the collectives in call order:
//     it queues chunks on the links and takes chunks from the inboxes, validating each.
// Rejoining (Reconnect) replaces a peer's Link (the old one is retired: cancelled, its thread
// joined later) and accepts the peer's new stream in place of its old one, giving its inbox a new
// generation: chunks still arriving on the old stream carry the old generation and are dropped.
// Fetch serves the published snapshot from the server's thread, paced like the link.
// Sends are queued from the caller's thread (their payload is copied from the caller's buffer by
// the sender thread just before the write) and receives run in the handle's Wait(), so
// point-to-point messages never wait behind a collective.
//
// Locks, in the order they may be taken: WanCore::mu_, links_mu_, a Link's mu, an OpTracker's mu.
// addr_mu_, snapshot_mu_ and stats_mu_ are leaves: taken last (addr_mu_ may be under mu_),
// nothing taken while one is held.
#pragma once

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "comm/communicator.h"
#include "core/hash.h"
#include "core/log.h"
#include "core/status.h"
#include "world/link.h"
#include "world/proto/transport.grpc.pb.h"
#include "world/security.h"
#include "world/transport/chunk.h"
#include "world/transport/pools.h"
#include "world/wan.h"
#include "world/wan_internal.h"

namespace atl::transport {

namespace pb = ::atl::wan;
using Clock = std::chrono::steady_clock;

constexpr const char* kSiteHeader = "x-atoll-site";
// The address the opening site is reached at (its own entry of WanOptions::peers: what the
// membership says of it). A stream is accepted only from the address the receiver knows for that
// site, so a stale incarnation (an old process still running) is fenced off once a new one has
// taken the site over.
constexpr const char* kAddressHeader = "x-atoll-address";
constexpr uint32_t kUnconfigured = 0xffffffffu;
constexpr int kMaxMessageBytes = static_cast<int>(kWanMaxChunkBytes + (16 << 20));
constexpr int kPingRounds = 3;

// The keepalive of both ends of a stream: a ping every keepalive_s / 2, a connection whose peer
// leaves one unanswered for keepalive_s / 2 is closed (a hung process, power loss, a partition:
// nothing else closes it); pings are allowed without data, as often as they come. The server
// adds the last two (it would call such pings abuse). Pairs of gRPC channel argument and value.
std::vector<std::pair<std::string, int>> KeepaliveArgs(double keepalive_s, bool server);
// The test hooks (world/wan_internal.h), or null.
std::shared_ptr<const WanChunkHook> ChunkHook();
std::shared_ptr<const WanFetchHook> FetchHook();
std::string NotConnected(int site);
// The site a call's metadata claims (-1: none or malformed).
int ClaimedSite(const grpc::ServerContext& ctx);
// With TLS: why the caller's certificate does not fit the site it claims ("" when it does).
std::string CertificateMismatch(const grpc::ServerContext& ctx, const WorldSecurity& security,
                                int claimed);

// The outgoing chunks of one operation: how many are still queued, and why one failed.
struct OpTracker {
  std::mutex mu;  // also held while a sender thread reads a chunk's payload from the operation
  std::condition_variable cv;
  int pending = 0;
  // The operation is over (it failed or gave up): its lazy payloads, memory the caller may free
  // from now on, must never be read again (WanCore::Cancel).
  bool cancelled = false;
  std::string error;

  void Add() {
    std::lock_guard<std::mutex> lk(mu);
    ++pending;
  }
  void Done(const std::string& err) {
    {
      std::lock_guard<std::mutex> lk(mu);
      --pending;
      if (!err.empty() && error.empty()) error = err;
    }
    cv.notify_all();
  }
  void Fail(const std::string& err) {
    {
      std::lock_guard<std::mutex> lk(mu);
      if (error.empty()) error = err;
    }
    cv.notify_all();
  }
};

// A chunk to write. Its payload is either in the chunk (control messages) or `src_bytes` at
// `src`: memory of the operation (the caller's buffer, the staging buffer or a received chunk)
// that stays valid and unchanged until the chunk has been written (its tracker's Done), and is
// copied into a pooled block just before the write.
struct OutItem {
  std::unique_ptr<pb::Chunk> chunk;
  const char* src = nullptr;
  size_t src_bytes = 0;
  bool hash_at_write = false;  // the checksum of src is computed by the sender thread
  double arrive_s = 0;         // write it at this time (emulated arrival); 0: at once
  std::shared_ptr<OpTracker> tracker;
  bool data = false;  // a collective's or a send's chunk (stats, test hook)
  size_t payload_bytes() const { return src ? src_bytes : chunk->payload().size(); }
};

// The outgoing half of a peer: the delay queue and the stream it feeds.
struct Link {
  int peer = 0;
  std::string address;
  std::mutex mu;
  std::condition_variable cv;
  std::deque<OutItem> queue;
  std::optional<LinkEmulator> emu;
  bool closing = false;
  bool exited = false;
  std::string error;  // why the link is unusable; empty while it works
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Transport::Stub> stub;
  std::unique_ptr<grpc::ClientContext> ctx;  // of the stream
  std::unique_ptr<grpc::ClientWriter<grpc::ByteBuffer>> writer;
  pb::StreamReply reply;
  std::promise<Status> connected;
  std::thread thread;
};

struct ChunkReturn {
  std::shared_ptr<ChunkPool> pool;
  void operator()(pb::Chunk* c) const {
    if (pool)
      pool->Put(std::unique_ptr<pb::Chunk>(c));
    else
      delete c;
  }
};
using PooledChunk = std::unique_ptr<pb::Chunk, ChunkReturn>;

struct Received {
  PooledChunk chunk;
  uint64_t hash = 0;  // of the payload as received
};

struct P2pTag {
  uint64_t next_seq = 1;  // the message the next arriving chunk belongs to
  std::map<uint64_t, std::deque<Received>> slots;
  std::set<uint64_t> failed;  // messages whose receive failed before they had all arrived
};

// The incoming half of a peer. Guarded by WanCore::mu_. Replaced by a fresh one (the next
// generation) whenever a stream of the peer is accepted, so that nothing an old stream delivered
// (messages, poison, exchanges) is mixed with what a new incarnation sends.
struct Inbox {
  uint64_t generation = 0;  // streams of the peer accepted so far: the current one's number
  uint64_t reconnects_at_accept = 0;      // this site's Reconnect(peer) calls when it was accepted
  grpc::ServerContext* stream = nullptr;  // the current stream's, while its handler reads it
  bool absent = false;                    // absent at Connect, and no stream from it since
  bool connected = false;                 // its stream to us has opened
  bool ended = false;                     // ... and has ended
  bool cancelled = false;                 // ... not by the peer's close (died, keepalive)
  std::string end_reason;
  std::string poison;   // a chunk broke the stream's rules: every later operation with it fails
  std::string lost;     // the peer was declared dead (PeerLost): every later operation fails
  std::string refused;  // why the last stream claiming to be this site was refused
  std::deque<Received> collective;
  std::map<uint32_t, P2pTag> p2p;
  uint64_t queued = 0;  // payload bytes in collective and p2p (WanOptions::max_queued_bytes)
  std::vector<double> probe_arrivals;
  std::map<uint32_t, double> pongs;       // ping tag -> arrival time
  std::map<uint32_t, std::string> infos;  // exchange kind -> payload
  std::set<std::string> rejoin_readies;   // the nonces of the Reconnect readies received
};

class WanCore;

class TransportService final : public pb::Transport::Service {
 public:
  explicit TransportService(WanCore* core) : core_(core) {}
  grpc::Status Stream(grpc::ServerContext* context, grpc::ServerReader<pb::Chunk>* reader,
                      pb::StreamReply* reply) override;
  grpc::Status Ping(grpc::ServerContext* context, const pb::Probe* request,
                    pb::Probe* reply) override;
  grpc::Status Fetch(grpc::ServerContext* context, const pb::FetchRequest* request,
                     grpc::ServerWriter<pb::FetchChunk>* writer) override;

 private:
  WanCore* core_;
};

// A published snapshot; its checksum is computed once, by the first fetch that needs it.
struct Snapshot {
  uint64_t index = 0;
  std::shared_ptr<const std::string> blob;
  std::once_flag hashed;
  uint64_t hash = 0;
  uint64_t Checksum() {
    std::call_once(hashed, [this] { hash = Hash64(blob->data(), blob->size()); });
    return hash;
  }
};

// What a collective checks its chunks against.
struct OpInfo {
  CommOp op;
  uint64_t seq;
  DType dtype;
  size_t total;  // elements in the operation's buffer
  int root;      // broadcast
  std::string prefix;
};
class WanCore : public std::enable_shared_from_this<WanCore> {
 public:
  explicit WanCore(WorldSecurity security) : security_(std::move(security)), service_(this) {}
  ~WanCore();

  Status Listen(const std::string& address, double keepalive_s);
  StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options);
  Status Reconnect(int peer, const std::string& address);
  void Publish(uint64_t index, std::shared_ptr<const std::string> blob);

  std::string address() const { return address_; }
  std::vector<int> ring() const {
    std::lock_guard<std::mutex> lk(mu_);
    return ring_;
  }
  WanStats stats() const {
    std::lock_guard<std::mutex> lk(stats_mu_);
    WanStats s = stats_;
    s.bytes_sent = bytes_sent_.load();
    s.bytes_received = bytes_received_.load();
    return s;
  }

  int site() const { return site_; }
  int sites() const { return n_; }
  // Fault injection (WanEndpoint::SetPayloadFault): the function, or null.
  void SetPayloadFault(WanPayloadFault fault) {
    std::lock_guard<std::mutex> lk(fault_mu_);
    fault_ = fault ? std::make_shared<const WanPayloadFault>(std::move(fault)) : nullptr;
    fault_set_.store(fault_ != nullptr);
  }
  std::shared_ptr<const WanPayloadFault> PayloadFault() const {
    if (!fault_set_.load(std::memory_order_relaxed)) return nullptr;
    std::lock_guard<std::mutex> lk(fault_mu_);
    return fault_;
  }
  const WanOptions& options() const { return options_; }
  // "site 2 (HOST:PORT)" with the peer's current address ("site 2 (absent)" while it has none).
  std::string PeerName(int p) const {
    std::lock_guard<std::mutex> lk(addr_mu_);
    if (size_t(p) >= addresses_.size()) return fmt::format("site {}", p);
    const std::string& a = addresses_[p];
    if (a.empty())
      return p == site_ ? fmt::format("site {}", p) : fmt::format("site {} (absent)", p);
    return fmt::format("site {} ({})", p, a);
  }

  // ---- Used by the server. ----
  grpc::Status HandleStream(grpc::ServerContext* context, grpc::ServerReader<pb::Chunk>* reader);
  grpc::Status HandlePing(grpc::ServerContext* context, const pb::Probe* request, pb::Probe* reply);
  grpc::Status HandleFetch(grpc::ServerContext* context, const pb::FetchRequest* request,
                           grpc::ServerWriter<pb::FetchChunk>* writer);

  // ---- Used by the communicator. ----
  // Files a chunk that arrived from `from` on its stream of this generation (0: a send to
  // ourselves); chunks of a stream that a newer one replaced are dropped.
  void Dispatch(int from, PooledChunk chunk, double now, uint64_t generation = 0);
  // Queues a chunk for `peer`; empty, or why the link cannot take it.
  std::string Enqueue(int peer, OutItem item);
  // OK if collectives may run: kInvalidArgument after a Reconnect, kUnavailable with a site
  // absent.
  Status CollectivesAllowed() const;
  // Reconnect(peer) calls so far: point-to-point numbering with the peer restarts when it changes.
  uint64_t PeerEpoch(int peer) const {
    std::lock_guard<std::mutex> lk(mu_);
    return reconnects_[peer];
  }
  // The next chunk of collective `seq` from `peer`.
  StatusOr<Received> PopCollective(int peer, uint64_t seq,
                                   const std::function<std::string()>& waiting_for);
  // The next chunk of message `seq` on (peer, tag).
  StatusOr<Received> PopMessage(int peer, uint32_t tag, uint64_t seq);
  // Drops what arrived of message `seq` on (peer, tag); `failed`: its receive failed, so the
  // chunks of it still to come are dropped on arrival (they count toward nothing).
  // `generation`: the peer's inbox generation when the receive began (InboxGeneration).
  void EraseMessage(int peer, uint32_t tag, uint64_t seq, bool failed, uint64_t generation);
  uint64_t InboxGeneration(int peer) const {
    std::lock_guard<std::mutex> lk(mu_);
    return inboxes_[size_t(peer)].generation;
  }
  // Waits until every chunk of `t` has been written (no progress for timeout_s: an error). On an
  // error chunks may still be queued: the caller must Cancel(t) before freeing their memory.
  Status WaitSent(OpTracker& t, int peer);
  // Ends operation `t`: no payload of it is read from now on (a sender thread copying one right
  // now finishes first), and its chunks still queued on any link are dropped. Afterwards the
  // memory its chunks pointed into may be freed. Cheap when nothing is pending.
  void Cancel(const std::shared_ptr<OpTracker>& t);
  // Marks collective `seq` failed here and tells every peer why, unless a peer's abort is what
  // failed it. Its chunks waiting in the inboxes are freed now, and those still to come are
  // dropped on arrival: a failed operation holds nothing against max_queued_bytes.
  void FailOp(uint64_t seq, const std::string& why);
  // Marks the link to `peer` (or this link) broken and cancels its stream.
  void AbortLink(int peer, const std::string& why);
  void AbortLinkObject(Link& l, const std::string& why);
  // The peer at `address` is dead (the coordinator said so): fails what waits for it, at once.
  void PeerLost(int peer, const std::string& address, const std::string& why);
  // A process at `address` is live again (WanEndpoint::PeerAlive): it is no longer dead here, and
  // chunks of `peer` below `epoch` are refused.
  void PeerAlive(int peer, const std::string& address, int64_t epoch);
  void SetEpoch(int64_t epoch) { own_epoch_.store(epoch); }
  // The lowest epoch a chunk of `peer` may carry (0 before Connect).
  int64_t MinEpoch(int peer) const;
  // Whether PeerLost declared `address` dead (and no PeerAlive since); why, or "".
  std::string DeadAt(const std::string& address) const;
  void CountReceived(size_t bytes) { bytes_received_ += bytes; }
  void CountOp() {
    std::lock_guard<std::mutex> lk(stats_mu_);
    ++stats_.operations;
  }
  void AddSeconds(double s) {
    std::lock_guard<std::mutex> lk(stats_mu_);
    stats_.seconds += s;
  }

 private:
  void SenderMain(Link* l, double deadline);
  Status ConnectLink(Link* l, double deadline);
  // Writes one chunk; empty or why the stream broke.
  std::string WriteItem(Link* l, OutItem& item);
  // The current link to `peer` (null: absent, or before Connect).
  std::shared_ptr<Link> LinkTo(int peer) const {
    std::lock_guard<std::mutex> lk(links_mu_);
    return size_t(peer) < links_.size() ? links_[peer] : nullptr;
  }
  // A link to `peer` at `address`, not started.
  std::shared_ptr<Link> MakeLink(int peer, const std::string& address) const;
  std::string EnqueueOn(Link& l, OutItem item);
  static OutItem Control(int site, uint32_t op, uint32_t tag, std::string payload,
                         const std::shared_ptr<OpTracker>& tracker = nullptr, uint64_t op_seq = 0);
  void Poison(int from, const std::string& why, uint64_t generation);
  void NoteRefusal(int claimed, const std::string& why);
  std::string IncomingState(int p) const;  // REQUIRES: mu_ held
  // Why the current link to `p` is unusable ("" while it works). REQUIRES: mu_ held (lock order:
  // mu_, links_mu_, a link's mu).
  std::string LinkError(int p) const;
  // Wakes the operations waiting on cv_ after a link changed (its mu must not be held).
  void NotifyWaiters() {
    { std::lock_guard<std::mutex> lk(mu_); }
    cv_.notify_all();
  }
  // Why operations that need `p` must fail now ("" if none of the reasons holds): an absent,
  // lost or poisoned peer, a broken link to it, a shutdown, and, for the peer an operation waits
  // for (awaited), a stream it closed. REQUIRES: mu_ held.
  std::string Unusable(int p, bool awaited) const;
  // What a Reconnect waiting for `p` sees (hello_seen: a hello arrived on its current stream).
  std::string RejoinState(int p, bool hello_seen) const;  // REQUIRES: mu_ held
  // Sends `payload` to every peer as exchange `kind` and returns what each peer sent.
  StatusOr<std::vector<std::string>> Exchange(uint32_t kind, const std::string& payload,
                                              double deadline);
  // Measures the links (bandwidth into this site, round trips from it) for the ring choice.
  Status MeasureLinks(double deadline, std::vector<double>* bw_in, std::vector<double>* rtt);
  void EnqueueControl(int peer, uint32_t op, uint32_t tag, std::string payload,
                      const std::shared_ptr<OpTracker>& tracker = nullptr, uint64_t op_seq = 0);

  const WorldSecurity security_;
  TransportService service_;
  std::unique_ptr<grpc::Server> server_;
  std::string address_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool configured_ = false;
  bool connect_called_ = false;
  bool connected_ = false;  // Connect succeeded
  bool shutting_down_ = false;
  std::vector<Inbox> inboxes_;
  std::map<int, std::string> early_refusals_;  // refused before Connect: claimed site -> why
  std::set<uint64_t> failed_ops_;
  std::map<uint64_t, std::string> aborts_;  // collective -> why a peer gave it up
  std::vector<int> ring_;
  std::vector<uint64_t> reconnects_;  // by site: Reconnect calls so far
  // The addresses PeerLost declared dead, with why: a Reconnect to one fails at once (the verdict
  // may come before this site reconnects to that incarnation, which would never answer).
  std::map<std::string, std::string> dead_addresses_;

  // Set by Connect before configured_ (then read-only).
  int site_ = -1, n_ = 0;
  WanOptions options_;
  std::vector<bool> absent_;                          // by site: absent at Connect
  std::vector<std::optional<LinkProfile>> profiles_;  // by site: of the link to it
  // The links by site (null for this one and absent ones), replaced by Reconnect; read by server
  // threads too (pongs, aborts). Retired links stay until their threads are joined.
  mutable std::mutex links_mu_;
  std::vector<std::shared_ptr<Link>> links_;
  std::vector<std::shared_ptr<Link>> retired_links_;
  mutable std::mutex addr_mu_;
  std::vector<std::string> addresses_;  // by site: the current address of its endpoint
  std::vector<int64_t> epochs_;         // by site: the epoch its current process registered at
  std::atomic<int64_t> own_epoch_{0};   // carried by every chunk this endpoint sends

  std::mutex snapshot_mu_;
  std::shared_ptr<Snapshot> snapshot_;

  std::shared_ptr<ChunkPool> chunk_pool_ = std::make_shared<ChunkPool>();
  std::shared_ptr<BlockPool> blocks_ = std::make_shared<BlockPool>();

  mutable std::mutex stats_mu_;
  WanStats stats_;
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};

  mutable std::mutex fault_mu_;
  std::shared_ptr<const WanPayloadFault> fault_;
  std::atomic<bool> fault_set_{false};
};

// The Communicator over `core`'s links, with the ring chosen at Connect (communicator.cc).
StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(std::shared_ptr<WanCore> core,
                                                         std::vector<int> ring);

}  // namespace atl::transport
