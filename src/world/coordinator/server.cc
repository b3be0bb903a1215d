// The coordinator's gRPC server (world/coordinator.h): authentication, the membership calls over
// MembershipState (world/coordinator/membership.h) and its durable log, the heartbeat monitor,
// and the parameter server's calls handed to PsService.
//
// Locking: mu_ guards the membership and is held for short work (the append of a record is a
// write to the page cache, which a slow disk may still stall); the fdatasync that makes a record
// durable runs after mu_ is released, in the reply path of every call (Answer; DurableLog groups
// them) and on the syncer thread for the monitor's deaths, so no reply shows a change the log
// could still lose and the monitor never waits for the disk.
//
// Heartbeats take neither mu_ nor the disk: a beat is written to the BeatBoard, and the caller is
// checked against, and answered with, the last membership known durable (published_, set after
// every sync). The monitor folds the board into the state before it looks for silent sites. So
// a slow disk, or a write stuck under mu_, never makes a site look silent. Lock order: mu_, then
// the board's or pub_mu_ (both leaves).
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <thread>

#include "core/file.h"
#include "core/log.h"
#include "core/rng.h"
#include "world/coordinator.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/membership.h"
#include "world/coordinator/ps_service.h"
#include "world/coordinator/wire.h"
#include "world/proto/coordinator.grpc.pb.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Json = nlohmann::json;

constexpr const char* kLogName = "coordinator.log";

grpc::StatusCode CodeOf(Refusal r) {
  switch (r) {
    case Refusal::kNone:
      return grpc::StatusCode::OK;
    case Refusal::kBadRequest:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case Refusal::kOtherConfig:
    case Refusal::kMustRejoin:
    case Refusal::kFinished:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case Refusal::kTaken:
      return grpc::StatusCode::ALREADY_EXISTS;
    case Refusal::kTooLate:
      return grpc::StatusCode::OUT_OF_RANGE;
    case Refusal::kUnknownProcess:
      return grpc::StatusCode::NOT_FOUND;
    case Refusal::kGone:
      return grpc::StatusCode::ABORTED;
  }
  return grpc::StatusCode::INTERNAL;
}

grpc::Status StatusOf(const Verdict& v) { return grpc::Status(CodeOf(v.refusal), v.message); }

// The heartbeats since the monitor last looked, by site and process, written without the
// coordinator's lock; and the processes registering right now (their reply waits for the disk,
// and they beat only once it has arrived: they count as beating meanwhile).
class BeatBoard {
 public:
  explicit BeatBoard(int sites) : last_(size_t(sites)) {}
  void Record(int site, uint64_t incarnation, double now) {
    std::lock_guard<std::mutex> lk(mu_);
    double& t = last_[size_t(site)][incarnation];
    t = std::max(t, now);
  }
  void Pin(int site, uint64_t incarnation) {
    std::lock_guard<std::mutex> lk(mu_);
    ++pinned_[{site, incarnation}];
  }
  void Unpin(int site, uint64_t incarnation) {
    std::lock_guard<std::mutex> lk(mu_);
    auto it = pinned_.find({site, incarnation});
    if (it != pinned_.end() && --it->second == 0) pinned_.erase(it);
  }
  // Every beat recorded since the last call into `state` (which counts those of the processes
  // holding their sites, and ignores the rest), and a beat at `now` of every pinned process.
  void FoldInto(MembershipState& state, double now) {
    std::lock_guard<std::mutex> lk(mu_);
    for (size_t i = 0; i < last_.size(); ++i) {
      for (const auto& [incarnation, t] : last_[i]) state.Beat(int(i), incarnation, t);
      last_[i].clear();
    }
    for (const auto& [who, n] : pinned_) state.Beat(who.first, who.second, now);
  }

 private:
  std::mutex mu_;
  std::vector<std::map<uint64_t, double>> last_;  // by site: incarnation -> last beat
  std::map<std::pair<int, uint64_t>, int> pinned_;
};

// The membership as of some moment, and how many records had been applied by then.
struct Snapshot {
  uint64_t version = 0;
  std::shared_ptr<const MembershipState> state;
};

class CoordinatorImpl;

class Service final : public coord::Coordinator::Service {
 public:
  explicit Service(CoordinatorImpl* c) : c_(c) {}
  grpc::Status Register(grpc::ServerContext* ctx, const coord::RegisterRequest* req,
                        coord::Reply* reply) override;
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const coord::HeartbeatRequest* req,
                         coord::Reply* reply) override;
  grpc::Status Round(grpc::ServerContext* ctx, const coord::RoundRequest* req,
                     coord::Reply* reply) override;
  grpc::Status Leave(grpc::ServerContext* ctx, const coord::LeaveRequest* req,
                     coord::Reply* reply) override;
  grpc::Status Peek(grpc::ServerContext* ctx, const coord::PeekRequest* req,
                    coord::Reply* reply) override;
  grpc::Status PsInit(grpc::ServerContext* ctx, const coord::PsInitRequest* req,
                      coord::PsInitReply* reply) override;
  grpc::Status PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest* req,
                      coord::PsPullReply* reply) override;
  grpc::Status PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest* req,
                      coord::PsPushReply* reply) override;

 private:
  CoordinatorImpl* c_;
};

class CoordinatorImpl final : public Coordinator {
 public:
  explicit CoordinatorImpl(const CoordinatorOptions& o)
      : options_(o),
        id_(RandomIdentity()),
        state_(o.sites, o.heartbeat_s, o.dead_after_beats),
        beats_(o.sites),
        ps_(o.state_dir, o.sites, id_,
            [this](const grpc::ServerContext& ctx, const char* rpc, int site, uint64_t inc) {
              return CheckPsCaller(ctx, rpc, site, inc);
            }),
        service_(this) {}
  ~CoordinatorImpl() override { Shutdown(); }

  Status Init();
  std::string address() const override { return address_; }
  Membership membership() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return state_.Current();
  }
  Status failure() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return failure_;
  }
  void Shutdown() override;

  grpc::Status Register(grpc::ServerContext* ctx, const coord::RegisterRequest& req,
                        coord::Reply* reply);
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const coord::HeartbeatRequest& req,
                         coord::Reply* reply);
  grpc::Status Round(grpc::ServerContext* ctx, const coord::RoundRequest& req, coord::Reply* reply);
  grpc::Status Leave(grpc::ServerContext* ctx, const coord::LeaveRequest& req, coord::Reply* reply);
  grpc::Status Peek(grpc::ServerContext* ctx, const coord::PeekRequest& req, coord::Reply* reply);
  PsService& ps() { return ps_; }

 private:
  // The token, the site's range, and that the caller's certificate names `site` (logged when
  // refused).
  grpc::Status Authorize(const grpc::ServerContext& ctx, const char* rpc, int site) const;
  grpc::Status CheckSite(const grpc::ServerContext& ctx, const char* rpc, int site) const;
  grpc::Status CheckPsCaller(const grpc::ServerContext& ctx, const char* rpc, int site,
                             uint64_t incarnation);
  // UNAVAILABLE while shutting down or stopped; OK otherwise. REQUIRES: mu_ held.
  grpc::Status ServingLocked() const;
  // Logs `record` and applies it, then whatever follows from it (the quorum, completed rounds).
  // False when the log refused it: the coordinator has stopped. REQUIRES: mu_ held.
  bool CommitLocked(const Json& record);
  // Stops serving because the log failed. REQUIRES: mu_ held.
  void StopLocked(const Status& why);
  // Answers a call with `st` once every record logged so far is durable: a reply (or a refusal)
  // may reveal any state the call saw, and nobody may learn of a change the log could still
  // lose. The fdatasync runs after mu_ is released (DurableLog groups concurrent ones); then the
  // state it covers is published for heartbeats. A failed sync stops the coordinator.
  // REQUIRES: lk holds mu_; it is released.
  grpc::Status Answer(std::unique_lock<std::mutex>& lk, grpc::Status st);
  void FillReply(const Membership& m, coord::Reply* reply) const;
  // The state now (a copy made only when a record was applied since the last). REQUIRES: mu_.
  Snapshot CaptureLocked();
  // Makes `s` what heartbeats see, unless a later state is published already. REQUIRES: every
  // record applied before `s` was captured is durable.
  void Publish(const Snapshot& s);
  std::shared_ptr<const MembershipState> Published() const;
  void Monitor();
  // Makes the monitor's records durable and publishes them, off the monitor's thread.
  void Syncer();
  Clock::time_point WaitDeadline(const grpc::ServerContext& ctx) const;

  const CoordinatorOptions options_;
  const uint64_t id_;
  std::string address_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  MembershipState state_;
  DurableLog log_;
  bool stopping_ = false;
  Status failure_;                   // why the coordinator stopped (its log failed)
  std::atomic<bool> halted_{false};  // stopping_ or failed: read by heartbeats without mu_
  uint64_t version_ = 0;             // records applied
  Snapshot captured_;                // the last capture
  bool sync_wanted_ = false;         // the monitor has logged records for the syncer

  BeatBoard beats_;
  mutable std::mutex pub_mu_;
  Snapshot published_;  // guarded by pub_mu_

  PsService ps_;

  std::mutex shutdown_mu_;
  bool shut_down_ = false;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread monitor_, syncer_;
};

Status CoordinatorImpl::Init() {
  ATOLL_RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  const std::string path = options_.state_dir + "/" + kLogName;
  ATOLL_ASSIGN_OR_RETURN(const LogContents contents, ReadLog(path, "coordinator record"));
  std::unique_lock<std::mutex> lk(mu_);  // calls that arrive before the log is open wait
  for (const LogRecord& r : contents.records) {
    Status st = state_.Apply(r.json);
    if (!st.ok()) {
      if (st.code() == StatusCode::kInvalidArgument)
        return Status::InvalidArgument(fmt::format("{}: {}", path, st.message()));
      return Status::Corruption(fmt::format("{} line {}: {}", path, r.line, st.message()));
    }
  }
  ATOLL_RETURN_IF_ERROR(ps_.Start());

  // Listen before writing anything, so a refused address leaves the state directory as it was.
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort(options_.listen, ServerCredentials(options_.security), &port);
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);        // a second coordinator must fail
  builder.SetMaxReceiveMessageSize(kCoordinatorMaxMessageBytes);  // parameter server transfers
  builder.SetMaxSendMessageSize(kCoordinatorMaxMessageBytes);
  builder.RegisterService(&service_);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port == 0)
    return Status::InvalidArgument(
        fmt::format("coordinator: cannot listen on {} (address in use, or not a local HOST:PORT)",
                    options_.listen));
  address_ = options_.listen.substr(0, options_.listen.rfind(':')) + ":" + std::to_string(port);

  ATOLL_RETURN_IF_ERROR(log_.Open(path, contents));
  if (contents.records.empty()) {
    ATOLL_RETURN_IF_ERROR(log_.Write(state_.StartRecord()));
  } else {
    const Membership m = state_.Current();
    std::string live;
    for (const auto& s : m.sites)
      if (s.alive) live += fmt::format("{}{}", live.empty() ? "" : ",", s.site);
    LogInfo("coordinator: resumed from {} ({} records): epoch {}, live sites [{}], last round {}",
            path, contents.records.size(), m.epoch, live, state_.completed_round());
    ATOLL_RETURN_IF_ERROR(log_.Write(state_.RestartRecord()));
  }
  ++version_;
  Publish(CaptureLocked());  // everything so far is durable (Write syncs)
  // Replayed live sites get a grace period to find the restarted coordinator, from now: the
  // writes above may have taken long on a slow disk, and beats were refused until the publish.
  state_.GraceAll(NowSeconds() + std::max(options_.heartbeat_s, 1.0));
  lk.unlock();
  monitor_ = std::thread([this] { Monitor(); });
  syncer_ = std::thread([this] { Syncer(); });
  LogInfo(
      "coordinator: listening on {} for {} sites (heartbeat {} s, dead after {} missed, {}), log "
      "{}",
      address_, options_.sites, options_.heartbeat_s, options_.dead_after_beats,
      options_.security.insecure ? "INSECURE: no TLS, no token" : "mutual TLS + token", path);
  return Status::Ok();
}

void CoordinatorImpl::Shutdown() {
  std::lock_guard<std::mutex> g(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
    halted_ = true;
  }
  cv_.notify_all();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + milliseconds(2000));
  if (monitor_.joinable()) monitor_.join();
  if (syncer_.joinable()) syncer_.join();
  if (server_ != nullptr) server_->Wait();
}

grpc::Status CoordinatorImpl::ServingLocked() const {
  if (!failure_.ok())
    return grpc::Status(
        grpc::StatusCode::UNAVAILABLE,
        "the coordinator stopped: its log cannot be written: " + failure_.message());
  if (stopping_)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
  return grpc::Status::OK;
}

void CoordinatorImpl::StopLocked(const Status& why) {
  if (!failure_.ok()) return;
  failure_ = why;
  halted_ = true;
  LogError(
      "coordinator: stopping: its log cannot be written ({}); every call is refused from now "
      "on. Free the disk and restart it on the same --state: it resumes from the log, which "
      "is intact",
      why.message());
  cv_.notify_all();
  // Not under mu_: the callback may call back into the coordinator.
  if (options_.on_failure) std::thread(options_.on_failure).detach();
}

bool CoordinatorImpl::CommitLocked(const Json& record) {
  for (std::optional<Json> next = record; next; next = state_.NextConsequence()) {
    if (!failure_.ok()) return false;
    auto ticket = log_.Append(*next);
    if (!ticket.ok()) {
      StopLocked(ticket.status());
      return false;
    }
    if (Status st = state_.Apply(*next); !st.ok()) {  // a bug: the state refused its own record
      StopLocked(Status::Internal(fmt::format("applying {}: {}", next->dump(), st.message())));
      return false;
    }
    ++version_;
    const std::string t = (*next)["t"].get<std::string>();
    if (t == "quorum")
      LogInfo("coordinator: all {} sites registered (epoch {})", options_.sites,
              state_.Current().epoch);
    else if (t == "round")
      LogDebug("coordinator: round {} complete ({} live sites)", (*next)["round"].get<int64_t>(),
               (*next)["live"].size());
    cv_.notify_all();
  }
  return failure_.ok();
}

grpc::Status CoordinatorImpl::Answer(std::unique_lock<std::mutex>& lk, grpc::Status st) {
  const uint64_t ticket = log_.End();
  const Snapshot snap = CaptureLocked();
  lk.unlock();
  if (Status synced = log_.Sync(ticket); !synced.ok()) {
    lk.lock();
    StopLocked(synced);
    return ServingLocked();
  }
  Publish(snap);
  return st;
}

Snapshot CoordinatorImpl::CaptureLocked() {
  if (captured_.state == nullptr || captured_.version != version_)
    captured_ = {version_, std::make_shared<const MembershipState>(state_)};
  return captured_;
}

void CoordinatorImpl::Publish(const Snapshot& s) {
  std::lock_guard<std::mutex> lk(pub_mu_);
  if (published_.state == nullptr || s.version > published_.version) published_ = s;
}

std::shared_ptr<const MembershipState> CoordinatorImpl::Published() const {
  std::lock_guard<std::mutex> lk(pub_mu_);
  return published_.state;
}

void CoordinatorImpl::FillReply(const Membership& m, coord::Reply* reply) const {
  ToProto(m, reply->mutable_membership());
  reply->set_coordinator_id(id_);
  reply->set_heartbeat_s(options_.heartbeat_s);
}

grpc::Status CoordinatorImpl::Authorize(const grpc::ServerContext& ctx, const char* rpc,
                                        int site) const {
  grpc::Status st = CheckToken(ctx, options_.security);
  if (st.ok()) st = CheckSite(ctx, rpc, site);
  if (st.ok()) st = CheckParty(ctx, options_.security, SiteParty(site));
  if (!st.ok()) LogWarning("coordinator: refused {}: {}", rpc, st.error_message());
  return st;
}

grpc::Status CoordinatorImpl::CheckSite(const grpc::ServerContext& ctx, const char* rpc,
                                        int site) const {
  if (site < 0 || site >= options_.sites)
    return RefuseCall(ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {} is out of range: this coordinator expects {} sites "
                                  "(0..{})",
                                  site, options_.sites, options_.sites - 1));
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::CheckPsCaller(const grpc::ServerContext& ctx, const char* rpc,
                                            int site, uint64_t incarnation) {
  if (auto st = Authorize(ctx, rpc, site); !st.ok()) return st;
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  if (auto st = StatusOf(state_.CheckMember(site, incarnation)); !st.ok()) return Answer(lk, st);
  return grpc::Status::OK;
}

Clock::time_point CoordinatorImpl::WaitDeadline(const grpc::ServerContext& ctx) const {
  const auto sys_now = std::chrono::system_clock::now();
  const auto dl = ctx.deadline();
  if (dl <= sys_now) return Clock::now();
  if (dl - sys_now > std::chrono::hours(24)) return Clock::now() + std::chrono::hours(24);
  auto remaining = std::chrono::duration_cast<Clock::duration>(dl - sys_now);
  // Answer a little before the caller's deadline so it gets our reason, not a bare timeout.
  auto margin = std::min<Clock::duration>(milliseconds(200), remaining / 10);
  return Clock::now() + remaining - margin;
}

void CoordinatorImpl::Monitor() {
  const auto period =
      std::max<Clock::duration>(milliseconds(5), SteadySeconds(options_.heartbeat_s / 20));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_ && failure_.ok()) {
    cv_.wait_for(lk, period);
    if (stopping_ || !failure_.ok()) break;
    beats_.FoldInto(state_, NowSeconds());
    bool died = false;
    while (auto death = state_.NextDeath(NowSeconds())) {
      const int site = (*death)["site"].get<int>();
      const double silent = (*death)["silent_s"].get<double>();
      if (!CommitLocked(*death)) break;
      died = true;
      LogWarning(
          "coordinator: site {} declared dead after {:.2f} s without a heartbeat (limit {:.2f} "
          "s: {} intervals); epoch {}, {} live sites",
          site, silent, state_.dead_after_s(), options_.dead_after_beats, state_.Current().epoch,
          state_.Current().live());
    }
    if (died) {
      // Soon on disk and then in heartbeat replies (the calls that reveal the death wait for
      // it anyway); the monitor goes on watching meanwhile, however slow the disk.
      sync_wanted_ = true;
      cv_.notify_all();
    }
  }
}

void CoordinatorImpl::Syncer() {
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    cv_.wait(lk, [&] { return stopping_ || !failure_.ok() || sync_wanted_; });
    if (stopping_ || !failure_.ok()) return;
    sync_wanted_ = false;
    const uint64_t ticket = log_.End();
    const Snapshot snap = CaptureLocked();
    lk.unlock();
    const Status st = log_.Sync(ticket);
    if (st.ok()) Publish(snap);
    lk.lock();
    if (!st.ok()) {
      StopLocked(st);
      return;
    }
  }
}

grpc::Status CoordinatorImpl::Register(grpc::ServerContext* ctx, const coord::RegisterRequest& req,
                                       coord::Reply* reply) {
  const int site = req.site();
  if (auto st = Authorize(*ctx, "Register", site); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, "Register", req, kCoordinatorMaxSmallRequestBytes); !st.ok())
    return st;
  if (req.version() != kCoordinatorProtocolVersion)
    return RefuseCall(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: coordinator protocol version {} differs from the "
                                  "coordinator's {}: run the same atoll release everywhere",
                                  site, req.version(), kCoordinatorProtocolVersion));
  if (req.wan_address().empty() || req.wan_address().size() > 1024)
    return RefuseCall(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: the WAN address must be HOST:PORT (got '{}')", site,
                                  req.wan_address().substr(0, 64)));
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  Json record;
  const Verdict v =
      state_.PlanRegister({site, req.incarnation(), req.wan_address(), req.config_hash(),
                           req.rejoin(), req.join_round(), ctx->peer(), req.early_by()},
                          &record);
  if (!v.ok()) {
    if (v.refusal == Refusal::kTooLate)
      return Answer(lk, StatusOf(v));  // the caller picks another round
    return Answer(lk, RefuseCall(*ctx, "Register", CodeOf(v.refusal), v.message));
  }
  if (!record.is_null()) {
    if (!CommitLocked(record)) return ServingLocked();
    LogInfo("coordinator: site {} {} from {} (WAN {}), epoch {}", site,
            req.rejoin() ? fmt::format("rejoined at round {}", req.join_round()) : "registered",
            ctx->peer(), req.wan_address(), state_.Current().epoch);
  } else {
    LogInfo("coordinator: site {} registered again (same process, from {})", site, ctx->peer());
  }
  // Beating until the reply is out (it may wait for the quorum and then for the disk; the site's
  // heartbeats start only when it arrives), and once more then.
  struct Pinned {
    BeatBoard& board;
    int site;
    uint64_t incarnation;
    ~Pinned() {
      board.Record(site, incarnation, NowSeconds());
      board.Unpin(site, incarnation);
    }
  } pinned{beats_, site, req.incarnation()};
  beats_.Pin(site, req.incarnation());
  const auto deadline = WaitDeadline(*ctx);
  const auto slice =
      std::min<Clock::duration>(milliseconds(100), SteadySeconds(options_.heartbeat_s / 4));
  while (!state_.quorum()) {
    if (auto st = ServingLocked(); !st.ok()) return st;
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (auto st = StatusOf(state_.CheckMember(site, req.incarnation())); !st.ok())
      return Answer(lk, st);
    if (Clock::now() >= deadline)
      return Answer(
          lk, grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                           fmt::format("initial quorum not reached: {} of {} sites registered; "
                                       "waiting for site(s) {}",
                                       state_.Current().live(), options_.sites, state_.Missing())));
    cv_.wait_until(lk, std::min(deadline, Clock::now() + slice));
  }
  FillReply(state_.Current(), reply);
  return Answer(lk, grpc::Status::OK);
}

grpc::Status CoordinatorImpl::Heartbeat(grpc::ServerContext* ctx,
                                        const coord::HeartbeatRequest& req, coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Heartbeat", req.site()); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, "Heartbeat", req, kCoordinatorMaxSmallRequestBytes);
      !st.ok())
    return st;
  if (halted_) {
    std::lock_guard<std::mutex> lk(mu_);
    return ServingLocked();
  }
  // Checked against, and answered with, the last durable membership: no lock the disk can hold.
  const std::shared_ptr<const MembershipState> durable = Published();
  if (durable == nullptr) {  // starting: the log is not open yet (the beat counts all the same)
    beats_.Record(req.site(), req.incarnation(), NowSeconds());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is starting");
  }
  if (auto st = StatusOf(durable->CheckMember(req.site(), req.incarnation())); !st.ok()) return st;
  beats_.Record(req.site(), req.incarnation(), NowSeconds());
  FillReply(durable->Current(), reply);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::Round(grpc::ServerContext* ctx, const coord::RoundRequest& req,
                                    coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Round", req.site()); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, "Round", req, kCoordinatorMaxSmallRequestBytes); !st.ok())
    return st;
  const int64_t r = req.round();
  if (r < 0)
    return RefuseCall(*ctx, "Round", grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: round {} is negative", req.site(), r));
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  if (auto st = StatusOf(state_.CheckMember(req.site(), req.incarnation())); !st.ok())
    return Answer(lk, st);
  // A pace that is not a finite non-negative number would be logged as null and break the log's
  // replay at a restart.
  if (req.has_vote() && !(std::isfinite(req.vote_seconds()) && req.vote_seconds() >= 0))
    return RefuseCall(*ctx, "Round", grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: a vote's seconds per micro-batch is {}", req.site(),
                                  req.vote_seconds()));
  std::optional<RoundVote> vote;
  if (req.has_vote()) vote = RoundVote{req.vote_failed(), req.vote_digest(), req.vote_seconds()};
  state_.ReachRound(req.site(), r, vote);
  if (auto next = state_.NextConsequence(); next && !CommitLocked(*next)) return ServingLocked();
  const auto deadline = WaitDeadline(*ctx);
  while (state_.completed_round() < r) {
    if (auto st = ServingLocked(); !st.ok()) return st;
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (auto st = StatusOf(state_.CheckMember(req.site(), req.incarnation())); !st.ok())
      return Answer(lk, st);
    if (Clock::now() >= deadline)
      return Answer(lk,
                    grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                                 fmt::format("round {}: still waiting for {}", r, state_.Late(r))));
    cv_.wait_until(lk, std::min(deadline, Clock::now() + milliseconds(100)));
  }
  FillReply(state_.RoundResult(r), reply);
  return Answer(lk, grpc::Status::OK);
}

grpc::Status CoordinatorImpl::Peek(grpc::ServerContext* ctx, const coord::PeekRequest& req,
                                   coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Peek", req.site()); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, "Peek", req, kCoordinatorMaxSmallRequestBytes); !st.ok())
    return st;
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  FillReply(state_.Current(), reply);
  return Answer(lk, grpc::Status::OK);
}

grpc::Status CoordinatorImpl::Leave(grpc::ServerContext* ctx, const coord::LeaveRequest& req,
                                    coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Leave", req.site()); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, "Leave", req, kCoordinatorMaxSmallRequestBytes); !st.ok())
    return st;
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = ServingLocked(); !st.ok()) return st;
  Json record;
  const Verdict v = state_.PlanLeave(req.site(), req.incarnation(), &record);
  if (!v.ok() && v.refusal != Refusal::kGone) return Answer(lk, StatusOf(v));
  if (v.ok()) {  // else already dead or gone: nothing to do
    if (!CommitLocked(record)) return ServingLocked();
    LogInfo("coordinator: site {} left (epoch {}, {} live sites)", req.site(),
            state_.Current().epoch, state_.Current().live());
  }
  FillReply(state_.Current(), reply);
  return Answer(lk, grpc::Status::OK);
}

grpc::Status Service::Register(grpc::ServerContext* ctx, const coord::RegisterRequest* req,
                               coord::Reply* reply) {
  return c_->Register(ctx, *req, reply);
}
grpc::Status Service::Heartbeat(grpc::ServerContext* ctx, const coord::HeartbeatRequest* req,
                                coord::Reply* reply) {
  return c_->Heartbeat(ctx, *req, reply);
}
grpc::Status Service::Round(grpc::ServerContext* ctx, const coord::RoundRequest* req,
                            coord::Reply* reply) {
  return c_->Round(ctx, *req, reply);
}
grpc::Status Service::Peek(grpc::ServerContext* ctx, const coord::PeekRequest* req,
                           coord::Reply* reply) {
  return c_->Peek(ctx, *req, reply);
}
grpc::Status Service::Leave(grpc::ServerContext* ctx, const coord::LeaveRequest* req,
                            coord::Reply* reply) {
  return c_->Leave(ctx, *req, reply);
}
grpc::Status Service::PsInit(grpc::ServerContext* ctx, const coord::PsInitRequest* req,
                             coord::PsInitReply* reply) {
  return c_->ps().Init(ctx, *req, reply);
}
grpc::Status Service::PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest* req,
                             coord::PsPullReply* reply) {
  return c_->ps().Pull(ctx, *req, reply);
}
grpc::Status Service::PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest* req,
                             coord::PsPushReply* reply) {
  return c_->ps().Push(ctx, *req, reply);
}

}  // namespace

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Start(const CoordinatorOptions& options) {
  if (options.sites < 1)
    return Status::InvalidArgument(
        fmt::format("coordinator: the number of sites must be >= 1 (got {})", options.sites));
  if (!(options.heartbeat_s > 0) || options.heartbeat_s > 3600)
    return Status::InvalidArgument(
        fmt::format("coordinator: the heartbeat interval must be in (0, 3600] s (got {})",
                    options.heartbeat_s));
  if (options.dead_after_beats < 2 || options.dead_after_beats > 1000)
    return Status::InvalidArgument(
        fmt::format("coordinator: dead_after_beats must be in [2, 1000] (got {}): a site beats "
                    "every half interval, so fewer than 2 intervals would kill sites for a "
                    "single late beat",
                    options.dead_after_beats));
  if (options.state_dir.empty())
    return Status::InvalidArgument("coordinator: a state directory is required (--state DIR)");
  if (options.listen.rfind(':') == std::string::npos)
    return Status::InvalidArgument(
        fmt::format("coordinator: listen address '{}' is not HOST:PORT", options.listen));
  auto c = std::make_unique<CoordinatorImpl>(options);
  ATOLL_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Coordinator>(std::move(c));
}

}  // namespace atl
