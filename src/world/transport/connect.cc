// Connect: every stream opened and checked both ways, the links measured, the ring chosen.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "world/transport/core.h"

namespace atl::transport {

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
    if (cv_.wait_until(lk, SteadyAt(deadline)) == std::cv_status::timeout &&
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
    if (!cv_.wait_until(lk, SteadyAt(deadline), [&] { return shutting_down_ || all(pred); }))
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
  if (!(o.keepalive_s > 0) || !std::isfinite(o.keepalive_s))
    return bad(fmt::format("keepalive_s {} must be a finite number > 0", o.keepalive_s));
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
      for (int p = 0; p < n; ++p) epochs_.push_back(p == site_ ? 0 : o.peers[p].epoch);
      if (o.peers[site_].epoch > 0) own_epoch_.store(o.peers[site_].epoch);
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

}  // namespace atl::transport

namespace atl {

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
