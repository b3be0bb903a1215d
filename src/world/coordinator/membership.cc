#include "world/coordinator/membership.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>

#include "core/hash.h"
#include "core/json_int.h"

namespace atl {

namespace {

using Json = nlohmann::json;

constexpr size_t kKeptRounds = 64;
constexpr int64_t kMaxLogCounter = int64_t{1} << 62;

uint64_t FromHex(const Json& j, const char* key) {
  uint64_t v = 0;
  if (!HexToHash(j.at(key).get<std::string>(), &v))
    throw std::runtime_error(fmt::format("{} is not 16 hex digits", key));
  return v;
}

}  // namespace

int Membership::live() const {
  int n = 0;
  for (const auto& s : sites) n += s.alive ? 1 : 0;
  return n;
}

std::vector<int> Membership::LiveInRound(int64_t r) const {
  std::vector<int> live;
  for (const SiteInfo& s : sites)
    if (s.alive && s.join_round <= r) live.push_back(s.site);
  std::sort(live.begin(), live.end());
  live.erase(std::unique(live.begin(), live.end()), live.end());
  return live;
}

std::vector<SiteInfo> Membership::Dead(int except) const {
  std::vector<SiteInfo> out;
  for (const auto& s : sites)
    if (!s.alive && !s.left && s.site != except && !s.wan_address.empty()) out.push_back(s);
  return out;
}

MembershipState::MembershipState(int sites, double heartbeat_s, int dead_after_beats)
    : heartbeat_s_(heartbeat_s), dead_after_beats_(dead_after_beats), sites_(size_t(sites)) {}

Json MembershipState::StartRecord() const {
  return {{"t", "start"}, {"sites", sites()}, {"version", kCoordinatorProtocolVersion}};
}

Json MembershipState::RestartRecord() const { return {{"t", "restart"}, {"epoch", epoch_}}; }

Status MembershipState::Apply(const Json& j) {
  const std::string t = j.value("t", "");
  auto bad = [&](const std::string& what) {
    return Status::Corruption(fmt::format("{} record: {}", t, what));
  };
  try {
    if (t == "start") {
      const int n = JsonIntAt<int>(j, "sites");
      if (n != sites())
        return Status::InvalidArgument(fmt::format(
            "the log belongs to a world of {} sites, not {}: use another --state directory or "
            "the same --sites",
            n, sites()));
      return Status::Ok();
    }
    if (t == "restart") return Status::Ok();
    // Epochs and rounds stay far from int64's end: the state adds 1 to them.
    auto bounded = [&](const char* key, int64_t lo) {
      const int64_t v = JsonIntAt<int64_t>(j, key);
      if (v < lo || v > kMaxLogCounter)
        throw std::runtime_error(fmt::format("{} {} out of range", key, v));
      return v;
    };
    const int64_t record_epoch = bounded("epoch", 0);
    epoch_ = std::max(epoch_, record_epoch);
    if (t == "quorum") {
      quorum_ = true;
      return Status::Ok();
    }
    if (t == "round") {
      const int64_t r = bounded("round", 0);
      if (!j.at("live").is_array()) return bad("live is not a list");
      for (const Json& x : j.at("live")) {
        const int s = JsonInt<int>(x);
        if (s < 0 || s >= sites()) return bad(fmt::format("site {} out of range", s));
        Site& rec = sites_[size_t(s)];
        if (rec.state == State::kAlive) rec.last_round = std::max(rec.last_round, r);
      }
      completed_round_ = std::max(completed_round_, r);
      Membership m = Current();
      if (j.contains("votes")) {
        for (const Json& v : j.at("votes")) {
          const int s = JsonIntAt<int>(v, "site");
          if (s < 0 || s >= sites()) return bad(fmt::format("a vote of site {} out of range", s));
          m.votes[s] =
              RoundVote{v.at("failed").get<bool>(), FromHex(v, "digest"), v.value("seconds", 0.0)};
        }
      }
      rounds_[r] = std::move(m);
      while (rounds_.size() > kKeptRounds) rounds_.erase(rounds_.begin());
      return Status::Ok();
    }
    const int s = JsonIntAt<int>(j, "site");
    if (s < 0 || s >= sites()) return bad(fmt::format("site {} out of range", s));
    Site& rec = sites_[size_t(s)];
    if (t == "register") {
      rec.state = State::kAlive;
      rec.registered_epoch = record_epoch;
      rec.incarnation = FromHex(j, "incarnation");
      rec.wan_address = j.at("wan").get<std::string>();
      rec.join_round = j.contains("join_round") ? bounded("join_round", 0) : 0;
      rec.last_round = rec.join_round - 1;
      rec.vote_round = -1;
      if (!have_hash_) {
        have_hash_ = true;
        config_hash_ = FromHex(j, "config_hash");
        hash_site_ = s;
      }
      return Status::Ok();
    }
    if (t == "death") {
      rec.state = State::kDead;
      return Status::Ok();
    }
    if (t == "leave") {
      rec.state = State::kLeft;
      return Status::Ok();
    }
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  return Status::Corruption(fmt::format("unknown record type '{}'", t));
}

Verdict MembershipState::OutOfRange(int site) const {
  if (site >= 0 && site < sites()) return Verdict::Ok();
  return {Refusal::kBadRequest, fmt::format("site {} is out of range (0..{})", site, sites() - 1)};
}

Verdict MembershipState::PlanRegister(const Registration& r, Json* record) const {
  *record = nullptr;
  const int s = r.site;
  if (Verdict v = OutOfRange(s); !v.ok()) return v;
  if (have_hash_ && r.config_hash != config_hash_)
    return {Refusal::kOtherConfig,
            fmt::format("site {}: config hash {} differs from {} registered by site {}: every "
                        "site must train the same model config",
                        s, HashToHex(r.config_hash), HashToHex(config_hash_), hash_site_)};
  const Site& rec = sites_[size_t(s)];
  if (rec.state == State::kAlive && rec.incarnation != r.incarnation)
    return {Refusal::kTaken,
            fmt::format("site {} is already registered by another live process (WAN address "
                        "{}); two processes claim the same site? (a site that died is declared "
                        "dead after {:.1f} s without heartbeats)",
                        s, rec.wan_address, dead_after_s())};
  // A retried Register of this very process: nothing to change.
  if (rec.state == State::kAlive && rec.wan_address == r.wan_address) return Verdict::Ok();
  const bool gone = rec.state == State::kDead || rec.state == State::kLeft;
  if (r.rejoin) {
    if (!quorum_ || rec.state == State::kUnregistered)
      return {Refusal::kBadRequest,
              fmt::format("site {}: cannot rejoin a world it never joined (register it normally "
                          "until the initial quorum)",
                          s)};
    if (r.join_round < 0 || r.join_round > kMaxLogCounter)
      return {Refusal::kBadRequest,
              fmt::format("site {}: join round {} is negative or too large", s, r.join_round)};
    bool others_live = false, others_left = false;
    for (size_t i = 0; i < sites_.size(); ++i) {
      if (int(i) == s) continue;
      others_live |= sites_[i].state == State::kAlive;
      others_left |= sites_[i].state == State::kLeft;
    }
    if (!others_live && others_left)
      return {Refusal::kFinished,
              fmt::format("site {}: the run is over: every other site has finished and left", s)};
    if (r.early_by < 0 || r.early_by > r.join_round)
      return {Refusal::kBadRequest, fmt::format("site {}: {} rounds early for join round {}", s,
                                                r.early_by, r.join_round)};
    for (size_t i = 0; i < sites_.size(); ++i)
      if (sites_[i].state == State::kAlive && sites_[i].last_round >= r.join_round - r.early_by)
        return {Refusal::kTooLate,
                fmt::format("site {}: too late to rejoin at round {}: site {} has reached round "
                            "{}",
                            s, r.join_round, i, sites_[i].last_round)};
  } else if (quorum_ && gone) {
    return {Refusal::kMustRejoin,
            fmt::format("site {} {} (membership epoch {}): a new process must rejoin it at a "
                        "round (`atoll train --rejoin`), not register as a new member",
                        s, rec.state == State::kDead ? "was declared dead" : "has left the world",
                        epoch_)};
  }
  Json j = {{"t", "register"},
            {"site", s},
            {"incarnation", HashToHex(r.incarnation)},
            {"wan", r.wan_address},
            {"config_hash", HashToHex(r.config_hash)},
            {"peer", r.peer},
            {"epoch", epoch_ + 1}};
  if (r.rejoin) j["join_round"] = r.join_round;
  *record = std::move(j);
  return Verdict::Ok();
}

Verdict MembershipState::PlanLeave(int site, uint64_t incarnation, Json* record) const {
  *record = nullptr;
  Verdict v = CheckMember(site, incarnation);
  if (!v.ok()) return v;
  *record = {{"t", "leave"}, {"site", site}, {"epoch", epoch_ + 1}};
  return v;
}

std::optional<Json> MembershipState::NextConsequence() const {
  if (!quorum_) {
    for (const Site& s : sites_)
      if (s.state != State::kAlive) return std::nullopt;
    return Json{{"t", "quorum"}, {"epoch", epoch_}};
  }
  int64_t m = std::numeric_limits<int64_t>::max();
  std::vector<int> live;
  for (size_t i = 0; i < sites_.size(); ++i) {
    if (sites_[i].state != State::kAlive) continue;
    m = std::min(m, sites_[i].last_round);
    live.push_back(int(i));
  }
  if (live.empty() || m <= completed_round_) return std::nullopt;
  Json j = {{"t", "round"}, {"round", m}, {"epoch", epoch_}, {"live", live}};
  Json votes = Json::array();
  for (int s : live) {
    const Site& rec = sites_[size_t(s)];
    if (rec.vote_round != m) continue;
    Json v = {{"site", s}, {"failed", rec.vote.failed}, {"digest", HashToHex(rec.vote.digest)}};
    if (rec.vote.seconds > 0) v["seconds"] = rec.vote.seconds;
    votes.push_back(std::move(v));
  }
  if (!votes.empty()) j["votes"] = std::move(votes);
  return j;
}

std::optional<Json> MembershipState::NextDeath(double now) const {
  const double limit = dead_after_s();
  for (size_t i = 0; i < sites_.size(); ++i) {
    const Site& s = sites_[i];
    if (s.state == State::kAlive && now - s.last_heartbeat > limit)
      return Json{{"t", "death"},
                  {"site", int(i)},
                  {"silent_s", now - s.last_heartbeat},
                  {"epoch", epoch_ + 1}};
  }
  return std::nullopt;
}

Verdict MembershipState::CheckMember(int site, uint64_t incarnation) const {
  if (Verdict v = OutOfRange(site); !v.ok()) return v;
  const Site& rec = sites_[size_t(site)];
  switch (rec.state) {
    case State::kUnregistered:
      return {Refusal::kUnknownProcess,
              fmt::format("site {} is not registered with this coordinator", site)};
    case State::kAlive:
      if (rec.incarnation == incarnation) return Verdict::Ok();
      return {Refusal::kTaken, fmt::format("site {} is registered by another process (WAN "
                                           "address {})",
                                           site, rec.wan_address)};
    case State::kDead:
    case State::kLeft:
      if (rec.incarnation != incarnation)
        return {Refusal::kUnknownProcess,
                fmt::format("site {} (this process) is not registered", site)};
      return {Refusal::kGone,
              fmt::format("site {} {} (membership epoch {}); a new process may rejoin it", site,
                          rec.state == State::kDead ? "was declared dead by the coordinator"
                                                    : "has left the world",
                          epoch_)};
  }
  return {Refusal::kBadRequest, "bad site state"};
}

void MembershipState::Beat(int site, uint64_t incarnation, double now) {
  Site& s = sites_[size_t(site)];
  if (s.state == State::kAlive && s.incarnation == incarnation && now > s.last_heartbeat)
    s.last_heartbeat = now;
}

void MembershipState::ReachRound(int site, int64_t round, const std::optional<RoundVote>& vote) {
  Site& rec = sites_[size_t(site)];
  if (round < rec.last_round) return;  // a stale retry: neither its round nor its vote count
  rec.last_round = round;
  if (vote) {
    rec.vote_round = round;
    rec.vote = *vote;
  }
}

void MembershipState::GraceAll(double until) {
  for (Site& s : sites_) s.last_heartbeat = std::max(s.last_heartbeat, until);
}

void MembershipState::Pause(double seconds, double now) {
  if (!(seconds > 0)) return;
  for (Site& s : sites_)
    s.last_heartbeat = std::max(s.last_heartbeat, std::min(now, s.last_heartbeat + seconds));
}

Membership MembershipState::Current() const {
  Membership m;
  m.epoch = epoch_;
  for (size_t i = 0; i < sites_.size(); ++i) {
    const Site& s = sites_[i];
    m.sites.push_back({int(i), s.wan_address, s.state == State::kAlive, s.last_round, s.join_round,
                       s.state == State::kLeft, s.registered_epoch});
  }
  return m;
}

Membership MembershipState::RoundResult(int64_t round) const {
  auto it = rounds_.lower_bound(round);
  if (it != rounds_.end() && it->first == round) return it->second;
  // A round that completed together with later ones (a site died, the others were ahead) or long
  // ago: the membership of the next one kept, without votes, which belong to that round alone.
  Membership m = it != rounds_.end() ? it->second : Current();
  m.votes.clear();
  return m;
}

std::string MembershipState::Missing() const {
  std::string out;
  for (size_t i = 0; i < sites_.size(); ++i)
    if (sites_[i].state != State::kAlive) out += fmt::format("{}{}", out.empty() ? "" : ", ", i);
  return out;
}

std::string MembershipState::Late(int64_t round) const {
  std::string out;
  for (size_t i = 0; i < sites_.size(); ++i)
    if (sites_[i].state == State::kAlive && sites_[i].last_round < round)
      out +=
          fmt::format("{}site {} (at round {})", out.empty() ? "" : ", ", i, sites_[i].last_round);
  return out;
}

}  // namespace atl
