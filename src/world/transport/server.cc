// The server side of an endpoint: the gRPC service, accepting a peer's stream, filing its chunks
// in the peer's inbox (or poisoning the stream), and starting and stopping the server.
#include <fmt/format.h>
#include <malloc.h>

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include "core/hash.h"
#include "world/transport/core.h"

namespace atl::transport {

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

// With TLS: the client certificate must name the site the call claims ("site-N"); a certificate
// of another site, of the coordinator, or of an older `atoll certs` (CN "atoll", no party) does
// not.
std::string CertificateMismatch(const grpc::ServerContext& ctx, const WorldSecurity& security,
                                int claimed) {
  if (security.insecure) return "";
  const std::string named = CallerParty(ctx);
  if (named == SiteParty(claimed)) return "";
  return fmt::format("its certificate is for \"{}\" but it claims site {}", named, claimed);
}

grpc::Status WanCore::HandlePing(grpc::ServerContext* context, const pb::Probe* request,
                                 pb::Probe* reply) {
  grpc::Status auth = CheckToken(*context, security_);
  if (!auth.ok()) {
    LogWarning("wan {}: refused a ping from {}: {}", address_, context->peer(),
               auth.error_message());
    return auth;
  }
  const int claimed = int(std::min<uint32_t>(request->from_site(), 1u << 30));
  if (std::string bad = CertificateMismatch(*context, security_, claimed); !bad.empty()) {
    LogWarning("wan {}: refused a ping from {}: {}", address_, context->peer(), bad);
    return grpc::Status(grpc::StatusCode::PERMISSION_DENIED, bad);
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
  if (std::string bad = CertificateMismatch(*context, security_, claimed); !bad.empty()) {
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
      // And from the address this site knows for that site: another is a stale incarnation
      // (or one this site has not reconnected to yet: wait for that).
      auto md = context->client_metadata().find(kAddressHeader);
      const std::string declared = md == context->client_metadata().end()
                                       ? ""
                                       : std::string(md->second.data(), md->second.size());
      auto known = [&] {
        std::lock_guard<std::mutex> alk(addr_mu_);
        return addresses_[size_t(claimed)];
      };
      // An address declared dead (PeerLost: the coordinator's verdict on that process) that is
      // not the one this site knows for the site now is refused at once; one that is (a new
      // process at the dead one's fixed address, before PeerAlive lifts the verdict) waits.
      auto is_dead = [&] { return !declared.empty() && dead_addresses_.count(declared) > 0; };
      auto dead = [&] { return is_dead() && declared != known(); };
      auto acceptable = [&] {
        const Inbox& in = inboxes_[claimed];
        const std::string at = known();
        return ((!in.connected && !in.absent) || in.ended ||
                reconnects_[claimed] > in.reconnects_at_accept) &&
               (at.empty() || declared == at) && !is_dead();
      };
      cv_.wait_until(lk, SteadyAt(NowSeconds() + options_.timeout_s),
                     [&] { return shutting_down_ || acceptable() || dead(); });
      if (shutting_down_) return grpc::Status(grpc::StatusCode::CANCELLED, "shutting down");
      if (dead()) {
        bad = fmt::format("a stream claiming site {} from {}, a process of it declared dead ({})",
                          claimed, declared, dead_addresses_.at(declared));
      } else if (!acceptable() && !known().empty() && declared != known()) {
        bad = fmt::format(
            "a stream claiming site {} from {}, but site {} is at {} now (a stale incarnation of "
            "it, or one this site never reconnected to within {} s)",
            claimed, declared.empty() ? "no address" : declared, claimed, known(),
            options_.timeout_s);
      } else if (!acceptable()) {
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
      in.cancelled = context->IsCancelled();
      in.end_reason = in.cancelled ? "its stream was cancelled" : "it closed its stream";
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
  if (std::string why = CheckChunkOrigin(*chunk, from, MinEpoch(from)); !why.empty()) {
    Poison(from, why, generation);
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
  std::string refused;  // why this chunk makes the peer unusable (logged after the lock)
  {
    std::lock_guard<std::mutex> lk(mu_);
    Inbox& in = inboxes_[from];
    if (generation != 0 && in.generation != generation) return;  // late, of a replaced stream
    if (!in.poison.empty()) return;  // refused already: nothing it sends is kept
    // A late chunk of what failed here (a collective, or a message whose receive failed) is
    // dropped before it is screened or counted.
    if (IsCollectiveOp(op) && failed_ops_.count(chunk->op_seq()) > 0) return;
    if (op == uint32_t(CommOp::kSend)) {
      auto t = in.p2p.find(chunk->tag());
      if (t != in.p2p.end() && t->second.failed.count(t->second.next_seq) > 0) {
        if (EndsMessage(*chunk)) {
          t->second.failed.erase(t->second.next_seq);
          ++t->second.next_seq;
        }
        return;
      }
    }
    // What a peer can make this site hold is bounded (ScreenChunk).
    const uint64_t bytes = HeldBytes(*chunk);
    refused = ScreenChunk(*chunk,
                          {in.queued, in.rejoin_readies.size(), in.pongs.size(),
                           in.probe_arrivals.size(), aborts_.size()},
                          options_.max_queued_bytes);
    if (!refused.empty()) {
      in.poison = refused;
    } else if (IsCollectiveOp(op)) {
      in.queued += bytes;
      in.collective.push_back({std::move(chunk), hash});
    } else if (op == uint32_t(CommOp::kSend)) {
      P2pTag& t = in.p2p[chunk->tag()];
      // A message's chunks are consecutive on the stream; the last one ends it. Whether the
      // chunk really belongs to that message (op_seq, offsets) is checked by the receive.
      const bool last = EndsMessage(*chunk);
      in.queued += bytes;
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
    } else {  // kWanOpAbort: ScreenChunk refused every other op
      aborts_.emplace(chunk->op_seq(),
                      fmt::format("site {} gave it up: {}", from, std::string(chunk->payload())));
    }
  }
  if (!refused.empty())
    LogWarning("wan site {}: {}: {}; every later operation with it fails", site_, PeerName(from),
               refused);
  cv_.notify_all();
}

// gRPC allocates a fresh buffer for every socket read and frees it once the message is parsed;
// with glibc's default (dynamic) thresholds that memory goes back to the kernel and is
// page-faulted in again for the next read, which costs more than the data's own copies. Fixed
// thresholds keep it in the heap for reuse (buffers up to 32 MiB; up to 128 MiB of free memory
// at the top of a heap). Every heap (arena) keeps that much, and glibc gives each contending
// thread a new arena up to 8 per core, so gRPC's many threads made a site's resident memory
// swing between 3.2 and 3.7 GB (4 sites of configs/small.toml on 2 cores, an exchange every
// step); two arenas (from Listen on) hold it at 1.5 GB at the same speed. Process-wide, once;
// ATOLL_WAN_MALLOPT=0 keeps glibc's defaults.
void TuneMallocOnce() {
  static std::once_flag once;
  std::call_once(once, [] {
    const char* e = std::getenv("ATOLL_WAN_MALLOPT");
    if (e && std::string(e) == "0") return;
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 128 << 20);
    mallopt(M_ARENA_MAX, 2);
  });
}

Status WanCore::Listen(const std::string& address, double keepalive_s) {
  TuneMallocOnce();
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(address, ServerCredentials(security_), &port);
  builder.SetMaxReceiveMessageSize(kMaxMessageBytes);
  builder.SetMaxSendMessageSize(kMaxMessageBytes);
  // A second endpoint on this address must fail, not share it: with SO_REUSEPORT the kernel would
  // hand each peer's connection to one of the two at random.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // The server pings every peer's stream too: a peer that stops answering (SIGSTOP, power loss, a
  // partition) has its stream closed within keepalive_s, which fails the operations waiting for
  // it.
  for (const auto& [name, value] : KeepaliveArgs(keepalive_s, /*server=*/true))
    builder.AddChannelArgument(name, value);
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
      if (!l->cv.wait_until(lk, SteadyAt(grace), [&] { return l->exited; }) && l->ctx)
        l->ctx->TryCancel();
    }
    l->thread.join();
  }
  if (server_) {
    server_->Shutdown(std::chrono::system_clock::now());
    server_->Wait();
  }
}

}  // namespace atl::transport
