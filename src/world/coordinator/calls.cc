// The coordinator's calls (world/coordinator/server_impl.h): each authenticated (the token, the
// site's range, the certificate naming the site), sized, checked against the membership and
// answered once what it saw is durable; Register and Round wait, up to the caller's deadline, for
// the quorum or the round; heartbeats go to the BeatBoard, without the lock or the disk; the
// parameter server's calls are handed to PsService.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <string>

#include "core/log.h"
#include "world/coordinator/server_impl.h"
#include "world/coordinator/wire.h"
#include "world/security.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Json = nlohmann::json;

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

}  // namespace

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

grpc::Status CoordinatorService::Register(grpc::ServerContext* ctx,
                                          const coord::RegisterRequest* req, coord::Reply* reply) {
  return c_->Register(ctx, *req, reply);
}
grpc::Status CoordinatorService::Heartbeat(grpc::ServerContext* ctx,
                                           const coord::HeartbeatRequest* req,
                                           coord::Reply* reply) {
  return c_->Heartbeat(ctx, *req, reply);
}
grpc::Status CoordinatorService::Round(grpc::ServerContext* ctx, const coord::RoundRequest* req,
                                       coord::Reply* reply) {
  return c_->Round(ctx, *req, reply);
}
grpc::Status CoordinatorService::Peek(grpc::ServerContext* ctx, const coord::PeekRequest* req,
                                      coord::Reply* reply) {
  return c_->Peek(ctx, *req, reply);
}
grpc::Status CoordinatorService::Leave(grpc::ServerContext* ctx, const coord::LeaveRequest* req,
                                       coord::Reply* reply) {
  return c_->Leave(ctx, *req, reply);
}
grpc::Status CoordinatorService::PsInit(grpc::ServerContext* ctx, const coord::PsInitRequest* req,
                                        coord::PsInitReply* reply) {
  return c_->ps().Init(ctx, *req, reply);
}
grpc::Status CoordinatorService::PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest* req,
                                        coord::PsPullReply* reply) {
  return c_->ps().Pull(ctx, *req, reply);
}
grpc::Status CoordinatorService::PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest* req,
                                        coord::PsPushReply* reply) {
  return c_->ps().Push(ctx, *req, reply);
}

}  // namespace atl
