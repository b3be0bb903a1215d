// The links: connecting to a peer, the delay queue of emulated arrivals, the sender thread that
// writes each chunk at its time, waiting for an operation's chunks to be written, and cancelling
// what a failed operation left queued.
#include <fmt/format.h>

#include <cstring>

#include "core/hash.h"
#include "world/transport/chunk.h"
#include "world/transport/core.h"

namespace atl::transport {

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
  auto c = NewChunk({.from_site = site, .op = op, .op_seq = op_seq, .tag = tag});
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
      if (!l->error.empty()) return Status::Unavailable(l->error);  // PeerLost aborted it
    }
    // Declared dead before this link was installed (PeerLost aborted the one before it).
    if (std::string dead = DeadAt(l->address); !dead.empty())
      return Status::Unavailable(fmt::format("{} is lost: {}", PeerName(l->peer), dead));
    const double now = NowSeconds();
    if (now >= deadline) {
      return Status::Unavailable(fmt::format("{} did not answer within {} s (last: {})",
                                             PeerName(l->peer), options_.timeout_s, last));
    }
    if (fresh) {
      // A fresh channel for each failed attempt: gRPC's reconnect backoff of a failed channel
      // grows to minutes; a peer that starts late should be found within ~100 ms.
      grpc::ChannelArguments args;
      // Keepalive finds a silently dead peer within keepalive_s and keeps middleboxes from
      // dropping idle WAN connections.
      for (const auto& [name, value] : KeepaliveArgs(options_.keepalive_s, /*server=*/false))
        args.SetInt(name, value);
      l->channel = MakeChannel(l->address, security_, SiteParty(l->peer), args, kMaxMessageBytes);
      l->stub = pb::Transport::NewStub(l->channel);
      fresh = false;
    }
    grpc::ClientContext ctx;
    AddToken(&ctx, security_);
    ctx.set_deadline(ToSystemClock(SteadyAt(std::min(deadline, now + 2.0))));
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
      // An attempt cut short by the deadline says nothing new: keep why the ones before failed
      // (a TLS peer-name mismatch must not read as a slow peer).
      if (s.error_code() != grpc::StatusCode::DEADLINE_EXCEEDED || last == "no answer")
        last = s.error_message();
      fresh = true;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, 0.2);
  }
  auto ctx = std::make_unique<grpc::ClientContext>();
  AddToken(ctx.get(), security_);
  ctx->AddMetadata(kSiteHeader, std::to_string(site_));
  {
    std::lock_guard<std::mutex> alk(addr_mu_);
    const std::string& self = addresses_[size_t(site_)];
    ctx->AddMetadata(kAddressHeader, self.empty() ? address_ : self);
  }
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
  c.set_epoch(own_epoch_.load(std::memory_order_relaxed));
  std::unique_lock<std::mutex> guard;
  if (item.src && item.tracker) {
    // The operation's memory (the caller's buffer, the staging buffer, a received chunk):
    // readable only while the operation has not been cancelled, and only under its lock, so
    // that Cancel waits for a copy in progress.
    guard = std::unique_lock<std::mutex>(item.tracker->mu);
    if (item.tracker->cancelled) {
      guard.unlock();
      item.tracker->Done("");
      return "";
    }
    if (item.hash_at_write) c.set_checksum(Hash64(item.src, item.src_bytes));
  }
  if (item.data) {
    // Fault injection: the payload is changed before its checksum is taken, so the checksum
    // covers the changed bytes and the receiver accepts them.
    if (auto fault = PayloadFault()) {
      if (item.src) c.set_payload(item.src, item.src_bytes);
      item.src = nullptr;
      (*fault)(l->peer, c.op(), c.mutable_payload());
      c.set_checksum(Hash64(c.payload().data(), c.payload().size()));
    }
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
      l->cv.wait_until(lk, SteadyAt(l->queue.front().arrive_s),
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
  const bool broken = !l->error.empty();
  lk.unlock();
  if (broken) NotifyWaiters();  // receives from the peer fail too
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

Status WanCore::WaitSent(OpTracker& t, int peer) {
  const double timeout = options_.timeout_s;
  std::unique_lock<std::mutex> lk(t.mu);
  int last = t.pending;
  double deadline = NowSeconds() + timeout;
  while (t.pending > 0) {
    if (!t.error.empty()) break;  // the caller cancels what is still queued
    t.cv.wait_until(lk, SteadyAt(deadline));
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
      return Status::Unavailable(why);
    }
  }
  if (!t.error.empty()) return Status::Unavailable(t.error);
  return Status::Ok();
}

void WanCore::Cancel(const std::shared_ptr<OpTracker>& t) {
  {
    std::lock_guard<std::mutex> lk(t->mu);  // waits for a payload being copied right now
    t->cancelled = true;
    if (t->pending == 0) return;
  }
  std::vector<std::shared_ptr<Link>> links;
  {
    std::lock_guard<std::mutex> lk(links_mu_);
    for (const auto& l : links_)
      if (l) links.push_back(l);
    links.insert(links.end(), retired_links_.begin(), retired_links_.end());
  }
  for (const auto& l : links) {
    std::deque<OutItem> dropped;
    {
      std::lock_guard<std::mutex> lk(l->mu);
      for (auto it = l->queue.begin(); it != l->queue.end();) {
        if (it->tracker == t) {
          dropped.push_back(std::move(*it));
          it = l->queue.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (auto& item : dropped) item.tracker->Done("");
  }
}

void WanCore::AbortLink(int peer, const std::string& why) {
  if (std::shared_ptr<Link> l = LinkTo(peer)) AbortLinkObject(*l, why);
}

void WanCore::AbortLinkObject(Link& l, const std::string& why) {
  {
    std::lock_guard<std::mutex> lk(l.mu);
    if (l.error.empty()) l.error = why;
    if (l.ctx) l.ctx->TryCancel();
    l.cv.notify_all();
  }
  NotifyWaiters();
}

}  // namespace atl::transport
