// Reconnect: a fresh link with a peer that rejoined (a new process) or whose link was replaced.
#include <fmt/format.h>

#include <random>

#include "world/transport/core.h"

namespace atl::transport {

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
    // The new address first, under mu_ too: PeerLost of the old incarnation (checked under mu_)
    // then never marks the new incarnation's inbox, which exists from the next line on.
    std::lock_guard<std::mutex> lk(mu_);
    if (auto dead = dead_addresses_.find(address); dead != dead_addresses_.end())
      return Status::Unavailable(
          fmt::format("{}: site {} at {} is lost: {}", prefix, peer, address, dead->second));
    {
      std::lock_guard<std::mutex> alk(addr_mu_);
      // A verdict on the old incarnation does not hold for the one this call is for (the caller
      // learnt of it from a later membership; its inbox is replaced when its stream is accepted,
      // and until then nothing but this call waits for it).
      inboxes_[peer].lost.clear();
      addresses_[peer] = address;
    }
    ++reconnects_[peer];
  }
  cv_.notify_all();  // a new stream of the peer waiting in HandleStream may be accepted now

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
    if (!in.lost.empty())  // the coordinator declared this incarnation dead (PeerLost)
      return Status::Unavailable(
          fmt::format("{}: {} is lost: {}", prefix, PeerName(peer), in.lost));
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
    cv_.wait_until(lk, SteadyAt(std::min(deadline, NowSeconds() + 0.05)));
  }
  lk.unlock();
  LogDebug("wan site {}: reconnected to {}", site_, PeerName(peer));
  return Status::Ok();
}

}  // namespace atl::transport
