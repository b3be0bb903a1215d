// The WAN transport (world/wan.h).
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
#include "world/wan.h"

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <future>
#include <limits>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>
#include <utility>

#include "comm/collective_thread.h"
#include "core/hash.h"
#include "core/log.h"
#include "world/proto/transport.grpc.pb.h"
#include "world/wan_internal.h"

namespace atl {

namespace {

namespace pb = ::atl::wan;
using Clock = std::chrono::steady_clock;

constexpr const char* kSiteHeader = "x-atoll-site";
constexpr uint32_t kUnconfigured = 0xffffffffu;
constexpr uint32_t kExchangeHello = 1;  // every incoming stream works
constexpr uint32_t kExchangeReady = 2;  // every outgoing stream works (+ the link measurements)
// Reconnect's hello (payload: the call's nonce), first on its new stream, and ready (payload:
// the nonce of a hello that arrived on the peer's current stream).
constexpr uint32_t kExchangeRejoin = 3;
constexpr uint32_t kExchangeRejoinReady = 4;
constexpr int kMaxMessageBytes = static_cast<int>(kWanMaxChunkBytes + (16 << 20));
constexpr int kPingRounds = 3;

Clock::time_point AtSeconds(double s) {
  return Clock::time_point(
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s)));
}
// The same instant (NowSeconds' clock) on the system clock, for gRPC deadlines.
std::chrono::system_clock::time_point AtSecondsSystem(double s) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(s - NowSeconds()));
}

std::mutex g_hook_mu;
std::shared_ptr<const WanChunkHook> g_hook;
std::atomic<bool> g_hook_set{false};

std::shared_ptr<const WanChunkHook> ChunkHook() {
  if (!g_hook_set.load(std::memory_order_relaxed)) return nullptr;
  std::lock_guard<std::mutex> lk(g_hook_mu);
  return g_hook;
}

std::shared_ptr<const WanFetchHook> g_fetch_hook;  // guarded by g_hook_mu

std::shared_ptr<const WanFetchHook> FetchHook() {
  std::lock_guard<std::mutex> lk(g_hook_mu);
  return g_fetch_hook;
}

std::string NotConnected(int site) {
  return fmt::format("site {} is not connected (absent when this site connected; see Reconnect)",
                     site);
}

bool IsCollectiveOp(uint32_t op) {
  return op == uint32_t(CommOp::kAllReduce) || op == uint32_t(CommOp::kReduceScatter) ||
         op == uint32_t(CommOp::kAllGather) || op == uint32_t(CommOp::kBroadcast) ||
         op == uint32_t(CommOp::kBarrier);
}

std::string OpName(uint32_t op) {
  if (op <= uint32_t(CommOp::kSplit)) return CommOpName(static_cast<CommOp>(op));
  return fmt::format("op {}", op);
}

std::string DTypeNameOf(uint32_t t) {
  if (t <= uint32_t(DType::kByte)) return DTypeName(static_cast<DType>(t));
  return fmt::format("dtype {}", t);
}

template <class T>
void AddInto(uint8_t* dst, const char* src, size_t n) {
  T* d = reinterpret_cast<T*>(dst);
  const T* s = reinterpret_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) d[i] += s[i];
}

void Accumulate(DType t, uint8_t* dst, const char* src, size_t n) {
  switch (t) {
    case DType::kFloat32:
      AddInto<float>(dst, src, n);
      break;
    case DType::kFloat64:
      AddInto<double>(dst, src, n);
      break;
    case DType::kInt32:
      AddInto<int32_t>(dst, src, n);
      break;
    case DType::kInt64:
      AddInto<int64_t>(dst, src, n);
      break;
    case DType::kByte:
      break;  // rejected by CheckArgs
  }
}

// The outgoing chunks of one operation: how many are still queued, and why one failed.
struct OpTracker {
  std::mutex mu;
  std::condition_variable cv;
  int pending = 0;
  bool cancelled = false;  // a send gave up: its lazy payloads must no longer be read
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
  void Cancel() {
    std::lock_guard<std::mutex> lk(mu);
    cancelled = true;
  }
};

// Payload blocks handed to gRPC: each chunk's payload is copied once into a block that gRPC owns
// until it has written it; released blocks come back here, so steady traffic reuses warm memory
// instead of page-faulting fresh allocations. (gRPC may keep a written message referenced for a
// while, so memory it holds must not be the caller's.)
class BlockPool : public std::enable_shared_from_this<BlockPool> {
 public:
  ~BlockPool() {
    for (auto& [cap, block] : free_) delete[] block;
  }
  // A slice of `bytes` copied from `src`; its block returns to the pool when gRPC drops it.
  grpc::Slice Copy(const char* src, size_t bytes) {
    char* block = nullptr;
    size_t cap = bytes;
    {
      std::lock_guard<std::mutex> lk(mu_);
      auto it = free_.lower_bound(bytes);
      if (it != free_.end() && it->first <= 2 * bytes) {
        cap = it->first;
        block = it->second;
        free_bytes_ -= cap;
        free_.erase(it);
      }
    }
    if (!block) block = new char[cap];
    std::memcpy(block, src, bytes);
    return grpc::Slice(block, bytes, &Lent::Release, new Lent{shared_from_this(), block, cap});
  }

 private:
  struct Lent {
    std::shared_ptr<BlockPool> pool;
    char* block;
    size_t cap;
    static void Release(void* p) {
      auto* lent = static_cast<Lent*>(p);
      lent->pool->Put(lent->block, lent->cap);
      delete lent;
    }
  };
  void Put(char* block, size_t cap) {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_bytes_ + cap > kMaxFreeBytes) {
      delete[] block;
      return;
    }
    free_.emplace(cap, block);
    free_bytes_ += cap;
  }
  static constexpr size_t kMaxFreeBytes = size_t{64} << 20;
  std::mutex mu_;
  std::multimap<size_t, char*> free_;  // capacity -> block
  size_t free_bytes_ = 0;
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

// Received chunks are recycled: a chunk read into a recycled message reuses its payload's
// capacity, so a steady stream of chunks allocates (and page-faults) nothing.
class ChunkPool {
 public:
  std::unique_ptr<pb::Chunk> Get() {
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.empty()) return std::make_unique<pb::Chunk>();
    auto c = std::move(free_.back());
    free_.pop_back();
    bytes_ -= c->payload().capacity();
    return c;
  }
  void Put(std::unique_ptr<pb::Chunk> c) {
    if (!c) return;
    const size_t cap = c->payload().capacity();
    std::lock_guard<std::mutex> lk(mu_);
    if (free_.size() >= kMaxChunks || bytes_ + cap > kMaxBytes) return;
    c->Clear();  // keeps the payload's capacity
    bytes_ += cap;
    free_.push_back(std::move(c));
  }

 private:
  static constexpr size_t kMaxChunks = 64, kMaxBytes = size_t{128} << 20;
  std::mutex mu_;
  std::vector<std::unique_ptr<pb::Chunk>> free_;
  size_t bytes_ = 0;
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
  std::string end_reason;
  std::string poison;   // a chunk broke the stream's rules: every later operation with it fails
  std::string refused;  // why the last stream claiming to be this site was refused
  std::deque<Received> collective;
  std::map<uint32_t, P2pTag> p2p;
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

  Status Listen(const std::string& address);
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
  void EraseMessage(int peer, uint32_t tag, uint64_t seq);
  // Waits until every chunk of `t` has been written (no progress for timeout_s: an error).
  Status WaitSent(OpTracker& t, int peer);
  // Marks collective `seq` failed here (its late chunks are dropped) and tells every peer why,
  // unless a peer's abort is what failed it.
  void FailOp(uint64_t seq, const std::string& why);
  // Marks the link to `peer` broken and cancels its stream.
  void AbortLink(int peer, const std::string& why);
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

  std::mutex snapshot_mu_;
  std::shared_ptr<Snapshot> snapshot_;

  std::shared_ptr<ChunkPool> chunk_pool_ = std::make_shared<ChunkPool>();
  std::shared_ptr<BlockPool> blocks_ = std::make_shared<BlockPool>();

  mutable std::mutex stats_mu_;
  WanStats stats_;
  std::atomic<uint64_t> bytes_sent_{0}, bytes_received_{0};
};

// ------------------------------------------------------------------------------------------
// Server side.

grpc::Status TransportService::Stream(grpc::ServerContext* context,
                                      grpc::ServerReader<pb::Chunk>* reader,
                                      pb::StreamReply* /*reply*/) {
  return core_->HandleStream(context, reader);
}

grpc::Status TransportService::Ping(grpc::ServerContext* context, const pb::Probe* request,
                                    pb::Probe* reply) {
  return core_->HandlePing(context, request, reply);
}

grpc::Status TransportService::Fetch(grpc::ServerContext* context, const pb::FetchRequest* request,
                                     grpc::ServerWriter<pb::FetchChunk>* writer) {
  return core_->HandleFetch(context, request, writer);
}

int ClaimedSite(const grpc::ServerContext& ctx) {
  const auto& md = ctx.client_metadata();
  auto it = md.find(kSiteHeader);
  if (it == md.end()) return -1;
  int site = -1;
  const char* b = it->second.data();
  const char* e = b + it->second.size();
  auto [p, ec] = std::from_chars(b, e, site);
  if (ec != std::errc() || p != e || site < 0) return -1;
  return site;
}

// With TLS: if the client certificate's common name names a site ("site-N"), it must be the site
// the stream claims. Certificates issued for the shared name "atoll" identify no site; then the
// claim made at stream open is what every chunk is held to.
std::string CertificateMismatch(const grpc::ServerContext& ctx, int claimed) {
  auto auth = ctx.auth_context();
  if (!auth || !auth->IsPeerAuthenticated()) return "";
  for (const auto& v : auth->FindPropertyValues("x509_common_name")) {
    std::string cn(v.data(), v.size());
    if (cn.rfind("site-", 0) != 0) continue;
    int site = -1;
    auto [p, ec] = std::from_chars(cn.data() + 5, cn.data() + cn.size(), site);
    if (ec == std::errc() && p == cn.data() + cn.size() && site != claimed)
      return fmt::format("its certificate is for {} but it claims site {}", cn, claimed);
  }
  return "";
}

grpc::Status WanCore::HandlePing(grpc::ServerContext* context, const pb::Probe* request,
                                 pb::Probe* reply) {
  grpc::Status auth = CheckToken(*context, security_);
  if (!auth.ok()) {
    LogWarning("wan {}: refused a ping from {}: {}", address_, context->peer(),
               auth.error_message());
    return auth;
  }
  if (request->version() != kWanProtocolVersion) {
    LogWarning("wan {}: refused a ping from {}: protocol version {}, this endpoint speaks {}",
               address_, context->peer(), request->version(), kWanProtocolVersion);
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        fmt::format("protocol version {}, this endpoint speaks {}",
                                    request->version(), kWanProtocolVersion));
  }
  reply->set_version(kWanProtocolVersion);
  std::lock_guard<std::mutex> lk(mu_);
  reply->set_from_site(configured_ ? static_cast<uint32_t>(site_) : kUnconfigured);
  return grpc::Status::OK;
}

void WanCore::NoteRefusal(int claimed, const std::string& why) {
  std::lock_guard<std::mutex> lk(mu_);
  if (claimed < 0) return;
  if (configured_ && claimed < n_)
    inboxes_[claimed].refused = why;
  else
    early_refusals_[claimed] = why;
}

grpc::Status WanCore::HandleStream(grpc::ServerContext* context,
                                   grpc::ServerReader<pb::Chunk>* reader) {
  const int claimed = ClaimedSite(*context);
  grpc::Status auth = CheckToken(*context, security_);
  if (!auth.ok()) {
    LogWarning("wan {}: refused a stream from {} claiming site {}: {}", address_, context->peer(),
               claimed, auth.error_message());
    NoteRefusal(claimed, auth.error_message());
    return auth;
  }
  if (claimed < 0) {
    LogWarning("wan {}: refused a stream from {}: no valid {} header", address_, context->peer(),
               kSiteHeader);
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        fmt::format("the stream must name its site in {}", kSiteHeader));
  }
  if (std::string bad = CertificateMismatch(*context, claimed); !bad.empty()) {
    LogWarning("wan {}: refused a stream from {}: {}", address_, context->peer(), bad);
    NoteRefusal(claimed, bad);
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, bad);
  }
  uint64_t generation = 0;
  {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return configured_ || shutting_down_; });
    if (shutting_down_) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    std::string bad;
    if (claimed >= n_ || claimed == site_) {
      bad = fmt::format("it claims site {}, which is {}", claimed,
                        claimed == site_ ? "this site" : "not a site of this world");
    } else {
      // A site's first stream (at Connect), one replacing a stream that ended (a new incarnation
      // of a site that died), or one replacing any earlier stream once this site called
      // Reconnect for that site after it was accepted (the old one may not have noticed its end
      // yet). Otherwise the peer may have called Reconnect before this site: wait for that.
      auto acceptable = [&] {
        const Inbox& in = inboxes_[claimed];
        return (!in.connected && !in.absent) || in.ended ||
               reconnects_[claimed] > in.reconnects_at_accept;
      };
      cv_.wait_until(lk, AtSeconds(NowSeconds() + options_.timeout_s),
                     [&] { return shutting_down_ || acceptable(); });
      if (shutting_down_) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
      if (!acceptable()) {
        bad = inboxes_[claimed].connected
                  ? fmt::format(
                        "site {} already has a stream here (and this site did not call "
                        "Reconnect({}) within {} s)",
                        claimed, claimed, options_.timeout_s)
                  : fmt::format(
                        "site {} was absent when this site connected, and this site did "
                        "not call Reconnect({}) within {} s",
                        claimed, claimed, options_.timeout_s);
      }
    }
    if (!bad.empty()) {
      lk.unlock();
      LogWarning("wan site {}: refused a stream from {}: {}", site_, context->peer(), bad);
      NoteRefusal(claimed < n_ && claimed != site_ ? claimed : -1, bad);
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, bad);
    }
    Inbox& in = inboxes_[claimed];
    if (in.stream) in.stream->TryCancel();  // the old stream, still open
    if (in.connected)
      LogDebug("wan site {}: a new stream from site {} replaces its old one", site_, claimed);
    Inbox fresh;
    fresh.generation = in.generation + 1;
    fresh.reconnects_at_accept = reconnects_[claimed];
    fresh.stream = context;
    fresh.connected = true;
    if (!in.connected) fresh.refused = std::move(in.refused);
    in = std::move(fresh);
    generation = in.generation;
  }
  cv_.notify_all();
  PooledChunk chunk(chunk_pool_->Get().release(), ChunkReturn{chunk_pool_});
  while (reader->Read(chunk.get())) {
    Dispatch(claimed, std::move(chunk), NowSeconds(), generation);
    chunk = PooledChunk(chunk_pool_->Get().release(), ChunkReturn{chunk_pool_});
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    Inbox& in = inboxes_[claimed];
    if (in.generation == generation) {  // else a newer stream has replaced this one
      in.ended = true;
      in.end_reason = context->IsCancelled() ? "its stream was cancelled" : "it closed its stream";
      in.stream = nullptr;
    }
  }
  cv_.notify_all();
  return grpc::Status::OK;
}

void WanCore::Poison(int from, const std::string& why, uint64_t generation) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    Inbox& in = inboxes_[from];
    if (generation != 0 && in.generation != generation) return;  // a replaced stream
    if (!in.poison.empty()) return;
    in.poison = why;
  }
  LogWarning("wan site {}: {}: {}; every later operation with it fails", site_, PeerName(from),
             why);
  cv_.notify_all();
}

void WanCore::Dispatch(int from, PooledChunk chunk, double now, uint64_t generation) {
  if (chunk->version() != kWanProtocolVersion) {
    Poison(from,
           fmt::format("a chunk has protocol version {} (this site speaks {})", chunk->version(),
                       kWanProtocolVersion),
           generation);
    return;
  }
  if (chunk->from_site() != static_cast<uint32_t>(from)) {
    Poison(from,
           fmt::format("a chunk claims from_site {} on the stream of site {}", chunk->from_site(),
                       from),
           generation);
    return;
  }
  const uint32_t op = chunk->op();
  if (op == kWanOpPing) {
    EnqueueControl(from, kWanOpPong, chunk->tag(), "");
    return;
  }
  uint64_t hash = 0;
  const bool data = IsCollectiveOp(op) || op == uint32_t(CommOp::kSend);
  if (data) hash = Hash64(chunk->payload().data(), chunk->payload().size());
  {
    std::lock_guard<std::mutex> lk(mu_);
    Inbox& in = inboxes_[from];
    if (generation != 0 && in.generation != generation) return;  // late, of a replaced stream
    if (IsCollectiveOp(op)) {
      in.collective.push_back({std::move(chunk), hash});
    } else if (op == uint32_t(CommOp::kSend)) {
      P2pTag& t = in.p2p[chunk->tag()];
      // A message's chunks are consecutive on the stream; the last one ends it. Whether the
      // chunk really belongs to that message (op_seq, offsets) is checked by the receive.
      const bool last =
          chunk->count() >= chunk->total() || chunk->offset() >= chunk->total() - chunk->count();
      t.slots[t.next_seq].push_back({std::move(chunk), hash});
      if (last) ++t.next_seq;
    } else if (op == kWanOpPong) {
      in.pongs[chunk->tag()] = now;
    } else if (op == kWanOpProbe) {
      in.probe_arrivals.push_back(now);
    } else if (op == kWanOpInfo && chunk->tag() == kExchangeRejoinReady) {
      in.rejoin_readies.insert(std::string(chunk->payload()));
    } else if (op == kWanOpInfo) {
      in.infos[chunk->tag()] = std::move(*chunk->mutable_payload());
    } else if (op == kWanOpAbort) {
      aborts_.emplace(chunk->op_seq(),
                      fmt::format("site {} gave it up: {}", from, std::string(chunk->payload())));
    } else {
      in.poison = fmt::format("a chunk has unknown op {}", op);
    }
  }
  cv_.notify_all();
}

// ------------------------------------------------------------------------------------------
// Links.

std::string WanCore::Enqueue(int peer, OutItem item) {
  std::shared_ptr<Link> l = LinkTo(peer);
  if (!l) return NotConnected(peer);
  return EnqueueOn(*l, std::move(item));
}

std::string WanCore::EnqueueOn(Link& l, OutItem item) {
  {
    std::lock_guard<std::mutex> lk(l.mu);
    if (!l.error.empty()) return l.error;
    if (l.closing) return "the endpoint is shutting down";
    if (l.emu) {
      const size_t bytes = item.payload_bytes() + 64;
      item.arrive_s = l.emu->Send(NowSeconds(), bytes).arrive_s;
    }
    if (item.tracker) item.tracker->Add();
    l.queue.push_back(std::move(item));
  }
  l.cv.notify_one();
  return "";
}

OutItem WanCore::Control(int site, uint32_t op, uint32_t tag, std::string payload,
                         const std::shared_ptr<OpTracker>& tracker, uint64_t op_seq) {
  auto c = std::make_unique<pb::Chunk>();
  c->set_version(kWanProtocolVersion);
  c->set_from_site(static_cast<uint32_t>(site));
  c->set_op(op);
  c->set_tag(tag);
  c->set_op_seq(op_seq);
  *c->mutable_payload() = std::move(payload);
  OutItem item;
  item.chunk = std::move(c);
  item.tracker = tracker;
  return item;
}

void WanCore::EnqueueControl(int peer, uint32_t op, uint32_t tag, std::string payload,
                             const std::shared_ptr<OpTracker>& tracker, uint64_t op_seq) {
  std::string err = Enqueue(peer, Control(site_, op, tag, std::move(payload), tracker, op_seq));
  if (!err.empty())
    LogDebug("wan site {}: control message to site {} dropped: {}", site_, peer, err);
}

std::shared_ptr<Link> WanCore::MakeLink(int peer, const std::string& address) const {
  auto l = std::make_shared<Link>();
  l->peer = peer;
  l->address = address;
  if (profiles_[peer])
    l->emu.emplace(*profiles_[peer], options_.seed, (uint64_t(site_) << 32) | uint64_t(peer));
  return l;
}

Status WanCore::ConnectLink(Link* l, double deadline) {
  std::string last = "no answer";
  double backoff = 0.02;
  bool fresh = true;
  for (;;) {
    {
      std::lock_guard<std::mutex> lk(l->mu);
      if (l->closing) return Status::Unavailable("the endpoint is shutting down");
    }
    const double now = NowSeconds();
    if (now >= deadline) {
      return Status::Unavailable(fmt::format("{} did not answer within {} s (last: {})",
                                             PeerName(l->peer), options_.timeout_s, last));
    }
    if (fresh) {
      // A fresh channel for each failed attempt: gRPC's reconnect backoff of a failed channel
      // grows to minutes; a peer that starts late should be found within ~100 ms.
      grpc::ChannelArguments args;
      // Keepalive pings find a silently dead peer (or connection) while the stream is idle, and
      // keep middleboxes from dropping idle WAN connections.
      args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 20000);
      args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 10000);
      args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
      args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
      l->channel = MakeChannel(l->address, security_, args, kMaxMessageBytes);
      l->stub = pb::Transport::NewStub(l->channel);
      fresh = false;
    }
    grpc::ClientContext ctx;
    AddToken(&ctx, security_);
    ctx.set_deadline(AtSecondsSystem(std::min(deadline, now + 2.0)));
    pb::Probe req, resp;
    req.set_version(kWanProtocolVersion);
    req.set_from_site(static_cast<uint32_t>(site_));
    grpc::Status s = l->stub->Ping(&ctx, req, &resp);
    if (s.ok()) {
      if (resp.version() != kWanProtocolVersion)
        return Status::Unavailable(fmt::format("{} speaks protocol version {}, this site {}",
                                               PeerName(l->peer), resp.version(),
                                               kWanProtocolVersion));
      if (resp.from_site() == static_cast<uint32_t>(l->peer)) break;
      if (resp.from_site() != kUnconfigured)
        return Status::InvalidArgument(
            fmt::format("{} answered as site {}", PeerName(l->peer), resp.from_site()));
      last = "it listens but has not called Connect";
    } else if (s.error_code() == grpc::StatusCode::UNAUTHENTICATED ||
               s.error_code() == grpc::StatusCode::PERMISSION_DENIED ||
               s.error_code() == grpc::StatusCode::FAILED_PRECONDITION) {
      return Status::Unavailable(
          fmt::format("{} refused this site: {}", PeerName(l->peer), s.error_message()));
    } else {
      last = s.error_message();
      fresh = true;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 0.2);
  }
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddToken(ctx.get(), security_);
  ctx->AddMetadata(kSiteHeader, std::to_string(site_));
  grpc::ClientContext* raw = ctx.get();
  {
    std::lock_guard<std::mutex> lk(l->mu);
    if (l->closing) return Status::Unavailable("the endpoint is shutting down");
    l->ctx = std::move(ctx);
  }
  // Chunks go out as ByteBuffers (the encoding of a Chunk, header and payload as separate
  // slices), through the same method as the generated stub's Stream.
  l->writer.reset(grpc::internal::ClientWriterFactory<grpc::ByteBuffer>::Create(
      l->channel.get(),
      grpc::internal::RpcMethod("/atl.wan.Transport/Stream",
                                grpc::internal::RpcMethod::CLIENT_STREAMING, l->channel),
      raw, &l->reply));
  if (!l->writer)
    return Status::Unavailable(fmt::format("cannot open a stream to {}", PeerName(l->peer)));
  return Status::Ok();
}

// Writes one chunk; empty or why the stream broke. Calls the tracker's Done for it.
std::string WanCore::WriteItem(Link* l, OutItem& item) {
  pb::Chunk& c = *item.chunk;
  std::unique_lock<std::mutex> guard;
  if (item.src && item.hash_at_write) {
    // A send's buffer: readable only while its send has not given up.
    guard = std::unique_lock<std::mutex>(item.tracker->mu);
    if (item.tracker->cancelled) {
      guard.unlock();
      item.tracker->Done("");
      return "";
    }
    c.set_checksum(Hash64(item.src, item.src_bytes));
  }
  if (item.data) {
    if (auto hook = ChunkHook()) {  // tests: the hook sees (and may change) the whole chunk
      if (item.src) c.set_payload(item.src, item.src_bytes);
      item.src = nullptr;
      (*hook)(site_, l->peer, c);
    }
  }
  const size_t bytes = item.payload_bytes();
  std::string head;
  c.SerializeToString(&head);
  grpc::Slice slices[2];
  size_t n = 1;
  if (item.src && item.src_bytes > 0) {
    // The payload field (10, length-delimited) last: the bytes are a valid encoding of a Chunk.
    uint64_t v = item.src_bytes;
    head.push_back(char(10 << 3 | 2));
    while (v >= 0x80) {
      head.push_back(char(v | 0x80));
      v >>= 7;
    }
    head.push_back(char(v));
    if (item.src_bytes < 4096) {
      head.append(item.src, item.src_bytes);
    } else {
      slices[1] = blocks_->Copy(item.src, item.src_bytes);
      n = 2;
    }
  }
  if (guard.owns_lock()) guard.unlock();
  slices[0] = grpc::Slice(head);
  bool ok;
  {
    grpc::ByteBuffer bb(slices, n);
    slices[0] = grpc::Slice();
    slices[1] = grpc::Slice();
    ok = l->writer->Write(bb);
  }
  std::string err;
  if (!ok) {
    grpc::Status s = l->writer->Finish();
    l->writer.reset();
    err = fmt::format("the stream to {} broke: {}", PeerName(l->peer),
                      s.ok() ? "closed by the peer" : s.error_message());
  } else if (item.data) {
    bytes_sent_ += bytes;
  }
  if (item.tracker) item.tracker->Done(err);
  return err;
}

void WanCore::SenderMain(Link* l, double deadline) {
  Status st = ConnectLink(l, deadline);
  std::unique_lock<std::mutex> lk(l->mu);
  if (!st.ok()) l->error = st.message();
  l->connected.set_value(st);
  while (st.ok()) {
    l->cv.wait(lk, [&] { return l->closing || !l->error.empty() || !l->queue.empty(); });
    if (l->closing || !l->error.empty()) break;
    if (l->queue.front().arrive_s > NowSeconds()) {
      l->cv.wait_until(lk, AtSeconds(l->queue.front().arrive_s),
                       [&] { return l->closing || !l->error.empty(); });
      continue;
    }
    OutItem item = std::move(l->queue.front());
    l->queue.pop_front();
    lk.unlock();
    std::string err = WriteItem(l, item);
    lk.lock();
    if (!err.empty()) {
      l->error = err;
      LogDebug("wan site {}: {}", site_, err);
      break;
    }
  }
  std::deque<OutItem> rest = std::move(l->queue);
  l->queue.clear();
  const std::string why = l->error.empty() ? "the endpoint is shutting down" : l->error;
  lk.unlock();
  for (auto& item : rest)
    if (item.tracker) item.tracker->Done(why);
  if (l->writer) {
    l->writer->WritesDone();
    grpc::Status s = l->writer->Finish();
    if (!s.ok())
      LogDebug("wan site {}: the stream to site {} ended: {}", site_, l->peer, s.error_message());
  }
  lk.lock();
  l->exited = true;
  l->cv.notify_all();
}

// ------------------------------------------------------------------------------------------
// Receiving.

StatusOr<Received> WanCore::PopCollective(int peer, uint64_t seq,
                                          const std::function<std::string()>& waiting_for) {
  const double timeout = options_.timeout_s;
  std::unique_lock<std::mutex> lk(mu_);
  double deadline = NowSeconds() + timeout;
  for (;;) {
    if (auto a = aborts_.find(seq); a != aborts_.end()) return Status::Unavailable(a->second);
    Inbox& in = inboxes_[peer];
    while (!in.collective.empty() && in.collective.front().chunk->op_seq() < seq &&
           failed_ops_.count(in.collective.front().chunk->op_seq()))
      in.collective.pop_front();  // late chunks of an operation that failed here
    if (!in.collective.empty()) {
      Received r = std::move(in.collective.front());
      in.collective.pop_front();
      return r;
    }
    if (in.absent) return Status::Unavailable(NotConnected(peer));
    if (!in.poison.empty())
      return Status::Corruption(fmt::format("{} is unusable: {}", PeerName(peer), in.poison));
    if (in.ended)
      return Status::Unavailable(fmt::format("{} is gone: {} (waiting for {})", PeerName(peer),
                                             in.end_reason, waiting_for()));
    if (shutting_down_) return Status::Unavailable("the endpoint is shutting down");
    if (cv_.wait_until(lk, AtSeconds(deadline)) == std::cv_status::timeout &&
        NowSeconds() >= deadline) {
      return Status::Unavailable(fmt::format("timed out after {} s waiting for {} ({})", timeout,
                                             PeerName(peer), waiting_for()));
    }
  }
}

StatusOr<Received> WanCore::PopMessage(int peer, uint32_t tag, uint64_t seq) {
  const double timeout = options_.timeout_s;
  std::unique_lock<std::mutex> lk(mu_);
  const double deadline = NowSeconds() + timeout;
  for (;;) {
    Inbox& in = inboxes_[peer];
    auto t = in.p2p.find(tag);
    if (t != in.p2p.end()) {
      auto s = t->second.slots.find(seq);
      if (s != t->second.slots.end() && !s->second.empty()) {
        Received r = std::move(s->second.front());
        s->second.pop_front();
        return r;
      }
    }
    if (in.absent) return Status::Unavailable(NotConnected(peer));
    if (!in.poison.empty())
      return Status::Corruption(fmt::format("{} is unusable: {}", PeerName(peer), in.poison));
    if (in.ended)
      return Status::Unavailable(fmt::format("{} is gone: {}", PeerName(peer), in.end_reason));
    if (shutting_down_) return Status::Unavailable("the endpoint is shutting down");
    if (cv_.wait_until(lk, AtSeconds(deadline)) == std::cv_status::timeout &&
        NowSeconds() >= deadline) {
      return Status::Unavailable(
          fmt::format("timed out after {} s: no data from {}", timeout, PeerName(peer)));
    }
  }
}

void WanCore::EraseMessage(int peer, uint32_t tag, uint64_t seq) {
  std::lock_guard<std::mutex> lk(mu_);
  auto t = inboxes_[peer].p2p.find(tag);
  if (t != inboxes_[peer].p2p.end()) t->second.slots.erase(seq);
}

Status WanCore::WaitSent(OpTracker& t, int peer) {
  const double timeout = options_.timeout_s;
  std::unique_lock<std::mutex> lk(t.mu);
  int last = t.pending;
  double deadline = NowSeconds() + timeout;
  while (t.pending > 0) {
    if (!t.error.empty()) {
      // Failed: the remaining chunks are dropped at once; wait for that, since the caller may
      // free the memory they would be copied from when this returns.
      t.cv.wait_for(lk, std::chrono::seconds(10), [&] { return t.pending == 0; });
      break;
    }
    t.cv.wait_until(lk, AtSeconds(deadline));
    if (t.pending < last) {
      last = t.pending;
      deadline = NowSeconds() + timeout;
    } else if (NowSeconds() >= deadline && t.pending > 0 && t.error.empty()) {
      const std::string why = fmt::format(
          "timed out after {} s sending to {}: {} chunks not written (the link is stalled or the "
          "peer does not read)",
          timeout, PeerName(peer), t.pending);
      lk.unlock();
      // The link is broken from now on; cancelling its stream unblocks its sender thread, which
      // then drops the chunks still queued.
      AbortLink(peer, why);
      lk.lock();
      t.cv.wait_for(lk, std::chrono::seconds(10), [&] { return t.pending == 0; });
      return Status::Unavailable(why);
    }
  }
  if (!t.error.empty()) return Status::Unavailable(t.error);
  return Status::Ok();
}

void WanCore::AbortLink(int peer, const std::string& why) {
  std::shared_ptr<Link> l = LinkTo(peer);
  if (!l) return;
  std::lock_guard<std::mutex> lk(l->mu);
  if (l->error.empty()) l->error = why;
  if (l->ctx) l->ctx->TryCancel();
  l->cv.notify_all();
}

Status WanCore::CollectivesAllowed() const {
  std::lock_guard<std::mutex> lk(mu_);
  for (int p = 0; p < n_; ++p) {
    if (reconnects_[p] > 0)
      return Status::InvalidArgument(fmt::format(
          "collectives are not supported after a Reconnect (site {} rejoined; the sites' "
          "operation numbers no longer agree): use sends and receives",
          p));
  }
  for (int p = 0; p < n_; ++p)
    if (absent_[p]) return Status::Unavailable(NotConnected(p));
  return Status::Ok();
}

void WanCore::FailOp(uint64_t seq, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    failed_ops_.insert(seq);
    if (aborts_.count(seq)) return;  // a peer gave it up first; it told everyone
  }
  for (int p = 0; p < n_; ++p)
    if (p != site_) EnqueueControl(p, kWanOpAbort, 0, why, nullptr, seq);
}

std::string WanCore::IncomingState(int p) const {
  const Inbox& in = inboxes_[p];
  std::string s;
  if (in.absent)
    s = "it was absent when this site connected and has not opened a stream since";
  else if (!in.connected)
    s = "it never opened its stream to this site";
  else if (in.ended)
    s = fmt::format("its stream ended: {}", in.end_reason);
  else if (!in.poison.empty())
    s = fmt::format("it sent a bad chunk: {}", in.poison);
  else
    s = "its stream is open but it did not answer";
  if (!in.refused.empty())
    s += fmt::format("; a stream claiming to be it was refused: {}", in.refused);
  return s;
}

std::string WanCore::RejoinState(int p, bool hello_seen) const {
  const Inbox& in = inboxes_[p];
  if (hello_seen) return IncomingState(p);
  std::string s = in.connected && !in.ended
                      ? "it has not opened a new stream to this site (its old one is still open)"
                      : "it has not opened a new stream to this site";
  if (!in.refused.empty())
    s += fmt::format("; a stream claiming to be it was refused: {}", in.refused);
  return s;
}

// ------------------------------------------------------------------------------------------
// Connect.

StatusOr<std::vector<std::string>> WanCore::Exchange(uint32_t kind, const std::string& payload,
                                                     double deadline) {
  for (int p = 0; p < n_; ++p)
    if (p != site_ && !absent_[p]) EnqueueControl(p, kWanOpInfo, kind, payload);
  std::unique_lock<std::mutex> lk(mu_);
  std::vector<std::string> out(n_);
  for (;;) {
    std::vector<int> missing;
    for (int p = 0; p < n_; ++p) {
      if (p == site_ || absent_[p]) continue;
      const Inbox& in = inboxes_[p];
      if (in.infos.count(kind)) continue;
      if (!in.poison.empty() || in.ended)
        return Status::Unavailable(fmt::format("{}: {}", PeerName(p), IncomingState(p)));
      missing.push_back(p);
    }
    if (missing.empty()) break;
    if (shutting_down_) return Status::Unavailable("the endpoint is shutting down");
    if (cv_.wait_until(lk, AtSeconds(deadline)) == std::cv_status::timeout &&
        NowSeconds() >= deadline) {
      std::string what;
      for (int p : missing)
        what += fmt::format("{}{}: {}", what.empty() ? "" : "; ", PeerName(p), IncomingState(p));
      return Status::Unavailable(
          fmt::format("not connected within {} s: {}", options_.timeout_s, what));
    }
  }
  for (int p = 0; p < n_; ++p)
    if (p != site_ && !absent_[p]) out[p] = inboxes_[p].infos[kind];
  return out;
}

Status WanCore::MeasureLinks(double deadline, std::vector<double>* bw_in,
                             std::vector<double>* rtt) {
  auto tracker = std::make_shared<OpTracker>();
  for (int p = 0; p < n_; ++p) {
    if (p == site_) continue;
    for (int i = 0; i < kWanProbeChunks; ++i)
      EnqueueControl(p, kWanOpProbe, static_cast<uint32_t>(i), std::string(kWanProbeBytes, '\0'),
                     tracker);
  }
  // Our bursts have left and every peer's burst has arrived: the links are quiet for the pings.
  ATOLL_RETURN_IF_ERROR(WaitSent(*tracker, site_ == 0 ? 1 : 0));
  std::unique_lock<std::mutex> lk(mu_);
  auto all = [&](auto pred) {
    for (int p = 0; p < n_; ++p)
      if (p != site_ && !pred(inboxes_[p])) return false;
    return true;
  };
  auto wait = [&](auto pred, const char* what) -> Status {
    if (!cv_.wait_until(lk, AtSeconds(deadline), [&] { return shutting_down_ || all(pred); }))
      return Status::Unavailable(fmt::format(
          "measuring the links: no {} from every site within {} s", what, options_.timeout_s));
    if (shutting_down_) return Status::Unavailable("the endpoint is shutting down");
    return Status::Ok();
  };
  ATOLL_RETURN_IF_ERROR(
      wait([](const Inbox& in) { return in.probe_arrivals.size() >= size_t(kWanProbeChunks); },
           "bandwidth probe"));
  bw_in->assign(n_, 0);
  rtt->assign(n_, 1e9);
  for (int p = 0; p < n_; ++p) {
    if (p == site_) continue;
    const auto& t = inboxes_[p].probe_arrivals;
    const double dt = t[kWanProbeChunks - 1] - t[0];
    (*bw_in)[p] = dt > 0 ? double(kWanProbeBytes) * (kWanProbeChunks - 1) / dt : 1e12;
  }
  for (uint32_t r = 0; r < kPingRounds; ++r) {
    lk.unlock();
    const double t0 = NowSeconds();
    for (int p = 0; p < n_; ++p)
      if (p != site_) EnqueueControl(p, kWanOpPing, r, "");
    lk.lock();
    ATOLL_RETURN_IF_ERROR(wait([r](const Inbox& in) { return in.pongs.count(r) > 0; }, "pong"));
    for (int p = 0; p < n_; ++p)
      if (p != site_) (*rtt)[p] = std::min((*rtt)[p], inboxes_[p].pongs[r] - t0);
  }
  return Status::Ok();
}

// Measured values on a coarse grid, so that links alike measure alike and the tie-breaks
// (latency, then order) decide between them: bandwidth in steps of 2^(1/4), latency 0.5 ms.
double QuantizeBandwidth(double bw) {
  if (!(bw > 0)) return 0;
  return std::exp2(std::round(std::log2(bw) * 4) / 4);
}
double QuantizeLatency(double s) { return std::round(std::max(s, 0.0) * 2000) / 2000; }

StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(std::shared_ptr<WanCore> core,
                                                         std::vector<int> ring);

StatusOr<std::unique_ptr<Communicator>> WanCore::Connect(const WanOptions& o) {
  const std::string prefix = fmt::format("site {}: connect", o.site);
  auto bad = [&](std::string what) {
    return Status::InvalidArgument(fmt::format("{}: {}", prefix, what));
  };
  const int n = static_cast<int>(o.peers.size());
  if (n < 1) return bad("no peers (the list must hold every site, this one included)");
  if (o.site < 0 || o.site >= n)
    return bad(fmt::format("site {} is not one of the {} peers", o.site, n));
  std::vector<bool> absent(n, false);
  for (int p = 0; p < n; ++p) {
    if (o.peers[p].site != p)
      return bad(
          fmt::format("peers must be ordered by site: entry {} is site {}", p, o.peers[p].site));
    absent[p] = p != o.site && o.peers[p].address.empty();
  }
  const bool any_absent = std::find(absent.begin(), absent.end(), true) != absent.end();
  if (o.chunk_bytes < 1 || o.chunk_bytes > kWanMaxChunkBytes)
    return bad(fmt::format("chunk_bytes {} must be in 1..{}", o.chunk_bytes, kWanMaxChunkBytes));
  if (!(o.timeout_s > 0) || !std::isfinite(o.timeout_s))
    return bad(fmt::format("timeout_s {} must be a finite number > 0", o.timeout_s));
  std::vector<std::optional<LinkProfile>> profiles(n);
  if (o.link) {
    for (int p = 0; p < n; ++p) {
      if (p == o.site) continue;
      LinkProfile lp = o.link(o.site, p);
      if (std::string e = ValidateLink(lp); !e.empty())
        return bad(fmt::format("link {} -> {}: {}", o.site, p, e));
      if (lp.latency_ms > 0 || lp.bandwidth_mbps > 0 || lp.jitter_ms > 0) profiles[p] = lp;
    }
  }
  const double deadline = NowSeconds() + o.timeout_s;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (connect_called_) return Status::InvalidArgument(prefix + ": Connect was already called");
    connect_called_ = true;
    site_ = o.site;
    n_ = n;
    options_ = o;
    absent_ = absent;
    profiles_ = profiles;
    inboxes_ = std::vector<Inbox>(n);
    reconnects_.assign(n, 0);
    for (auto& [s, why] : early_refusals_)
      if (s < n && s != site_) inboxes_[s].refused = why;
    for (int p = 0; p < n; ++p) inboxes_[p].absent = absent[p];
    {
      std::lock_guard<std::mutex> alk(addr_mu_);
      for (int p = 0; p < n; ++p) addresses_.push_back(o.peers[p].address);
    }
    std::lock_guard<std::mutex> llk(links_mu_);
    links_.resize(n);
    for (int p = 0; p < n; ++p)
      if (p != site_ && !absent[p]) links_[p] = MakeLink(p, o.peers[p].address);
    configured_ = true;
  }
  cv_.notify_all();
  // links_ holds only these links until Connect returns (Reconnect needs a connected endpoint).
  std::vector<Link*> links;
  for (int p = 0; p < n; ++p)
    if (auto l = LinkTo(p)) links.push_back(l.get());
  for (Link* l : links) l->thread = std::thread([this, l, deadline] { SenderMain(l, deadline); });
  for (Link* l : links) {
    Status s = l->connected.get_future().get();
    if (!s.ok()) return s.WithContext(prefix);
  }
  auto hello = Exchange(kExchangeHello, "", deadline);
  if (!hello.ok()) return hello.status().WithContext(prefix);

  std::vector<int> ring(n);
  for (int i = 0; i < n; ++i) ring[i] = i;
  std::string mine;
  const bool measure = o.choose_ring && n >= 3 && !any_absent;
  if (measure) {
    std::vector<double> bw_in, rtt;
    Status s = MeasureLinks(deadline, &bw_in, &rtt);
    if (!s.ok()) return s.WithContext(prefix);
    // Row of this site: for each j, the bandwidth j -> this site and the latency this -> j.
    mine.resize(sizeof(double) * 2 * n);
    for (int j = 0; j < n; ++j) {
      const double v[2] = {bw_in[j], j == site_ ? 0.0 : rtt[j] / 2};
      std::memcpy(mine.data() + sizeof(double) * 2 * j, v, sizeof(v));
    }
  }
  auto ready = Exchange(kExchangeReady, mine, deadline);
  if (!ready.ok()) return ready.status().WithContext(prefix);
  if (measure) {
    (*ready)[site_] = mine;
    std::vector<std::vector<double>> bw(n, std::vector<double>(n, 0)),
        lat(n, std::vector<double>(n, 0));
    for (int i = 0; i < n; ++i) {
      const std::string& row = (*ready)[i];
      if (row.size() != sizeof(double) * 2 * n)
        return Status::Corruption(fmt::format("{}: {} sent link measurements of {} bytes", prefix,
                                              PeerName(i), row.size()));
      for (int j = 0; j < n; ++j) {
        double v[2];
        std::memcpy(v, row.data() + sizeof(double) * 2 * j, sizeof(v));
        bw[j][i] = i == j ? 0 : QuantizeBandwidth(v[0]);
        lat[i][j] = i == j ? 0 : QuantizeLatency(v[1]);
      }
    }
    ring = ChooseRing(bw, lat);
    std::string desc;
    for (int i = 0; i < n; ++i) {
      const int a = ring[i], b = ring[(i + 1) % n];
      desc += fmt::format("{}{} -> {} {:.0f} Mbit/s {:.1f} ms", i ? ", " : "", a, b,
                          bw[a][b] * 8e-6, lat[a][b] * 1e3);
    }
    LogDebug("wan site {}: ring {}", site_, desc);
  }
  {
    std::lock_guard<std::mutex> lk(mu_);
    ring_ = ring;
    connected_ = true;
  }
  return MakeCommunicator(shared_from_this(), ring);
}

Status WanCore::Reconnect(int peer, const std::string& address) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!connected_)
      return Status::InvalidArgument(
          fmt::format("wan {}: reconnect to site {}: Connect has not succeeded on this endpoint",
                      address_, peer));
  }
  const std::string prefix = fmt::format("site {}: reconnect", site_);
  if (peer < 0 || peer >= n_ || peer == site_)
    return Status::InvalidArgument(
        fmt::format("{}: site {} is {}", prefix, peer,
                    peer == site_ ? "this site" : "not a site of this world"));
  if (address.empty())
    return Status::InvalidArgument(fmt::format("{}: no address for site {}", prefix, peer));
  const double timeout = options_.timeout_s;
  const double deadline = NowSeconds() + timeout;
  {
    std::lock_guard<std::mutex> lk(mu_);
    ++reconnects_[peer];
  }
  cv_.notify_all();  // a new stream of the peer waiting in HandleStream may be accepted now
  {
    std::lock_guard<std::mutex> lk(addr_mu_);
    addresses_[peer] = address;
  }

  // Retire the old link: cancelled at once (chunks still queued are dropped), joined later.
  // Links retired earlier whose threads have ended are joined and freed now.
  std::shared_ptr<Link> l = MakeLink(peer, address), old;
  std::vector<std::shared_ptr<Link>> finished;
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    for (auto it = retired_links_.begin(); it != retired_links_.end();) {
      bool exited;
      {
        std::lock_guard<std::mutex> llk((*it)->mu);
        exited = (*it)->exited;
      }
      if (exited) {
        finished.push_back(std::move(*it));
        it = retired_links_.erase(it);
      } else {
        ++it;
      }
    }
    old = std::exchange(links_[peer], l);
    if (old) retired_links_.push_back(old);
  }
  for (auto& f : finished)
    if (f->thread.joinable()) f->thread.join();
  if (old) {
    std::lock_guard<std::mutex> lk(old->mu);
    if (old->error.empty()) old->error = fmt::format("the link to site {} was replaced", peer);
    old->closing = true;
    if (old->ctx) old->ctx->TryCancel();
    old->cv.notify_all();
  }

  // The handshake. Each call has a nonce; its hello, carrying it, is the first chunk of its new
  // stream (written once the link connects). A hello arriving on the peer's current stream here
  // is answered by a ready echoing its nonce. Done when the peer's current stream carried a hello
  // (answered) and a ready echoing this call's nonce: the peer accepted this call's stream and its
  // stream into this site works. Nonces keep what an earlier call or a failed attempt left on
  // either side (hellos, readies, a stale stream accepted late) from counting.
  static std::atomic<uint64_t> calls{0};
  const std::string nonce = fmt::format("{}-{:08x}{:08x}-{}", site_, std::random_device{}(),
                                        std::random_device{}(), calls.fetch_add(1));
  EnqueueOn(*l, Control(site_, kWanOpInfo, kExchangeRejoin, nonce));
  Link* raw = l.get();
  l->thread = std::thread([this, raw, deadline] { SenderMain(raw, deadline); });
  Status s = l->connected.get_future().get();
  if (!s.ok()) return s.WithContext(prefix);

  uint64_t answered = 0;  // the generation of the peer's stream whose hello was answered (0: none)
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    const Inbox& in = inboxes_[peer];
    if (in.generation != answered && in.infos.count(kExchangeRejoin)) {
      answered = in.generation;
      std::string hello = in.infos.at(kExchangeRejoin);
      lk.unlock();
      EnqueueOn(*l, Control(site_, kWanOpInfo, kExchangeRejoinReady, std::move(hello)));
      lk.lock();
      continue;
    }
    if (in.generation == answered && in.rejoin_readies.count(nonce)) break;
    std::string link_error;
    {
      std::lock_guard<std::mutex> llk(l->mu);
      link_error = l->error;
    }
    const bool late = NowSeconds() >= deadline;
    if (late || !link_error.empty() || shutting_down_) {
      if (shutting_down_) return Status::Unavailable(prefix + ": the endpoint is shutting down");
      const bool hello_seen = answered != 0 && answered == in.generation;
      std::string what = RejoinState(peer, hello_seen);
      if (!link_error.empty())
        what += fmt::format("; this site's new stream to it: {}", link_error);
      const char* missing = hello_seen ? "no confirmation that this site's hello arrived there"
                                       : "no hello on a new stream from it";
      return Status::Unavailable(late ? fmt::format("{}: {}: {} within {} s: {}", prefix,
                                                    PeerName(peer), missing, timeout, what)
                                      : fmt::format("{}: {}: {}", prefix, PeerName(peer), what));
    }
    // Polls the link (its sender thread does not signal cv_).
    cv_.wait_until(lk, AtSeconds(std::min(deadline, NowSeconds() + 0.05)));
  }
  lk.unlock();
  LogDebug("wan site {}: reconnected to {}", site_, PeerName(peer));
  return Status::Ok();
}

void WanCore::Publish(uint64_t index, std::shared_ptr<const std::string> blob) {
  auto snap = std::make_shared<Snapshot>();
  snap->index = index;
  snap->blob = blob ? std::move(blob) : std::make_shared<const std::string>();
  std::lock_guard<std::mutex> lk(snapshot_mu_);
  snapshot_ = std::move(snap);
}

grpc::Status WanCore::HandleFetch(grpc::ServerContext* context, const pb::FetchRequest* request,
                                  grpc::ServerWriter<pb::FetchChunk>* writer) {
  const int64_t from = request->from_site();
  auto refuse = [&](grpc::StatusCode code, const std::string& why) {
    LogWarning("wan {}: refused a snapshot fetch from {} (site {}): {}", address_, context->peer(),
               from, why);
    return grpc::Status(code, why);
  };
  grpc::Status auth = CheckToken(*context, security_);
  if (!auth.ok()) return refuse(auth.error_code(), auth.error_message());
  if (request->version() != kWanProtocolVersion)
    return refuse(grpc::StatusCode::FAILED_PRECONDITION,
                  fmt::format("protocol version {}, this endpoint speaks {}", request->version(),
                              kWanProtocolVersion));
  if (ClaimedSite(*context) != from)
    return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("the request is from site {} but its {} header says otherwise", from,
                              kSiteHeader));
  if (std::string bad = CertificateMismatch(*context, static_cast<int>(from)); !bad.empty())
    return refuse(grpc::StatusCode::PERMISSION_DENIED, bad);
  std::shared_ptr<Snapshot> snap;
  {
    std::lock_guard<std::mutex> lk(snapshot_mu_);
    snap = snapshot_;
  }
  std::string self = fmt::format("wan {}", address_);
  std::optional<LinkEmulator> emu;
  int me = -1;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (configured_) {
      me = site_;
      self = fmt::format("site {}", site_);
      if (from >= n_ || from == site_)
        return refuse(grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("it claims site {}, which is {}", from,
                                  from == site_ ? "this site" : "not a site of this world"));
      // Its own stream of jitter draws, apart from the link's.
      if (profiles_[from])
        emu.emplace(*profiles_[from], options_.seed,
                    (uint64_t{1} << 63) | (uint64_t(site_) << 32) | uint64_t(from));
    }
  }
  if (!snap || snap->index < request->min_index()) {
    return grpc::Status(grpc::StatusCode::NOT_FOUND,
                        snap ? fmt::format("{} has no snapshot with index >= {} (its latest is {})",
                                           self, request->min_index(), snap->index)
                             : fmt::format("{} has published no snapshot", self));
  }
  const std::string& blob = *snap->blob;
  const uint64_t checksum = snap->Checksum();
  const auto hook = FetchHook();
  // The whole snapshot is handed to the emulated link at once; each piece is written at its
  // emulated arrival (pacing by bandwidth, plus latency once), as the link's delay queue would.
  const double t0 = NowSeconds();
  size_t off = 0;
  pb::FetchChunk piece;
  do {
    const size_t n = std::min(kWanSnapshotPieceBytes, blob.size() - off);
    piece.set_index(snap->index);
    piece.set_total(blob.size());
    piece.set_offset(off);
    piece.set_data(blob.data() + off, n);
    piece.set_checksum(checksum);
    if (hook) (*hook)(me, static_cast<int>(from), piece);
    if (emu) {
      const double arrive = emu->Send(t0, n + 64).arrive_s;
      std::unique_lock<std::mutex> lk(mu_);
      if (cv_.wait_until(lk, AtSeconds(arrive), [&] { return shutting_down_; }))
        return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
    }
    if (context->IsCancelled() || !writer->Write(piece))
      return grpc::Status(grpc::StatusCode::CANCELLED, "the fetch was cancelled");
    bytes_sent_ += n;
    off += n;
  } while (off < blob.size());
  LogDebug("wan {}: served snapshot {} ({} bytes) to site {}", self, snap->index, blob.size(),
           from);
  return grpc::Status::OK;
}

// gRPC allocates a fresh buffer for every socket read and frees it once the message is parsed;
// with glibc's default (dynamic) thresholds that memory goes back to the kernel and is
// page-faulted in again for the next read, which costs more than the data's own copies. Fixed
// thresholds keep it in the heap for reuse (buffers up to 32 MiB; up to 128 MiB of free memory
// at the top of a heap). Process-wide, once; ATOLL_WAN_MALLOPT=0 keeps glibc's defaults.
void TuneMallocOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* e = std::getenv("ATOLL_WAN_MALLOPT");
    if (e && std::string(e) == "0") return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
  });
}

Status WanCore::Listen(const std::string& address) {
  TuneMallocOnce();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, ServerCredentials(security_), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // Accept the clients' keepalive pings on idle streams (gRPC's default calls them abuse).
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 10000);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (!server_ || port == 0)
    return Status::Unavailable(fmt::format("wan: cannot listen on {}", address));
  const size_t colon = address.rfind(':');
  address_ = fmt::format("{}:{}", address.substr(0, colon), port);
  return Status::Ok();
}

WanCore::~WanCore() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    shutting_down_ = true;
  }
  cv_.notify_all();
  std::vector<std::shared_ptr<Link>> links;
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    for (auto& l : links_)
      if (l) links.push_back(l);
    links.insert(links.end(), retired_links_.begin(), retired_links_.end());
  }
  for (auto& l : links) {
    std::lock_guard<std::mutex> lk(l->mu);
    l->closing = true;
    l->cv.notify_all();
  }
  // Each stream gets a moment to finish cleanly; then it is cancelled.
  const double grace = NowSeconds() + 2.0;
  for (auto& l : links) {
    if (!l->thread.joinable()) continue;
    {
      std::unique_lock<std::mutex> lk(l->mu);
      if (!l->cv.wait_until(lk, AtSeconds(grace), [&] { return l->exited; }) && l->ctx)
        l->ctx->TryCancel();
    }
    l->thread.join();
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

// ------------------------------------------------------------------------------------------
// The communicator.

// Wraps a handle so that the caller's blocking time counts in the stats.
class TimedWait final : public CommHandle::Pending {
 public:
  TimedWait(std::shared_ptr<WanCore> core, CommHandle inner)
      : core_(std::move(core)), inner_(std::move(inner)) {}
  Status Wait() override {
    const double t0 = NowSeconds();
    Status s = inner_.Wait();
    core_->AddSeconds(NowSeconds() - t0);
    return s;
  }

 private:
  std::shared_ptr<WanCore> core_;
  CommHandle inner_;
};

class SendWait final : public CommHandle::Pending {
 public:
  SendWait(std::shared_ptr<WanCore> core, std::shared_ptr<OpTracker> tracker, int dest,
           std::string prefix)
      : core_(std::move(core)),
        tracker_(std::move(tracker)),
        dest_(dest),
        prefix_(std::move(prefix)) {}
  Status Wait() override {
    Status s = core_->WaitSent(*tracker_, dest_);
    if (!s.ok()) {
      tracker_->Cancel();
      return s.WithContext(prefix_);
    }
    return s;
  }

 private:
  std::shared_ptr<WanCore> core_;
  std::shared_ptr<OpTracker> tracker_;
  int dest_;
  std::string prefix_;
};

class RecvWait final : public CommHandle::Pending {
 public:
  RecvWait(std::shared_ptr<WanCore> core, void* data, size_t count, DType dtype, int source,
           int tag, uint64_t seq, std::string prefix)
      : stage_(core->options().stage_receives),
        core_(std::move(core)),
        data_(static_cast<char*>(data)),
        count_(count),
        dtype_(dtype),
        source_(source),
        tag_(tag),
        seq_(seq),
        prefix_(std::move(prefix)) {}
  Status Wait() override {
    Status s = Receive();
    core_->EraseMessage(source_, static_cast<uint32_t>(tag_), seq_);
    return s.ok() ? s : s.WithContext(prefix_);
  }

 private:
  Status Receive() {
    const size_t es = DTypeSize(dtype_);
    // Verified chunks are kept (stage_) and the caller's buffer written when all have arrived,
    // or each is written as soon as it is verified.
    std::vector<Received> parts;
    size_t got = 0;
    do {
      ATOLL_ASSIGN_OR_RETURN(Received r, core_->PopMessage(source_, uint32_t(tag_), seq_));
      const pb::Chunk& c = *r.chunk;
      std::string bad;
      if (c.op_seq() != seq_)
        bad = fmt::format("op_seq {}, expected message {} on tag {}", c.op_seq(), seq_, tag_);
      else if (c.dtype() != uint32_t(dtype_))
        bad = fmt::format("dtype {}, expected {}", DTypeNameOf(c.dtype()), DTypeName(dtype_));
      else if (c.total() != count_)
        bad = fmt::format("the message has {} elements", c.total());
      else if (c.offset() != got || c.count() > count_ - got)
        bad = fmt::format("elements {}..{}, expected the next from {} of {}", c.offset(),
                          c.offset() + c.count(), got, count_);
      else if (c.payload().size() != c.count() * es)
        bad = fmt::format("a payload of {} bytes for {} elements", c.payload().size(), c.count());
      else if (r.hash != c.checksum())
        bad = fmt::format("checksum mismatch (payload XXH3 {}, the chunk says {})",
                          HashToHex(r.hash), HashToHex(c.checksum()));
      if (!bad.empty())
        return Status::Corruption(
            fmt::format("bad chunk from {}: {}", core_->PeerName(source_), bad));
      got += c.count();
      core_->CountReceived(c.payload().size());
      if (!stage_ && !c.payload().empty()) {
        std::memcpy(data_ + c.offset() * es, c.payload().data(), c.payload().size());
        continue;
      }
      parts.push_back(std::move(r));
    } while (got < count_);
    for (const Received& r : parts)
      if (!r.chunk->payload().empty())
        std::memcpy(data_ + r.chunk->offset() * es, r.chunk->payload().data(),
                    r.chunk->payload().size());
    return Status::Ok();
  }

  const bool stage_;
  std::shared_ptr<WanCore> core_;
  char* data_;
  size_t count_;
  DType dtype_;
  int source_, tag_;
  uint64_t seq_;
  std::string prefix_;
};

class WanCommunicator final : public Communicator {
 public:
  WanCommunicator(std::shared_ptr<WanCore> core, std::vector<int> ring)
      : core_(std::move(core)), rank_(core_->site()), n_(core_->sites()), ring_(std::move(ring)) {
    for (int i = 0; i < n_; ++i)
      if (ring_[i] == rank_) pos_ = i;
    next_ = ring_[(pos_ + 1) % n_];
    prev_ = ring_[(pos_ + n_ - 1) % n_];
    chunk_bytes_ = core_->options().chunk_bytes;
  }
  ~WanCommunicator() override { worker_.reset(); }

  int rank() const override { return rank_; }
  int size() const override { return n_; }
  std::string label() const override { return fmt::format("site {}", rank_); }

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override {
    return Start(CommOp::kAllReduce, count, dtype, -1, count,
                 [=, this](const OpInfo& o) { return RunAllReduce(o, data); });
  }
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Start(CommOp::kReduceScatter, count, dtype, -1, count * n_,
                 [=, this](const OpInfo& o) { return RunReduceScatter(o, send, recv, count); });
  }
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Start(CommOp::kAllGather, count, dtype, -1, count * n_,
                 [=, this](const OpInfo& o) { return RunAllGather(o, send, recv, count); });
  }
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override {
    return Start(CommOp::kBroadcast, count, dtype, root, count,
                 [=, this](const OpInfo& o) { return RunBroadcast(o, data); });
  }
  CommHandle IBarrier() override {
    return Start(CommOp::kBarrier, 0, DType::kByte, -1, 0,
                 [this](const OpInfo& o) { return RunBarrier(o); });
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override;
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override;
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    return Status::InvalidArgument(
        fmt::format("{}: split: the WAN transport has no sub-groups", label()));
  }

 private:
  CommHandle Start(CommOp op, size_t count, DType dtype, int root, size_t total,
                   std::function<Status(const OpInfo&)> run) {
    Status s = CheckArgs(op, count, dtype, root);
    if (!s.ok()) return CommHandle::Done(s);
    if (n_ > 1) {
      // With a site absent, or after a Reconnect, the ring cannot run: fail now, not hang.
      s = core_->CollectivesAllowed();
      if (!s.ok()) return CommHandle::Done(s.WithContext(ErrorPrefix(op, count, dtype, root)));
    }
    core_->CountOp();
    OpInfo o{op, next_seq_++, dtype, total, root, ErrorPrefix(op, count, dtype, root)};
    if (!worker_) worker_ = std::make_unique<CollectiveThread>();
    CommHandle h = worker_->Run(
        [this, o, run = std::move(run)] {
          Status st = run(o);
          if (st.ok()) return st;
          core_->FailOp(o.seq, st.message());
          return st.WithContext(o.prefix);
        },
        0, o.prefix);
    return CommHandle(std::make_unique<TimedWait>(core_, std::move(h)));
  }

  // After a Reconnect with `peer`, point-to-point numbering with it starts again at 1 (as on the
  // other side, whose inbox for this site is fresh).
  void SyncEpoch(int peer) {
    if (peer == rank_) return;
    const uint64_t e = core_->PeerEpoch(peer);
    if (e == epochs_[peer]) return;
    epochs_[peer] = e;
    std::erase_if(send_seq_, [&](const auto& kv) { return kv.first.first == peer; });
    std::erase_if(recv_seq_, [&](const auto& kv) { return kv.first.first == peer; });
  }

  uint8_t* Staging(size_t bytes) {
    if (bytes > staging_cap_) {
      staging_.reset(new uint8_t[bytes]);
      staging_cap_ = bytes;
    }
    return staging_.get();
  }
  size_t ChunkElems(DType t) const { return std::max<size_t>(1, chunk_bytes_ / DTypeSize(t)); }
  // Block b of a buffer of `total` elements split into n_ nearly equal blocks.
  size_t BlockBegin(size_t total, int b) const {
    return size_t(b) * (total / n_) + std::min<size_t>(size_t(b), total % n_);
  }

  // Queues elements off..off+cnt of the operation, read from `src` when written: src must stay
  // unchanged until the tracker's chunks are all written.
  Status SendChunk(const OpInfo& o, int peer, uint32_t step, const uint8_t* src, size_t off,
                   size_t cnt, const std::shared_ptr<OpTracker>& tracker,
                   std::optional<uint64_t> hash = std::nullopt) {
    const size_t bytes = cnt * DTypeSize(o.dtype);
    auto c = std::make_unique<pb::Chunk>();
    c->set_version(kWanProtocolVersion);
    c->set_from_site(uint32_t(rank_));
    c->set_op_seq(o.seq);
    c->set_op(uint32_t(o.op));
    c->set_dtype(uint32_t(o.dtype));
    c->set_offset(off);
    c->set_count(cnt);
    c->set_total(o.total);
    c->set_tag(step);
    c->set_root(o.root < 0 ? 0 : uint32_t(o.root));
    c->set_checksum(hash ? *hash : Hash64(src, bytes));
    OutItem item;
    item.chunk = std::move(c);
    item.src = reinterpret_cast<const char*>(src);
    item.src_bytes = bytes;
    item.tracker = tracker;
    item.data = true;
    std::string err = core_->Enqueue(peer, std::move(item));
    if (!err.empty()) return Status::Unavailable(err);
    return Status::Ok();
  }

  // The next chunk of `o` from `peer`, checked against what this site expects.
  StatusOr<Received> Expect(const OpInfo& o, int peer, uint32_t step, size_t off, size_t cnt) {
    ATOLL_ASSIGN_OR_RETURN(Received r, core_->PopCollective(peer, o.seq, [&] {
      return fmt::format("ring step {}, elements {}..{}", step, off, off + cnt);
    }));
    const pb::Chunk& c = *r.chunk;
    const size_t es = DTypeSize(o.dtype);
    const uint32_t root = o.root < 0 ? 0 : uint32_t(o.root);
    std::string bad;
    if (c.op_seq() != o.seq)
      bad = fmt::format("op_seq {}, expected {} (a chunk of another operation)", c.op_seq(), o.seq);
    else if (c.op() != uint32_t(o.op))
      bad = fmt::format(
          "it is part of {} where this site runs {} (collectives must be called in "
          "the same order on every site)",
          OpName(c.op()), CommOpName(o.op));
    else if (c.dtype() != uint32_t(o.dtype))
      bad = fmt::format("dtype {}, expected {}", DTypeNameOf(c.dtype()), DTypeName(o.dtype));
    else if (c.total() != o.total)
      bad = fmt::format("the operation has {} elements there, {} here", c.total(), o.total);
    else if (c.root() != root)
      bad = fmt::format("root {} there, {} here", c.root(), root);
    else if (c.tag() != step)
      bad = fmt::format("ring step {}, expected {}", c.tag(), step);
    else if (c.offset() > o.total || c.count() > o.total - c.offset())
      bad = fmt::format("elements {}..{} lie outside the buffer of {}", c.offset(),
                        c.offset() + c.count(), o.total);
    else if (c.offset() != off || c.count() != cnt)
      bad = fmt::format("elements {}..{}, expected {}..{}", c.offset(), c.offset() + c.count(), off,
                        off + cnt);
    else if (c.payload().size() != cnt * es)
      bad = fmt::format("a payload of {} bytes for {} elements", c.payload().size(), cnt);
    else if (r.hash != c.checksum())
      bad = fmt::format("checksum mismatch (payload XXH3 {}, the chunk says {})", HashToHex(r.hash),
                        HashToHex(c.checksum()));
    if (!bad.empty())
      return Status::Corruption(fmt::format("bad chunk from {}: {}", core_->PeerName(peer), bad));
    core_->CountReceived(c.payload().size());
    return r;
  }

  // The ring: reduce-scatter steps (rs), then all-gather steps (ag), chunk by chunk, on `buf`
  // in place. Ring position j holds block ring_[j - 1] of the buffer, so that after the
  // reduce-scatter every site holds its own block (rank order), as all-gather starts from.
  Status Ring(const OpInfo& o, uint8_t* buf, bool rs, bool ag,
              const std::shared_ptr<OpTracker>& tracker) {
    const size_t es = DTypeSize(o.dtype), ce = ChunkElems(o.dtype);
    auto segment = [&](int j) {
      const int b = ring_[(((j - 1) % n_) + n_) % n_];
      return std::pair<size_t, size_t>(BlockBegin(o.total, b), BlockBegin(o.total, b + 1));
    };
    const int rs_steps = rs ? n_ - 1 : 0, steps = rs_steps + (ag ? n_ - 1 : 0);
    {
      auto [lo, hi] = segment(rs ? pos_ : pos_ + 1);
      for (size_t off = lo; off < hi; off += ce)
        ATOLL_RETURN_IF_ERROR(
            SendChunk(o, next_, 0, buf + off * es, off, std::min(ce, hi - off), tracker));
    }
    for (int s = 0; s < steps; ++s) {
      const bool reduce = s < rs_steps;
      const int k = reduce ? s : s - rs_steps;
      auto [lo, hi] = segment(reduce ? pos_ - k - 1 : pos_ - k);
      for (size_t off = lo; off < hi; off += ce) {
        const size_t cnt = std::min(ce, hi - off);
        ATOLL_ASSIGN_OR_RETURN(Received r, Expect(o, prev_, uint32_t(s), off, cnt));
        const std::string& p = r.chunk->payload();
        if (reduce)
          Accumulate(o.dtype, buf + off * es, p.data(), cnt);
        else
          std::memcpy(buf + off * es, p.data(), p.size());
        if (s + 1 < steps)
          ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, uint32_t(s + 1), buf + off * es, off, cnt,
                                          tracker,
                                          reduce ? std::nullopt : std::optional<uint64_t>(r.hash)));
      }
    }
    return Status::Ok();
  }

  Status RunAllReduce(const OpInfo& o, void* data) {
    if (n_ == 1 || o.total == 0) return Status::Ok();
    const size_t bytes = o.total * DTypeSize(o.dtype);
    uint8_t* buf = Staging(bytes);
    std::memcpy(buf, data, bytes);
    auto tracker = std::make_shared<OpTracker>();
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, true, true, tracker));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*tracker, next_));
    std::memcpy(data, buf, bytes);
    return Status::Ok();
  }

  Status RunReduceScatter(const OpInfo& o, const void* send, void* recv, size_t count) {
    const size_t es = DTypeSize(o.dtype);
    if (n_ == 1 || count == 0) {
      if (count) std::memcpy(recv, send, count * es);
      return Status::Ok();
    }
    uint8_t* buf = Staging(o.total * es);
    std::memcpy(buf, send, o.total * es);
    auto tracker = std::make_shared<OpTracker>();
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, true, false, tracker));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*tracker, next_));
    std::memcpy(recv, buf + BlockBegin(o.total, rank_) * es, count * es);
    return Status::Ok();
  }

  Status RunAllGather(const OpInfo& o, const void* send, void* recv, size_t count) {
    const size_t es = DTypeSize(o.dtype);
    if (n_ == 1 || count == 0) {
      if (count) std::memcpy(recv, send, count * es);
      return Status::Ok();
    }
    uint8_t* buf = Staging(o.total * es);
    std::memcpy(buf + BlockBegin(o.total, rank_) * es, send, count * es);
    auto tracker = std::make_shared<OpTracker>();
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, false, true, tracker));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*tracker, next_));
    std::memcpy(recv, buf, o.total * es);
    return Status::Ok();
  }

  // Pipelined along the ring from the root: each chunk is forwarded as soon as it arrives.
  Status RunBroadcast(const OpInfo& o, void* data) {
    if (n_ == 1 || o.total == 0) return Status::Ok();
    const size_t es = DTypeSize(o.dtype), ce = ChunkElems(o.dtype);
    int root_pos = 0;
    for (int i = 0; i < n_; ++i)
      if (ring_[i] == o.root) root_pos = i;
    const int d = (pos_ - root_pos + n_) % n_;
    auto tracker = std::make_shared<OpTracker>();
    auto* bytes = static_cast<uint8_t*>(data);
    if (d == 0) {
      for (size_t off = 0; off < o.total; off += ce)
        ATOLL_RETURN_IF_ERROR(
            SendChunk(o, next_, 0, bytes + off * es, off, std::min(ce, o.total - off), tracker));
    } else {
      std::vector<Received> parts;
      for (size_t off = 0; off < o.total; off += ce) {
        const size_t cnt = std::min(ce, o.total - off);
        ATOLL_ASSIGN_OR_RETURN(Received r, Expect(o, prev_, 0, off, cnt));
        if (d < n_ - 1) {  // forwards the received payload itself (kept in parts)
          const std::string& p = r.chunk->payload();
          ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, 0, reinterpret_cast<const uint8_t*>(p.data()),
                                          off, cnt, tracker, r.hash));
        }
        parts.push_back(std::move(r));
      }
      ATOLL_RETURN_IF_ERROR(core_->WaitSent(*tracker, next_));  // parts are read until now
      for (const Received& r : parts)
        std::memcpy(bytes + r.chunk->offset() * es, r.chunk->payload().data(),
                    r.chunk->payload().size());
      return Status::Ok();
    }
    return core_->WaitSent(*tracker, next_);
  }

  // A token around the ring n - 1 times: when a site has seen n - 1 tokens, every site entered.
  Status RunBarrier(const OpInfo& o) {
    if (n_ == 1) return Status::Ok();
    auto tracker = std::make_shared<OpTracker>();
    ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, 0, nullptr, 0, 0, tracker));
    for (int k = 0; k < n_ - 1; ++k) {
      ATOLL_RETURN_IF_ERROR(Expect(o, prev_, uint32_t(k), 0, 0).status());
      if (k + 1 < n_ - 1)
        ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, uint32_t(k + 1), nullptr, 0, 0, tracker));
    }
    return core_->WaitSent(*tracker, next_);
  }

  std::shared_ptr<WanCore> core_;
  const int rank_, n_;
  const std::vector<int> ring_;
  int pos_ = 0, next_ = 0, prev_ = 0;
  size_t chunk_bytes_ = 1 << 20;
  uint64_t next_seq_ = 1;
  std::map<std::pair<int, int>, uint64_t> send_seq_, recv_seq_;  // (peer, tag) -> last message
  std::vector<uint64_t> epochs_ = std::vector<uint64_t>(n_, 0);  // by peer: PeerEpoch seen
  std::unique_ptr<uint8_t[]> staging_;                           // the worker's
  size_t staging_cap_ = 0;
  std::unique_ptr<CollectiveThread> worker_;  // last: joined first
};

CommHandle WanCommunicator::ISend(const void* data, size_t count, DType dtype, int dest, int tag) {
  Status s = CheckArgs(CommOp::kSend, count, dtype, dest, tag);
  if (!s.ok()) return CommHandle::Done(s);
  core_->CountOp();
  const std::string prefix = ErrorPrefix(CommOp::kSend, count, dtype, dest, tag);
  SyncEpoch(dest);
  const uint64_t seq = ++send_seq_[{dest, tag}];
  const size_t es = DTypeSize(dtype), ce = ChunkElems(dtype);
  const char* src = static_cast<const char*>(data);
  auto tracker = std::make_shared<OpTracker>();
  size_t off = 0;
  do {
    const size_t cnt = std::min(ce, count - off);
    auto c = std::make_unique<pb::Chunk>();
    c->set_version(kWanProtocolVersion);
    c->set_from_site(uint32_t(rank_));
    c->set_op_seq(seq);
    c->set_op(uint32_t(CommOp::kSend));
    c->set_dtype(uint32_t(dtype));
    c->set_offset(off);
    c->set_count(cnt);
    c->set_total(count);
    c->set_tag(uint32_t(tag));
    if (dest == rank_) {  // to ourselves: straight into the inbox
      c->set_payload(src + off * es, cnt * es);
      c->set_checksum(Hash64(src + off * es, cnt * es));
      core_->Dispatch(rank_, PooledChunk(c.release(), ChunkReturn{}), NowSeconds());
    } else {
      OutItem item;
      item.chunk = std::move(c);
      if (cnt > 0) {
        item.src = src + off * es;  // read when written, until the send completes
        item.src_bytes = cnt * es;
        item.hash_at_write = true;
      } else {
        item.chunk->set_checksum(Hash64("", 0));
      }
      item.tracker = tracker;
      item.data = true;
      if (std::string err = core_->Enqueue(dest, std::move(item)); !err.empty()) {
        tracker->Cancel();
        tracker->Fail(err);
        break;  // the handle waits for the chunks already queued to be dropped or released
      }
    }
    off += cnt;
  } while (off < count);
  return CommHandle(std::make_unique<TimedWait>(
      core_, CommHandle(std::make_unique<SendWait>(core_, tracker, dest, prefix))));
}

CommHandle WanCommunicator::IRecv(void* data, size_t count, DType dtype, int source, int tag) {
  Status s = CheckArgs(CommOp::kRecv, count, dtype, source, tag);
  if (!s.ok()) return CommHandle::Done(s);
  core_->CountOp();
  SyncEpoch(source);
  const uint64_t seq = ++recv_seq_[{source, tag}];
  return CommHandle(std::make_unique<TimedWait>(
      core_, CommHandle(std::make_unique<RecvWait>(
                 core_, data, count, dtype, source, tag, seq,
                 ErrorPrefix(CommOp::kRecv, count, dtype, source, tag)))));
}

StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(std::shared_ptr<WanCore> core,
                                                         std::vector<int> ring) {
  return std::unique_ptr<Communicator>(new WanCommunicator(std::move(core), std::move(ring)));
}

class WanEndpointImpl final : public WanEndpoint {
 public:
  explicit WanEndpointImpl(std::shared_ptr<WanCore> core) : core_(std::move(core)) {}
  std::string address() const override { return core_->address(); }
  StatusOr<std::unique_ptr<Communicator>> Connect(const WanOptions& options) override {
    return core_->Connect(options);
  }
  Status Reconnect(int site, const std::string& address) override {
    return core_->Reconnect(site, address);
  }
  void Publish(uint64_t index, std::shared_ptr<const std::string> blob) override {
    core_->Publish(index, std::move(blob));
  }
  std::vector<int> ring() const override { return core_->ring(); }
  WanStats stats() const override { return core_->stats(); }

 private:
  std::shared_ptr<WanCore> core_;
};

}  // namespace

void SetWanChunkHookForTesting(WanChunkHook hook) {
  std::lock_guard<std::mutex> lk(g_hook_mu);
  g_hook = hook ? std::make_shared<const WanChunkHook>(std::move(hook)) : nullptr;
  g_hook_set.store(g_hook != nullptr);
}

void SetWanFetchHookForTesting(WanFetchHook hook) {
  std::lock_guard<std::mutex> lk(g_hook_mu);
  g_fetch_hook = hook ? std::make_shared<const WanFetchHook>(std::move(hook)) : nullptr;
}

StatusOr<std::pair<uint64_t, std::string>> FetchSnapshot(const std::string& address,
                                                         const WorldSecurity& security, int site,
                                                         uint64_t min_index, double timeout_s) {
  const std::string prefix = fmt::format("site {}: fetch snapshot from {}", site, address);
  if (address.empty())
    return Status::InvalidArgument(fmt::format("site {}: fetch snapshot: no address", site));
  if (site < 0) return Status::InvalidArgument(fmt::format("{}: bad site {}", prefix, site));
  if (!(timeout_s > 0) || !std::isfinite(timeout_s))
    return Status::InvalidArgument(
        fmt::format("{}: timeout_s {} must be a finite number > 0", prefix, timeout_s));
  auto channel = MakeChannel(address, security, grpc::ChannelArguments(), kMaxMessageBytes);
  auto stub = pb::Transport::NewStub(channel);
  grpc::ClientContext ctx;
  AddToken(&ctx, security);
  ctx.AddMetadata(kSiteHeader, std::to_string(site));
  ctx.set_deadline(AtSecondsSystem(NowSeconds() + timeout_s));
  pb::FetchRequest req;
  req.set_version(kWanProtocolVersion);
  req.set_from_site(static_cast<uint32_t>(site));
  req.set_min_index(min_index);
  auto reader = stub->Fetch(&ctx, req);
  // Every piece must continue the previous one and agree on the snapshot (index, size, checksum).
  pb::FetchChunk piece;
  std::string out, bad;
  bool first = true;
  uint64_t index = 0, total = 0, checksum = 0;
  while (reader->Read(&piece)) {
    if (first) {
      first = false;
      index = piece.index();
      total = piece.total();
      checksum = piece.checksum();
      if (index < min_index)
        bad = fmt::format("it sent snapshot {}, older than the {} asked for", index, min_index);
      else
        out.reserve(std::min<uint64_t>(total, uint64_t{4} << 30));
    } else if (piece.index() != index || piece.total() != total || piece.checksum() != checksum) {
      bad = fmt::format(
          "a piece says snapshot {} of {} bytes (checksum {}), the first said {} of {} ({})",
          piece.index(), piece.total(), HashToHex(piece.checksum()), index, total,
          HashToHex(checksum));
    }
    if (bad.empty() && piece.offset() != out.size())
      bad = fmt::format("a piece at offset {}, expected {}", piece.offset(), out.size());
    if (bad.empty() && piece.data().size() > total - out.size())
      bad = fmt::format("a piece of {} bytes at offset {} runs past the snapshot's {} bytes",
                        piece.data().size(), piece.offset(), total);
    if (!bad.empty()) {
      ctx.TryCancel();
      break;
    }
    out.append(piece.data());
  }
  grpc::Status s = reader->Finish();
  if (!bad.empty()) return Status::Corruption(fmt::format("{}: {}", prefix, bad));
  if (!s.ok()) {
    switch (s.error_code()) {
      case grpc::StatusCode::NOT_FOUND:
        return Status::NotFound(fmt::format("{}: {}", prefix, s.error_message()));
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::FAILED_PRECONDITION:
      case grpc::StatusCode::INVALID_ARGUMENT:
        return Status::Unavailable(
            fmt::format("{}: it refused this site: {}", prefix, s.error_message()));
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        return Status::Unavailable(fmt::format("{}: not done within {} s ({} of {} bytes)", prefix,
                                               timeout_s, out.size(), total));
      default:
        return Status::Unavailable(fmt::format("{}: {}", prefix, s.error_message()));
    }
  }
  if (first) return Status::Corruption(fmt::format("{}: the reply held no piece", prefix));
  if (out.size() != total)
    return Status::Corruption(
        fmt::format("{}: the reply ended after {} of {} bytes", prefix, out.size(), total));
  if (const uint64_t h = Hash64(out.data(), out.size()); h != checksum)
    return Status::Corruption(
        fmt::format("{}: checksum mismatch (XXH3 of the {} bytes received {}, it says {})", prefix,
                    out.size(), HashToHex(h), HashToHex(checksum)));
  return std::pair<uint64_t, std::string>(index, std::move(out));
}

StatusOr<std::unique_ptr<WanEndpoint>> WanEndpoint::Listen(const std::string& address,
                                                           const WorldSecurity& security) {
  auto core = std::make_shared<WanCore>(security);
  ATOLL_RETURN_IF_ERROR(core->Listen(address));
  return std::unique_ptr<WanEndpoint>(new WanEndpointImpl(std::move(core)));
}

std::vector<int> ChooseRing(const std::vector<std::vector<double>>& bandwidth,
                            const std::vector<std::vector<double>>& latency) {
  const int n = static_cast<int>(bandwidth.size());
  if (n == 0) return {};
  auto bw = [&](int i, int j) {
    if (size_t(j) >= bandwidth[i].size()) return 0.0;
    const double v = bandwidth[i][j];
    return std::isnan(v) || v < 0 ? 0.0 : v;
  };
  auto lat = [&](int i, int j) {
    if (size_t(i) >= latency.size() || size_t(j) >= latency[i].size()) return 0.0;
    const double v = latency[i][j];
    return std::isnan(v) ? std::numeric_limits<double>::infinity() : v;
  };
  std::vector<int> ring(n);
  for (int i = 0; i < n; ++i) ring[i] = i;
  if (n <= 2) return ring;
  if (n <= 8) {
    std::vector<int> best = ring;
    double best_bw = -1, best_lat = std::numeric_limits<double>::infinity();
    do {  // permutations of 1..n-1 in lexicographic order: the first of equals wins
      double mn = std::numeric_limits<double>::infinity(), total = 0;
      for (int i = 0; i < n; ++i) {
        const int a = ring[i], b = ring[(i + 1) % n];
        mn = std::min(mn, bw(a, b));
        total += lat(a, b);
      }
      const double tol = 1e-12 * std::max(1.0, std::abs(best_lat));
      if (mn > best_bw || (mn == best_bw && total < best_lat - tol)) {
        best_bw = mn;
        best_lat = total;
        best = ring;
      }
    } while (std::next_permutation(ring.begin() + 1, ring.end()));
    return best;
  }
  // Greedy: from site 0, always to the unvisited site with the fastest link (then the lowest
  // latency, then the lowest index).
  std::vector<bool> used(n, false);
  used[0] = true;
  for (int i = 1; i < n; ++i) {
    const int cur = ring[i - 1];
    int pick = -1;
    for (int j = 0; j < n; ++j) {
      if (used[j]) continue;
      if (pick < 0 || bw(cur, j) > bw(cur, pick) ||
          (bw(cur, j) == bw(cur, pick) && lat(cur, j) < lat(cur, pick)))
        pick = j;
    }
    ring[i] = pick;
    used[pick] = true;
  }
  return ring;
}

}  // namespace atl
