// The coordinator's membership as a plain state machine: the sites, the process (incarnation)
// holding each, their rounds and last heartbeats, the epoch, the initial quorum, the completed
// rounds and the votes cast in them. No threads, no clock of its own, no I/O, no gRPC.
//
// Every durable change is a record (a JSON object, one line of STATE/coordinator.log). The
// server asks what a request takes (Plan*, NextConsequence, NextDeath: they change nothing),
// appends the record to its log and only then applies it with Apply, the same function that
// replays the log at a restart. So the state is never ahead of the log, and a replayed state is
// the state that was acknowledged. What is not logged is soft: heartbeats, the round each site
// has reached and its vote there (a restarted coordinator learns them again from the sites).
//
// Records ("t"): start {sites, version}; restart {epoch}; register {site, incarnation (hex), wan,
// config_hash (hex), peer, epoch, join_round (a rejoin only)}; quorum {epoch}; round {round,
// epoch, live [sites], votes [{site, failed, digest (hex)}] (when any was cast)}; death {site,
// silent_s, epoch}; leave {site, epoch}.
//
// Rules (see world/coordinator.h for what the sites see):
// - Epoch: +1 for every registration (first or rejoin), death and leave.
// - A site is alive from its register record to its death or leave. A second process claiming a
//   live site is refused (kTaken). After the initial quorum a site that died or left comes back
//   only as a rejoin (kMustRejoin otherwise), naming the round it joins at: refused when a live
//   site has reached it (kTooLate); it counts as having reached the rounds before.
// - A site's round only grows (a stale retried Round never lowers it). Round r completes when
//   every live site has reached it; its result (kept for the last 64 rounds) is the membership at
//   that moment with the votes of the live sites that reached r with a vote.
// - A live site silent for longer than dead_after_beats * heartbeat_s is declared dead.
//
// Thread-safety: none; the server holds its lock around every call.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "world/coordinator.h"

namespace atl {

// Why a request is refused; the server maps each to the status code the clients act on.
enum class Refusal {
  kNone,
  kBadRequest,      // INVALID_ARGUMENT: a malformed request, or a rejoin before the quorum
  kOtherConfig,     // FAILED_PRECONDITION: another model config than the first site's
  kMustRejoin,      // FAILED_PRECONDITION: a plain Register of a site declared dead or gone
  kTaken,           // ALREADY_EXISTS: the site is held by another live process
  kTooLate,         // OUT_OF_RANGE: a rejoin at a round a live site has reached
  kUnknownProcess,  // NOT_FOUND: not registered (anymore) as this process: register again
  kGone,            // ABORTED: this process's site was declared dead or has left
  kFinished,        // FAILED_PRECONDITION: a rejoin after every other site left (run over)
};

struct Verdict {
  Refusal refusal = Refusal::kNone;
  std::string message;
  bool ok() const { return refusal == Refusal::kNone; }
  static Verdict Ok() { return {}; }
};

struct Registration {
  int site = 0;
  uint64_t incarnation = 0;
  std::string wan_address;
  uint64_t config_hash = 0;
  bool rejoin = false;
  int64_t join_round = 0;
  std::string peer;      // where the call came from, for the log
  int64_t early_by = 0;  // a rejoin is refused when a live site reached join_round - early_by
};

class MembershipState {
 public:
  MembershipState(int sites, double heartbeat_s, int dead_after_beats);

  // Applies a record (replayed from the log, or planned and logged just now). A record that does
  // not fit is kCorruption (kInvalidArgument: a log of a world with another number of sites).
  Status Apply(const nlohmann::json& record);

  nlohmann::json StartRecord() const;
  nlohmann::json RestartRecord() const;

  // What registering takes: *record is set to the register record to log and apply, or left
  // null when this process is registered already (a retried call: nothing changes).
  Verdict PlanRegister(const Registration& r, nlohmann::json* record) const;
  // A clean leave: the leave record; kGone when the site is already dead or gone (the caller's
  // leave is then done), or another refusal.
  Verdict PlanLeave(int site, uint64_t incarnation, nlohmann::json* record) const;
  // The next record that follows from the state by itself: the initial quorum once every site
  // is registered, then the completion of the lowest round every live site has reached.
  std::optional<nlohmann::json> NextConsequence() const;
  // The death record of the first live site silent for longer than the limit at `now`.
  std::optional<nlohmann::json> NextDeath(double now) const;

  // Soft state (not logged).
  // OK when (site, incarnation) is a live member; otherwise kUnknownProcess, kGone or kTaken
  // (kBadRequest for a site out of range, as in PlanRegister and PlanLeave).
  Verdict CheckMember(int site, uint64_t incarnation) const;
  // A heartbeat of `incarnation` at `now`: counts when that process holds the site alive and
  // `now` is later than its last (beats may be folded in late and out of order).
  // REQUIRES (Beat, ReachRound): 0 <= site < sites(); a vote's seconds finite and >= 0 (the server
  // refuses other values: a logged infinity would not read back).
  void Beat(int site, uint64_t incarnation, double now);
  // The site has reached `round` and casts `vote` there; a round below the site's (a stale retry)
  // changes nothing.
  void ReachRound(int site, int64_t round, const std::optional<RoundVote>& vote);
  // Every site's last heartbeat moves up to `until` where it was earlier: a restart's grace.
  void GraceAll(double until);
  // The coordinator did not run for `seconds` before `now`: every site's last heartbeat moves that
  // much later, up to `now` (never earlier), so that silence counts only while it runs.
  void Pause(double seconds, double now);

  Membership Current() const;
  // The result of completed round `round`: the membership when it completed, with its votes
  // (without votes when only a later round's record is kept).
  Membership RoundResult(int64_t round) const;
  int64_t completed_round() const { return completed_round_; }
  bool quorum() const { return quorum_; }
  int sites() const { return int(sites_.size()); }
  double dead_after_s() const { return heartbeat_s_ * dead_after_beats_; }
  // "1, 3": the sites not alive.
  std::string Missing() const;
  // "site 1 (at round 4), ...": the live sites short of `round`.
  std::string Late(int64_t round) const;

 private:
  Verdict OutOfRange(int site) const;  // kBadRequest unless 0 <= site < sites()
  enum class State { kUnregistered, kAlive, kDead, kLeft };
  struct Site {
    State state = State::kUnregistered;
    std::string wan_address;
    uint64_t incarnation = 0;
    int64_t last_round = -1;
    int64_t join_round = 0;
    int64_t registered_epoch = 0;  // of the register record of its current process
    double last_heartbeat = 0;
    int64_t vote_round = -1;  // the round `vote` was cast in
    RoundVote vote;
  };

  const double heartbeat_s_;
  const int dead_after_beats_;
  std::vector<Site> sites_;
  int64_t epoch_ = 0;
  bool quorum_ = false;
  int64_t completed_round_ = -1;
  bool have_hash_ = false;
  uint64_t config_hash_ = 0;
  int hash_site_ = -1;
  std::map<int64_t, Membership> rounds_;  // recent completed rounds
};

}  // namespace atl
