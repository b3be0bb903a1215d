// SiteExchange::Average: begin round, reduce-scatter and all-gather of encoded pieces over
// direct sends, commit round, redone over the survivors when a site died meanwhile.
#include "world/exchange.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>

#include "core/hash.h"
#include "core/log.h"
#include "world/live_sites.h"
// No FMA contraction (the error-feedback residual must be exactly what encoding lost, the same
// bits whatever CPU the binary was built for).
#include "core/fp_exact.h"

namespace atl {
namespace {

constexpr int kMaxAttempts = 8;
// A round in which some site's part failed (a receive, a piece that does not decode) while every
// site stayed live is tried once more (a stall or a corrupt chunk may not recur), then given up.
constexpr int kFailedAttemptRetries = 1;
constexpr int kBegin = 0, kCommit = 1;
constexpr int kReduceScatter = 0, kAllGather = 1;

// Unique per (round, attempt, phase) for 2^24 calls, non-negative and below 2^28 (the WAN
// Communicator takes any int tag >= 0).
int Tag(int64_t round, int attempt, int phase) {
  return int(((round % (int64_t(1) << 24)) * kMaxAttempts + attempt) * 2 + phase);
}

// What one attempt found: the sites a receive (or its decoding) failed from, with the reason.
struct Failures {
  std::vector<std::pair<int, std::string>> from;
  void Add(int site, const Status& s) { from.emplace_back(site, s.ToString()); }
};

// An all-gather message that tells the receivers the owner could not reduce its piece (it missed
// a contribution): EncodedBytes long, all zero, so its magic is wrong and Decode refuses it.
bool IsGiveUp(const std::vector<uint8_t>& bytes) {
  return bytes.size() >= 4 && bytes[0] == 0 && bytes[1] == 0 && bytes[2] == 0 && bytes[3] == 0;
}

}  // namespace

SiteExchange::SiteExchange(Communicator* wan, ExchangeOptions options)
    : wan_(wan), options_(std::move(options)), linked_(options_.addresses) {
  linked_.resize(size_t(std::max(options_.sites, 1)));
  linked_join_.assign(linked_.size(), 0);
}

StatusOr<ExchangeResult> SiteExchange::Average(int64_t round, std::span<float> data,
                                               std::span<float> residual, const Digest& digest,
                                               double pace) {
  const double t0 = NowSeconds();
  const int me = options_.site;
  const Codec codec = options_.codec;
  const std::string who = fmt::format("site {}: exchange round {}", me, round);
  if (wan_ == nullptr || !options_.round)
    return Status::InvalidArgument(who + ": no WAN communicator or no round function");
  if (round < 0) return Status::InvalidArgument(who + ": the round must be >= 0");
  if (!residual.empty() && residual.size() != data.size())
    return Status::InvalidArgument(fmt::format("{}: the residual has {} floats, the data {}", who,
                                               residual.size(), data.size()));
  if (wan_->rank() != me)
    return Status::InvalidArgument(
        fmt::format("{}: the WAN communicator's rank is {}", who, wan_->rank()));

  const size_t n = data.size();
  // Restored before a retry and on failure, so a call that fails leaves data and residual as
  // they were.
  std::vector<float> saved_residual(residual.begin(), residual.end());
  auto restore = [&] {
    if (!residual.empty())
      std::copy(saved_residual.begin(), saved_residual.end(), residual.begin());
  };
  auto fail = [&](Status s) {
    restore();
    return s;
  };

  ExchangeResult result;
  std::vector<float> out(n);  // the agreed mean, written into data at commit
  int failed_attempts = 0;    // attempts a site's failed part gave up (not deaths)
  for (int attempt = 0; attempt < kMaxAttempts; ++attempt) {
    result.attempts = attempt + 1;
    const int64_t base = kRoundsPerExchange * round + 2 * attempt;
    const std::string at = fmt::format("{} attempt {}", who, attempt);

    // ---- 1. begin ----
    StatusOr<Membership> begin = options_.round(base + kBegin, std::nullopt);
    if (!begin.ok())
      return fail(begin.status().WithContext(fmt::format("{}: round {}", at, base + kBegin)));
    const std::vector<int> live = begin->LiveInRound(base + kBegin);
    for (int s : live)
      if (s < 0 || s >= wan_->size())
        return fail(Status::InvalidArgument(
            fmt::format("{}: live site {} is not a rank of the WAN communicator (size {})", at, s,
                        wan_->size())));
    const auto self = std::find(live.begin(), live.end(), me);
    if (self == live.end())
      return fail(Status::Unavailable(fmt::format(
          "{}: this site is not live in round {} (live: {})", at, base + kBegin, SiteList(live))));
    if (int(live.size()) < options_.quorum)
      return fail(Status::Unavailable(
          fmt::format("{}: {} live sites ({}) in round {}, fewer than the quorum of {}", at,
                      live.size(), SiteList(live), base + kBegin, options_.quorum)));
    const size_t m = live.size();
    const size_t my = size_t(self - live.begin());
    const Piece mine = PieceOf(n, m, my);
    Failures failed;
    if (options_.reconnect) {
      for (int s : live) {
        if (s == me || size_t(s) >= linked_.size() || size_t(s) >= begin->sites.size()) continue;
        const std::string& now = begin->sites[size_t(s)].wan_address;
        const int64_t joined = begin->sites[size_t(s)].join_round;
        // A new process: at a new address, or where a dead one listened (a fixed --wan-listen)
        // but registered for another round.
        if (now.empty() || (now == linked_[size_t(s)] && joined == linked_join_[size_t(s)]))
          continue;
        LogInfo("{}: reconnecting to site {} at {} (a new process or link)", at, s, now);
        if (Status r = options_.reconnect(s, now); !r.ok()) {
          failed.Add(s, r);  // its receives fail too: see commit
          continue;
        }
        linked_[size_t(s)] = now;
        linked_join_[size_t(s)] = joined;
      }
    }

    // ---- 2. reduce-scatter ----
    {
      const int tag = Tag(round, attempt, kReduceScatter);
      const size_t in_bytes = EncodedBytes(codec, mine.size);
      std::vector<std::vector<uint8_t>> enc(m), in(m);
      std::vector<CommHandle> recvs(m), sends;
      for (size_t j = 0; j < m; ++j) {
        if (j == my) continue;
        in[j].resize(in_bytes);
        recvs[j] = wan_->IRecv(in[j].data(), in_bytes, DType::kByte, live[j], tag);
      }
      // Encode and send each peer's piece as soon as it is ready, starting with the next site
      // after this one so that the sites do not all start on the same peer.
      for (size_t step = 1; step <= m; ++step) {
        const size_t k = (my + step) % m;
        const Piece p = PieceOf(n, m, k);
        Encode(codec, std::span<const float>(data.data() + p.begin, p.size), &enc[k],
               residual.empty() ? std::span<float>() : residual.subspan(p.begin, p.size));
        if (k == my) continue;
        result.bytes_sent += enc[k].size();
        sends.push_back(wan_->ISend(enc[k].data(), enc[k].size(), DType::kByte, live[k], tag));
      }
      // Sum in the order of the live sites, in float32 (0 + d_0 + d_1 + ...), then * (1/m).
      std::vector<float> acc(mine.size, 0.0f);
      for (size_t j = 0; j < m; ++j) {
        const std::vector<uint8_t>& bytes = j == my ? enc[my] : in[j];
        if (j != my) {
          Status s = recvs[j].Wait();
          if (!s.ok()) {
            failed.Add(live[j], s);
            continue;
          }
        }
        if (failed.from.empty()) {
          Status s = DecodeAdd(bytes, 1.0f, acc);
          if (!s.ok())
            failed.Add(live[j],
                       s.WithContext(fmt::format("{}: the piece from site {}", at, live[j])));
        }
      }
      for (CommHandle& h : sends) {
        Status s = h.Wait();
        if (!s.ok()) LogDebug("{}: {}", at, s.ToString());  // the receiver reports it
      }
      const float inv = 1.0f / float(m);
      for (float& v : acc) v *= inv;

      // ---- 3. all-gather ----
      const int ag_tag = Tag(round, attempt, kAllGather);
      std::vector<uint8_t> avg;
      if (failed.from.empty()) {
        Encode(codec, acc, &avg);
      } else {
        avg.assign(EncodedBytes(codec, mine.size), 0);  // a give-up message (IsGiveUp)
      }
      std::vector<CommHandle> ag_recvs(m), ag_sends;
      std::vector<std::vector<uint8_t>> ag_in(m);
      for (size_t j = 0; j < m; ++j) {
        if (j == my) continue;
        ag_in[j].resize(EncodedBytes(codec, PieceOf(n, m, j).size));
        ag_recvs[j] = wan_->IRecv(ag_in[j].data(), ag_in[j].size(), DType::kByte, live[j], ag_tag);
      }
      for (size_t step = 1; step < m; ++step) {
        const size_t k = (my + step) % m;
        result.bytes_sent += avg.size();
        ag_sends.push_back(wan_->ISend(avg.data(), avg.size(), DType::kByte, live[k], ag_tag));
      }
      if (failed.from.empty()) {
        Status s = Decode(avg, std::span<float>(out.data() + mine.begin, mine.size));
        if (!s.ok()) failed.Add(me, s.WithContext(at + ": decoding this site's own piece"));
        // Error feedback for the all-gather: the owner keeps what encoding the average lost
        // (times m: the next average divides its contribution by m) and sends it next round.
        if (s.ok() && !residual.empty())
          for (size_t i = 0; i < mine.size; ++i)
            residual[mine.begin + i] += float(m) * (acc[i] - out[mine.begin + i]);
      }
      for (size_t j = 0; j < m; ++j) {
        if (j == my) continue;
        Status s = ag_recvs[j].Wait();
        if (s.ok() && IsGiveUp(ag_in[j]))
          s = Status::Unavailable(fmt::format(
              "site {} could not average its piece (it missed a contribution)", live[j]));
        if (s.ok()) {
          const Piece p = PieceOf(n, m, j);
          s = Decode(ag_in[j], std::span<float>(out.data() + p.begin, p.size));
        }
        if (!s.ok()) failed.Add(live[j], s);
      }
      for (CommHandle& h : ag_sends) {
        Status s = h.Wait();
        if (!s.ok()) LogDebug("{}: {}", at, s.ToString());
      }
    }

    // ---- 4. commit ----
    // The vote: whether this site's part failed, and a digest of what it would commit.
    RoundVote vote;
    vote.failed = !failed.from.empty();
    vote.seconds = pace;
    if (!vote.failed)
      vote.digest = digest ? digest(out) : Hash64(out.data(), out.size() * sizeof(float));
    StatusOr<Membership> commit = options_.round(base + kCommit, vote);
    if (!commit.ok())
      return fail(commit.status().WithContext(fmt::format("{}: round {}", at, base + kCommit)));
    const std::vector<int> now = commit->LiveInRound(base + kCommit);
    std::vector<int> lost;
    for (int s : live)
      if (!std::binary_search(now.begin(), now.end(), s)) lost.push_back(s);
    if (!lost.empty()) {
      if (std::find(lost.begin(), lost.end(), me) != lost.end())
        return fail(
            Status::Unavailable(fmt::format("{}: this site is not live in round {} (live: {})", at,
                                            base + kCommit, SiteList(now))));
      LogInfo("{}: site(s) {} died during the exchange; redoing it over the survivors", at,
              SiteList(lost));
      restore();
      continue;
    }
    // Every site of the round sees the same votes, so all of them decide alike: commit only when
    // every one succeeded and they all hold the same result.
    std::vector<int> failed_sites;
    std::map<uint64_t, std::vector<int>> by_digest;
    for (int s : live) {
      auto v = commit->votes.find(s);
      if (v == commit->votes.end() || v->second.failed)
        failed_sites.push_back(s);
      else
        by_digest[v->second.digest].push_back(s);
    }
    if (!failed_sites.empty()) {
      std::string why;
      for (const auto& f : failed.from) why += fmt::format("; {}", f.second);
      const std::string msg = fmt::format(
          "{}: site(s) {} could not do their part (this site's receives: {}), so no site "
          "commits{}",
          at, SiteList(failed_sites), failed.from.empty() ? "all succeeded" : "failed", why);
      if (failed_attempts++ < kFailedAttemptRetries) {
        LogWarning("{}; trying the exchange once more", msg);
        restore();
        continue;
      }
      return fail(Status::Unavailable(msg));
    }
    if (by_digest.size() > 1) {
      std::string groups;
      for (const auto& [d, sites] : by_digest)
        groups += fmt::format("{}site(s) {}: {}", groups.empty() ? "" : ", ", SiteList(sites),
                              HashToHex(d));
      return fail(Status::Corruption(fmt::format(
          "{}: the sites disagree on the result ({}): nothing is committed; the sites' arithmetic "
          "or memory differs (a different build or CPU, or silent data corruption)",
          at, groups)));
    }
    std::copy(out.begin(), out.end(), data.begin());
    result.sites = live;
    result.paces.assign(size_t(std::max(options_.sites, 1)), 0.0);
    for (int s : live)
      if (s < int(result.paces.size())) result.paces[size_t(s)] = commit->votes.at(s).seconds;
    result.seconds = NowSeconds() - t0;
    return result;
  }
  return fail(Status::Unavailable(
      fmt::format("{}: sites kept dying; gave up after {} attempts", who, kMaxAttempts)));
}

}  // namespace atl
