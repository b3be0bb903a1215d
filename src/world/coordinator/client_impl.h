// The coordinator's client (world/coordinator.h), declared for its file client.cc: one retrying
// call (Call) that every request goes through, the member's and the parameter server's handling
// of failures, and the state the heartbeat thread shares with the calls. client.cc defines
// registration, rounds, leaving, the parameter server's calls and the heartbeats.
#pragma once

#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>

#include "core/log.h"
#include "core/rng.h"
#include "core/status.h"
#include "world/coordinator.h"
#include "world/coordinator/wire.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/security.h"

namespace atl::coordinator_client {

using Clock = std::chrono::steady_clock;
using Stub = coord::Coordinator::Stub;

inline bool IsRefusal(grpc::StatusCode c) {
  return c == grpc::StatusCode::INVALID_ARGUMENT || c == grpc::StatusCode::FAILED_PRECONDITION ||
         c == grpc::StatusCode::ALREADY_EXISTS || c == grpc::StatusCode::UNAUTHENTICATED ||
         c == grpc::StatusCode::PERMISSION_DENIED || c == grpc::StatusCode::OUT_OF_RANGE;
}

inline bool IsRetryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED ||
         c == grpc::StatusCode::CANCELLED || c == grpc::StatusCode::UNKNOWN ||
         c == grpc::StatusCode::INTERNAL || c == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

// A failed TLS handshake (wrong CA, wrong certificate) reads as UNAVAILABLE; recognize it so a
// misconfigured site fails quickly with a clear message instead of retrying until timeout_s.
inline bool LooksLikeTls(const std::string& msg) {
  std::string m = msg;
  for (auto& c : m) c = char(std::tolower(static_cast<unsigned char>(c)));
  return m.find("handshake") != std::string::npos || m.find("ssl") != std::string::npos ||
         m.find("certificate") != std::string::npos || m.find("tls") != std::string::npos;
}

class ClientImpl final : public CoordinatorClient {
 public:
  explicit ClientImpl(const CoordinatorClientOptions& o)
      : options_(o), incarnation_(RandomIdentity()), heartbeat_s_(o.heartbeat_s) {
    grpc::ChannelArguments args;
    // Reconnect quickly to a restarted coordinator (gRPC's default backoff grows to 120 s).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = coord::Coordinator::NewStub(
        MakeChannel(o.address, o.security, kCoordinatorParty, args, kCoordinatorMaxMessageBytes));
    // Heartbeats get a connection of their own: never queued behind a parameter-server transfer
    // of hundreds of MB on the main one (a channel with its own subchannel pool does not share
    // the main channel's connection).
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    auto beat_channel = MakeChannel(o.address, o.security, kCoordinatorParty, args, 1 << 20);
    beat_channel->GetState(/*try_to_connect=*/true);  // connected (TLS too) before the first beat
    beat_stub_ = coord::Coordinator::NewStub(beat_channel);
  }
  ~ClientImpl() override { StopHeartbeats(); }

  StatusOr<Membership> Register(const std::string& wan_address) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      wan_address_ = wan_address;
    }
    ATOLL_ASSIGN_OR_RETURN(Membership m, DoRegister(Deadline()));
    StartHeartbeats();
    return m;
  }

  StatusOr<Membership> Rejoin(const std::string& wan_address, int64_t join_round,
                              int64_t early_by) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      wan_address_ = wan_address;
      join_round_ = join_round;
      early_by_ = early_by;
    }
    StatusOr<Membership> m = DoRegister(Deadline());
    {
      // Registered (or not) now; a later re-registration (a restarted coordinator) is plain.
      std::lock_guard<std::mutex> lk(mu_);
      join_round_ = -1;
    }
    if (m.ok()) StartHeartbeats();
    return m;
  }

  StatusOr<Membership> Peek() override {
    coord::PeekRequest req;
    req.set_site(options_.site);
    coord::Reply reply;
    ATOLL_RETURN_IF_ERROR(Call("a look at the membership", &Stub::Peek, req, &reply, Deadline()));
    return FromProto(reply.membership());
  }

  StatusOr<Membership> Round(int64_t round, std::optional<RoundVote> vote) override;
  Status Leave() override;
  ParameterServer* ps() override { return &ps_; }

 private:
  // ps(): the coordinator's parameter server, called as this site.
  class PsClient final : public ParameterServer {
   public:
    explicit PsClient(ClientImpl* c) : c_(c) {}
    StatusOr<int64_t> Init(std::span<const float> params, int64_t max_staleness) override;
    StatusOr<int64_t> Pull(std::span<float> params) override;
    StatusOr<PsPushResult> Push(const PsUpdate& update) override;

   private:
    ClientImpl* c_;
    std::atomic<uint64_t> seq_{0};
  };

  // What a failed attempt of Call leads to: wait and try again, try again at once (after
  // registering again), or end with `status`.
  struct Next {
    enum Kind { kBackoff, kAgain, kStop } kind = kBackoff;
    Status status;
  };
  // Sees a failed attempt first; std::nullopt leaves it to Call's own handling.
  using OnFailure = std::function<std::optional<Next>(const grpc::Status&)>;

  template <class Req, class Rep>
  using Rpc = grpc::Status (Stub::*)(grpc::ClientContext*, const Req&, Rep*);

  Clock::time_point Deadline() const { return Clock::now() + SteadySeconds(options_.timeout_s); }

  // Calls `rpc` until it succeeds, with the retries every call of the client shares: failures a
  // restart or a network blip explains (UNAVAILABLE and the like) are retried with backoff (50 ms
  // .. 1 s) until `deadline`; a refusal ends at once (kInvalidArgument with the coordinator's
  // reason), as does a TLS handshake failing three times in a row; anything else is kInternal.
  // `on_failure` sees every failure first and may take it over. `what` names the call in errors.
  // On the heartbeat thread (stoppable), StopHeartbeats cancels the attempt in flight and ends
  // the waits between attempts ("client stopping").
  template <class Req, class Rep>
  Status Call(const std::string& what, Rpc<Req, Rep> rpc, const Req& req, Rep* reply,
              Clock::time_point deadline, const OnFailure& on_failure = nullptr,
              bool stoppable = false) {
    double delay = 0.05;
    const double budget_s = std::chrono::duration<double>(deadline - Clock::now()).count();
    int tls_failures = 0;
    std::string reason;
    const Status stopping = Status::Unavailable("client stopping");
    for (;;) {
      grpc::ClientContext ctx;
      ctx.set_deadline(ToSystemClock(deadline));
      AddToken(&ctx, options_.security);
      if (stoppable) {
        std::lock_guard<std::mutex> lk(hb_mu_);
        if (hb_stop_) return stopping;
        hb_call_ = &ctx;
      }
      const grpc::Status st = (stub_.get()->*rpc)(&ctx, req, reply);
      if (stoppable) {
        std::lock_guard<std::mutex> lk(hb_mu_);
        hb_call_ = nullptr;
      }
      if (st.ok()) return Status::Ok();
      const auto code = st.error_code();
      // The coordinator's own reason (e.g. who is late) is worth more than a bare timeout.
      if (!(code == grpc::StatusCode::DEADLINE_EXCEEDED &&
            st.error_message() == "Deadline Exceeded" && !reason.empty()))
        reason = st.error_message();
      std::optional<Next> next = on_failure ? on_failure(st) : std::nullopt;
      if (!next) {
        if (IsRefusal(code))
          return Status::InvalidArgument(fmt::format("coordinator {} refused {} of site {}: {}",
                                                     options_.address, what, options_.site,
                                                     st.error_message()));
        if (!IsRetryable(code))
          return Status::Internal(fmt::format("site {}: {} at the coordinator {}: {}",
                                              options_.site, what, options_.address,
                                              st.error_message()));
        next = Next{Next::kBackoff, {}};
      }
      if (next->kind == Next::kStop) return next->status;
      if (next->kind == Next::kAgain) continue;
      if (code == grpc::StatusCode::UNAVAILABLE && LooksLikeTls(st.error_message())) {
        if (++tls_failures >= 3)
          return Status::InvalidArgument(fmt::format(
              "site {}: the TLS handshake with the coordinator at {} failed: {} (do the site and "
              "the coordinator use certificates from the same CA, and does the server's "
              "certificate name "
              "\"coordinator\"? see `atoll certs`)",
              options_.site, options_.address, st.error_message()));
      } else {
        tls_failures = 0;
      }
      // Each attempt runs to the overall deadline: a deadline error means time is up.
      if (code == grpc::StatusCode::DEADLINE_EXCEEDED || Clock::now() >= deadline) {
        const std::string hint =
            reason.find("Socket closed") != std::string::npos
                ? " (the coordinator closed the connection after the TLS handshake: is this "
                  "site's certificate signed by the coordinator's CA? see `atoll certs`)"
                : "";
        return Status::Unavailable(
            fmt::format("site {}: {} at the coordinator {}: not done "
                        "within {:.0f} s: {}{}",
                        options_.site, what, options_.address, budget_s, reason, hint));
      }
      const auto until = std::min(deadline, Clock::now() + SteadySeconds(delay));
      delay = std::min(delay * 2, 1.0);
      if (stoppable) {
        std::unique_lock<std::mutex> lk(hb_mu_);
        if (hb_cv_.wait_until(lk, until, [&] { return hb_stop_; })) return stopping;
      } else {
        std::this_thread::sleep_until(until);
      }
    }
  }

  // The handling of a call made as a registered member: ABORTED / ALREADY_EXISTS (this process
  // was declared dead, has left, or another process holds the site) end it with kUnavailable and
  // no later call is tried; NOT_FOUND (a restarted coordinator that has not seen this process)
  // registers again and retries.
  OnFailure AsMember(const std::string& what, Clock::time_point deadline) {
    return [this, what, deadline](const grpc::Status& st) -> std::optional<Next> {
      const auto code = st.error_code();
      if (code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::ALREADY_EXISTS) {
        std::lock_guard<std::mutex> lk(mu_);
        dead_ = true;
        dead_reason_ = st.error_message();
        return Next{Next::kStop,
                    Status::Unavailable(fmt::format("{}: {}", what, st.error_message()))};
      }
      if (code == grpc::StatusCode::NOT_FOUND) {
        LogInfo("site {}: the coordinator does not know this site ({}); registering again",
                options_.site, st.error_message());
        auto m = DoRegister(deadline);
        if (!m.ok()) return Next{Next::kStop, m.status().WithContext(what)};
        return Next{Next::kAgain, {}};
      }
      return std::nullopt;
    };
  }

  // A parameter server call: as a member, then the server's refusals mapped to the codes
  // world/ps.h's callers see.
  template <class Req, class Rep>
  Status PsCall(const std::string& name, Rpc<Req, Rep> rpc, const Req& req, Rep* reply) {
    const std::string what = "parameter server " + name;
    ATOLL_RETURN_IF_ERROR(CheckMember(what));
    const auto deadline = Deadline();
    const OnFailure member = AsMember(what, deadline);
    return Call(what, rpc, req, reply, deadline, [&](const grpc::Status& s) -> std::optional<Next> {
      if (auto m = member(s)) return m;
      const std::string msg = fmt::format("site {}: {} at {}: {}", options_.site, what,
                                          options_.address, s.error_message());
      switch (s.error_code()) {
        case grpc::StatusCode::INVALID_ARGUMENT:
        case grpc::StatusCode::OUT_OF_RANGE:
        case grpc::StatusCode::UNAUTHENTICATED:
        case grpc::StatusCode::PERMISSION_DENIED:
        case grpc::StatusCode::RESOURCE_EXHAUSTED:  // a message over the limit
          return Next{Next::kStop, Status::InvalidArgument(msg)};
        case grpc::StatusCode::DATA_LOSS:
          return Next{Next::kStop, Status::Corruption(msg)};
        case grpc::StatusCode::FAILED_PRECONDITION:  // no parameters, lost, log
        case grpc::StatusCode::UNIMPLEMENTED:        // a coordinator without a PS
          return Next{Next::kStop, Status::Internal(msg)};
        default:
          return std::nullopt;
      }
    });
  }

  // OK when this client may call as a member (registered, not declared dead).
  Status CheckMember(const std::string& what) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!registered_)
      return Status::Internal(fmt::format("site {}: {} before Register", options_.site, what));
    if (dead_) return Status::Unavailable(fmt::format("{}: {}", what, dead_reason_));
    return Status::Ok();
  }

  // Takes a reply's membership. on_membership sees every newer epoch once, in order, one call
  // at a time: replies arrive out of order (a Round's is the membership when the round
  // completed, often older than a heartbeat's), and only durable state is ever in a reply, so
  // epochs only grow, across coordinator restarts too.
  void AcceptReply(const coord::Reply& reply) {
    Membership m = FromProto(reply.membership());
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (m.epoch >= membership_.epoch) membership_ = m;
      if (reply.heartbeat_s() > 0)
        heartbeat_s_ = std::min(options_.heartbeat_s, reply.heartbeat_s());
    }
    if (!options_.on_membership) return;
    std::lock_guard<std::mutex> lk(notify_mu_);
    if (m.epoch <= notified_epoch_) return;
    notified_epoch_ = m.epoch;
    options_.on_membership(m);
  }

  StatusOr<Membership> DoRegister(Clock::time_point deadline, bool stoppable = false);
  void StartHeartbeats();
  void StopHeartbeats();
  void HeartbeatLoop();
  void SendHeartbeat();

  const CoordinatorClientOptions options_;
  const uint64_t incarnation_;
  std::unique_ptr<Stub> stub_, beat_stub_;

  std::mutex mu_;  // guards the fields below
  std::string wan_address_;
  int64_t join_round_ = -1;  // >= 0 while Rejoin registers
  int64_t early_by_ = 0;
  bool registered_ = false;
  bool dead_ = false;  // declared dead or left: no heartbeats until registered again
  std::string dead_reason_;
  uint64_t generation_ = 0;  // successful registrations (a stale heartbeat reply is ignored)
  uint64_t coordinator_id_ = 0;
  Membership membership_;
  double heartbeat_s_;
  bool unreachable_ = false;

  std::mutex notify_mu_;  // serializes on_membership
  int64_t notified_epoch_ = 0;

  std::mutex hb_mu_;  // guards hb_stop_, hb_call_
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  grpc::ClientContext* hb_call_ = nullptr;
  std::thread hb_thread_;

  PsClient ps_{this};
};

}  // namespace atl::coordinator_client
