// Taking chunks out of the inboxes (a collective's next chunk, a message's), and why a peer can
// no longer be waited for (absent, lost, poisoned, gone, its link broken).
#include <fmt/format.h>

#include "world/transport/core.h"

namespace atl::transport {

StatusOr<Received> WanCore::PopCollective(int peer, uint64_t seq,
                                          const std::function<std::string()>& waiting_for) {
  const double timeout = options_.timeout_s;
  std::unique_lock<std::mutex> lk(mu_);
  double deadline = NowSeconds() + timeout;
  for (;;) {
    if (auto a = aborts_.find(seq); a != aborts_.end()) return Status::Unavailable(a->second);
    Inbox& in = inboxes_[peer];
    while (!in.collective.empty() && in.collective.front().chunk->op_seq() < seq &&
           failed_ops_.count(in.collective.front().chunk->op_seq())) {
      in.queued -= HeldBytes(*in.collective.front().chunk);
      in.collective.pop_front();  // late chunks of an operation that failed here
    }
    if (!in.collective.empty()) {
      Received r = std::move(in.collective.front());
      in.collective.pop_front();
      in.queued -= HeldBytes(*r.chunk);
      return r;
    }
    // Every site takes part in every collective: one that can no longer (lost, gone, poisoned,
    // its link broken) dooms the operation even while the peer this site waits for is fine (a
    // ring neighbour that finished the previous collective and gave this one up, say).
    for (int p = peer, k = 0; k < n_; p = (p + 1) % n_, ++k) {
      if (p == site_) continue;
      if (std::string why = Unusable(p, /*awaited=*/p == peer); !why.empty()) {
        if (!inboxes_[p].poison.empty()) return Status::Corruption(why);
        return Status::Unavailable(fmt::format("{} (waiting for {})", why, waiting_for()));
      }
    }
    if (cv_.wait_until(lk, SteadyAt(deadline)) == std::cv_status::timeout &&
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
        in.queued -= HeldBytes(*r.chunk);
        return r;
      }
    }
    if (std::string why = Unusable(peer, /*awaited=*/true); !why.empty())
      return in.poison.empty() ? Status::Unavailable(why) : Status::Corruption(why);
    if (cv_.wait_until(lk, SteadyAt(deadline)) == std::cv_status::timeout &&
        NowSeconds() >= deadline) {
      return Status::Unavailable(
          fmt::format("timed out after {} s: no data from {}", timeout, PeerName(peer)));
    }
  }
}

void WanCore::EraseMessage(int peer, uint32_t tag, uint64_t seq, bool failed, uint64_t generation) {
  std::lock_guard<std::mutex> lk(mu_);
  Inbox& in = inboxes_[peer];
  // A receive that failed on a stream replaced since: the new one numbers its messages afresh,
  // so this number means another message there.
  if (failed && in.generation != generation) return;
  auto t = in.p2p.find(tag);
  if (t == in.p2p.end()) {
    if (!failed) return;
    t = in.p2p.emplace(tag, P2pTag{}).first;
  }
  if (auto s = t->second.slots.find(seq); s != t->second.slots.end()) {
    for (const Received& r : s->second) in.queued -= HeldBytes(*r.chunk);
    t->second.slots.erase(s);
  }
  // Not all of it has arrived: what is still to come is dropped on arrival (Dispatch); nothing
  // comes any more from a stream that ended or was refused.
  if (failed && seq >= t->second.next_seq && in.poison.empty() && in.lost.empty() && !in.ended)
    t->second.failed.insert(seq);
}

std::string WanCore::LinkError(int p) const {
  std::shared_ptr<Link> l = LinkTo(p);
  if (!l) return "";
  std::lock_guard<std::mutex> lk(l->mu);
  return l->error;
}

std::string WanCore::Unusable(int p, bool awaited) const {
  const Inbox& in = inboxes_[p];
  if (in.absent) return NotConnected(p);
  if (!in.lost.empty()) return fmt::format("{} is lost: {}", PeerName(p), in.lost);
  if (!in.poison.empty()) return fmt::format("{} is unusable: {}", PeerName(p), in.poison);
  // A peer that closed its stream after doing its part of a collective (it finished, saved,
  // left) dooms only the operations that still wait for it; one whose stream was cancelled (it
  // died, or stopped answering the keepalive) dooms every one: it takes part in each.
  if (in.ended && (awaited || in.cancelled))
    return fmt::format("{} is gone: {}", PeerName(p), in.end_reason);
  if (shutting_down_) return "the endpoint is shutting down";
  // A link that broke (the peer stopped reading: keepalive, a failed write) fails receives from
  // the peer too: whatever it would still send cannot be answered.
  if (std::string e = LinkError(p); !e.empty())
    return fmt::format("the link to {} is broken: {}", PeerName(p), e);
  return "";
}

void WanCore::PeerLost(int peer, const std::string& address, const std::string& why) {
  std::shared_ptr<Link> link;
  // A stream from that address waiting to be accepted is refused now (HandleStream).
  struct Notify {
    std::condition_variable& cv;
    ~Notify() { cv.notify_all(); }
  } notify{cv_};
  {
    // The check and the mark under one lock: a Reconnect (which changes the address under mu_)
    // cannot slip in between and have its new incarnation marked.
    std::lock_guard<std::mutex> lk(mu_);
    // Kept even before Connect: a link to that address then fails at once (DeadAt).
    if (!address.empty()) dead_addresses_.emplace(address, why);
    if (!connected_ || peer < 0 || peer >= n_ || peer == site_) return;
    bool reconnecting;
    {
      // Only the incarnation that died: a new process at another address has a fresh link.
      std::lock_guard<std::mutex> alk(addr_mu_);
      if (!address.empty() && addresses_[size_t(peer)] != address) return;
      reconnecting = !addresses_[size_t(peer)].empty();
    }
    // An absent peer this site is reconnecting to (no stream from it yet) is marked too: the
    // Reconnect waiting for its hello fails at once.
    Inbox& in = inboxes_[size_t(peer)];
    if (!in.lost.empty() || (in.absent && !reconnecting)) return;
    in.lost = why;
    link = LinkTo(peer);  // that incarnation's link, not a later one
  }
  LogInfo("wan site {}: {} is lost ({}): its operations fail", site_, PeerName(peer), why);
  if (link) AbortLinkObject(*link, fmt::format("{} is lost: {}", PeerName(peer), why));
}

void WanCore::PeerAlive(int peer, const std::string& address, int64_t epoch) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    dead_addresses_.erase(address);
    std::lock_guard<std::mutex> alk(addr_mu_);
    if (peer >= 0 && peer != site_ && size_t(peer) < epochs_.size() &&
        epoch > epochs_[size_t(peer)])
      epochs_[size_t(peer)] = epoch;
  }
  cv_.notify_all();  // a stream from that address waiting to be accepted may be now
}

int64_t WanCore::MinEpoch(int peer) const {
  std::lock_guard<std::mutex> alk(addr_mu_);
  // This site's own chunks (sends to itself) never pass the sender thread that stamps them.
  return peer >= 0 && peer != site_ && size_t(peer) < epochs_.size() ? epochs_[size_t(peer)] : 0;
}

std::string WanCore::DeadAt(const std::string& address) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = dead_addresses_.find(address);
  return it == dead_addresses_.end() ? "" : it->second;
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
    for (Inbox& in : inboxes_) {  // its chunks already here: freed now
      std::erase_if(in.collective, [&](const Received& r) {
        if (r.chunk->op_seq() != seq) return false;
        in.queued -= HeldBytes(*r.chunk);
        return true;
      });
    }
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

}  // namespace atl::transport
