// The coordinator of a world: membership, heartbeats, a quorum per round, and a durable log.
//
// Sites (their leaders) Register with their site index, the WAN address of their WanEndpoint,
// the protocol version and a hash of the model config; the coordinator refuses a wrong version,
// a config hash that differs from the first registered site's, an unknown or duplicate site, and
// any call without the TLS client certificate or the shared token (world/security.h) — each with
// a clear error to the caller and a line in the coordinator's log. Registration completes when
// all `sites` expected sites have registered (the initial quorum); the reply is the membership.
//
// Heartbeats: each site's client beats every heartbeat_s / 2 on a background thread, over a
// connection of its own (never queued behind parameter-server transfers); a site silent for more
// than dead_after_beats * heartbeat_s is declared dead, which bumps the membership epoch. Rounds:
// Round(r) returns once every live site has reached round r (or a site died meanwhile: the
// reply's membership shows it), so sites agree on who takes part in round r. A site may cast a
// vote with its Round (did its part of the round's work succeed, and a digest of the result):
// every site gets the votes of all the live sites of the round, so they decide alike.
//
// Durable log: every membership change and completed round is appended as a JSON line to
// DIR/coordinator.log (world/coordinator/durable_log.h) and is durable before any reply that
// depends on it; the fdatasync runs outside the coordinator's lock, so a slow disk never delays
// heartbeats. A restarted coordinator replays the log (epoch, members, last round, votes) so a
// restart does not lose the run's history, and sites re-register transparently (their clients
// retry with backoff). If the log cannot be written (disk full, I/O error), the coordinator
// never goes on ahead of it: the partial record is cut off, every call is refused from then on
// ("the coordinator stopped: ..."), failure() says why and options.on_failure is called; `atoll
// coordinator` then exits 1. Restarted on the same directory, it resumes from the intact log.
//
// Details (world/coordinator/membership.h has the rules as a state machine):
// - Epoch: +1 for every registration (first or rejoin), death and leave; not for a restart.
// - A client is one process: it draws a random incarnation at Connect, so a retried Register
//   (lost reply, restarted coordinator) is the same site again, not a duplicate. A second process
//   claiming a live site is refused; once the first is declared dead, a new process may take the
//   site over by a rejoin (CoordinatorClient::Rejoin: it names the round it joins at, refused
//   when a live site has reached it already, and counts as having reached the rounds before). A
//   plain Register of a site that died or left after the initial quorum is refused (it must
//   rejoin). A site waiting in Register for the quorum counts as alive.
// - Round(r) raises the site's round to r (never lowers it: a stale retry is harmless) and
//   returns when every live site has reached r; the reply is the membership at the moment the
//   round completed, the same for every site, with the votes cast in it. A site that was declared
//   dead (or left) gets Unavailable from Round; a new process may Rejoin.
// - Clients beat at half of min(their heartbeat_s, the coordinator's), so a mismatch cannot kill
//   a site; a heartbeat call gives up after one interval. Destroying a client without Leave stops
//   its heartbeats: the coordinator sees a crash.
// - Silence is counted only while the coordinator runs: when its monitor finds it did not run
//   for more than half an interval (its process stopped, its machine starved of CPU), that time
//   is taken out of every site's silence, and a warning says so.
// - Restart: replayed live sites get max(heartbeat_s, 1 s) of grace before the limit applies;
//   clients notice the new coordinator (its id in every reply), register again (no epoch change),
//   and retry an interrupted Round. A state dir is tied to its --sites.
//
// The asynchronous parameter server (world/ps.h) lives in the coordinator too
// (world/coordinator/ps_service.h): sites reach it through CoordinatorClient::ps() (RPCs PsInit,
// PsPull, PsPush; callers must be registered live sites, authenticated like every other call).
// The parameters (up to ~200 MB; messages up to 1 GiB are allowed) and their version live in the
// coordinator's memory; every decided push is appended to DIR/ops.jsonl (format: world/ps.h) and
// fsynced before the reply, after the update was validated (a bad one changes nothing and is not
// logged) and before it is applied.
// - Restart: the parameters are recovered from DIR/ps_params.bin, a snapshot written atomically
//   at the init and after every accepted update, before the reply (4 bytes a parameter each
//   time); a coordinator killed between logging an update and its snapshot cuts that update from
//   the log at restart (it was never answered nor pulled: its site's retry decides it again).
//   Update records name the pushing process and its sequence number, so a push retried across a
//   restart gets its first decision. Without a snapshot that matches the log (lost, damaged, or
//   behind by more than one update) every PS call is refused with FAILED_PRECONDITION "the
//   parameter server's state was lost with the coordinator's restart (replay the op log with
//   `atoll replay`)" (the client's kInternal) instead of silently starting over; membership and
//   rounds carry on as usual. A log with only the init record and no snapshot: the next PsInit
//   must match it (count and checksum) and sets the parameters again. A corrupt ops.jsonl (not
//   just a torn last line) fails Start (kCorruption).
// - A failed append to ops.jsonl leaves the parameter server refusing every later PS call
//   (FAILED_PRECONDITION): the log and the parameters can no longer be shown to agree.
// - Client retries: as Round (UNAVAILABLE and the like, up to timeout_s; NOT_FOUND registers
//   again). A push carries a per-client sequence number, so a retry after a lost reply gets the
//   first decision back instead of applying the update twice.
// - Codes seen by ps()'s callers: kInvalidArgument (another model in Init, a size mismatch, a bad
//   weight or base version, refused authentication), kCorruption (an encoded update that does not
//   decode), kInternal (the server cannot serve: not initialized, state lost, op log unwritable),
//   kUnavailable (unreachable until timeout_s, or this site was declared dead).
//
// Thread-safety: Coordinator's methods and CoordinatorClient's methods are thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/status.h"
#include "world/ps.h"
#include "world/security.h"

namespace atl {

// 2: Round carries votes and its reply the votes of the round (a site of version 1 would commit
// exchanges the others give up).
inline constexpr uint32_t kCoordinatorProtocolVersion = 2;
// The largest gRPC message the coordinator and its clients accept (parameter server transfers).
inline constexpr int kCoordinatorMaxMessageBytes = 1 << 30;
// The largest request of every other method (membership, rounds, PsPull): a few hundred bytes
// in use; a larger one is refused (RESOURCE_EXHAUSTED) before it is acted on.
inline constexpr size_t kCoordinatorMaxSmallRequestBytes = 64 << 10;

struct CoordinatorOptions {
  std::string listen = "127.0.0.1:0";  // host:port (port 0: any)
  int sites = 1;                       // expected sites
  double heartbeat_s = 1.0;
  int dead_after_beats = 3;  // a site silent for this many intervals is declared dead (>= 2)
  std::string state_dir;     // coordinator.log lives here (created); required
  WorldSecurity security;
  // Called once (from a server thread) when the coordinator stops because its log cannot be
  // written; failure() says why.
  std::function<void()> on_failure;
};

// What a site says with its Round: whether its part of the round's work failed, and a digest of
// the result it would commit (the sites of a round must agree on it).
struct RoundVote {
  bool failed = false;
  uint64_t digest = 0;
  // world.balance (diloco, streaming): the voter's measured seconds per micro-batch (0: none),
  // so every site of the round learns every site's speed alike.
  double seconds = 0;
  bool operator==(const RoundVote&) const = default;
};

struct SiteInfo {
  int site = 0;
  std::string wan_address;
  bool alive = true;
  int64_t last_round = -1;
  // The first round the site's process takes part in: 0, or for a process that rejoined, the
  // round it named (before it, the site is alive but not in the rounds' work).
  int64_t join_round = 0;
  // Not alive because it left cleanly (Leave: its work is done), not because it was declared
  // dead: nothing waiting for its part has to fail.
  bool left = false;
  // The epoch its current process registered at (0: never registered): what that process's WAN
  // chunks carry, so that peers refuse an earlier process's (WanEndpoint::PeerAlive).
  int64_t epoch = 0;
};

struct Membership {
  int64_t epoch = 0;
  std::vector<SiteInfo> sites;  // by site index
  // In the reply to Round(r): the votes cast in round r by its live sites, by site.
  std::map<int, RoundVote> votes;
  int live() const;
  // The live sites that take part in round r (a rejoined site only from its join round on),
  // sorted.
  std::vector<int> LiveInRound(int64_t r) const;
  // The sites declared dead (not those that left: their part is done) other than `except`, that
  // had a WAN address: whose operations must fail (WanEndpoint::PeerLost).
  std::vector<SiteInfo> Dead(int except) const;
};

class Coordinator {
 public:
  static StatusOr<std::unique_ptr<Coordinator>> Start(const CoordinatorOptions& options);
  virtual ~Coordinator() = default;
  virtual std::string address() const = 0;  // host:port, the bound port
  virtual Membership membership() const = 0;
  // OK while it serves; why it stopped when its log could not be written.
  virtual Status failure() const = 0;
  // Stops serving (pending calls fail); the log stays.
  virtual void Shutdown() = 0;
};

struct CoordinatorClientOptions {
  std::string address;  // the coordinator's host:port
  int site = 0;
  uint64_t config_hash = 0;
  double heartbeat_s = 1.0;
  double timeout_s = 120;  // for Register and Round
  WorldSecurity security;
  // Called with every newer membership epoch (a site died, left or (re)joined), once each, in
  // order, one call at a time, from whichever thread got the reply (mostly the heartbeat
  // thread): the WAN layer fails its operations with a site the coordinator declared dead
  // (WanEndpoint::PeerLost). Must not call back into the client.
  std::function<void(const Membership&)> on_membership;
};

class CoordinatorClient {
 public:
  static StatusOr<std::unique_ptr<CoordinatorClient>> Connect(
      const CoordinatorClientOptions& options);
  virtual ~CoordinatorClient() = default;
  // Registers and waits for the initial quorum; starts heartbeats. Errors: refused registration
  // (kInvalidArgument with the coordinator's reason: version, config, site, duplicate, token,
  // TLS handshake), timeout (kUnavailable naming the sites still missing).
  virtual StatusOr<Membership> Register(const std::string& wan_address) = 0;
  // Registers a new process for a site that was declared dead (or left) after the initial
  // quorum: it takes part from round join_round on (the others' rounds before that do not wait
  // for it; it counts as having reached join_round - 1). Starts heartbeats. While the old
  // process is still counted alive (up to dead_after_beats * heartbeat_s after it died) this
  // retries, up to timeout_s. kNotFound when a live site has already reached round
  // join_round - early_by (too late: pick a later round and try again; with early_by > 0 every
  // live site's rounds from that one on show this registration in their replies); otherwise the
  // errors of Register.
  virtual StatusOr<Membership> Rejoin(const std::string& wan_address, int64_t join_round,
                                      int64_t early_by = 0) = 0;
  // The membership now, without registering (a process about to Rejoin learns the live sites'
  // WAN addresses). Retries while the coordinator is unreachable, up to timeout_s.
  virtual StatusOr<Membership> Peek() = 0;
  // Waits until every live site has reached round r; the membership for the round, with the
  // votes cast in it (this site's `vote` among them, if any). Retries while the coordinator is
  // unreachable, up to timeout_s; kUnavailable on timeout (naming the late sites) or when this
  // site was declared dead.
  virtual StatusOr<Membership> Round(int64_t round, std::optional<RoundVote> vote) = 0;
  StatusOr<Membership> Round(int64_t round) { return Round(round, std::nullopt); }
  // Leaves the world cleanly (the coordinator logs it; not counted as a death). Stops the
  // heartbeats first; retries up to min(timeout_s, 10 s).
  virtual Status Leave() = 0;
  // The coordinator's parameter server, called as this site (Register first). Owned by the
  // client, valid for its lifetime; thread-safe.
  virtual ParameterServer* ps() = 0;
};

}  // namespace atl
