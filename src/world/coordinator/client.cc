// The coordinator's client (world/coordinator.h): registration, rounds, leaving, the parameter
// server's calls and the heartbeat thread, each through ClientImpl's one retrying call
// (client_impl.h).
#include "world/coordinator/client_impl.h"

#include <cstring>

#include "core/build_info.h"

namespace atl {

namespace coordinator_client {

StatusOr<Membership> ClientImpl::DoRegister(Clock::time_point deadline, bool stoppable) {
  coord::RegisterRequest req;
  req.set_version(kCoordinatorProtocolVersion);
  req.set_site(options_.site);
  req.set_config_hash(options_.config_hash);
  req.set_incarnation(incarnation_);
  {
    std::lock_guard<std::mutex> lk(mu_);
    req.set_wan_address(wan_address_);
    if (join_round_ >= 0) {
      req.set_rejoin(true);
      req.set_join_round(join_round_);
      req.set_early_by(early_by_);
    }
  }
  coord::Reply reply;
  Status st = Call(
      "the registration", &Stub::Register, req, &reply, deadline,
      [&](const grpc::Status& s) -> std::optional<Next> {
        const auto code = s.error_code();
        if (req.rejoin() && code == grpc::StatusCode::OUT_OF_RANGE)
          return Next{Next::kStop, Status::NotFound(fmt::format(
                                       "coordinator {}: {}", options_.address, s.error_message()))};
        // The process this one replaces is live until the coordinator misses its heartbeats;
        // a process the coordinator forgot, or whose site it declared dead while it waited for
        // the quorum, tries again.
        if ((req.rejoin() && code == grpc::StatusCode::ALREADY_EXISTS) ||
            code == grpc::StatusCode::NOT_FOUND || code == grpc::StatusCode::ABORTED)
          return Next{Next::kBackoff, {}};
        return std::nullopt;
      },
      stoppable);
  if (!st.ok()) return st;
  AcceptReply(reply);
  std::lock_guard<std::mutex> lk(mu_);
  coordinator_id_ = reply.coordinator_id();
  registered_ = true;
  dead_ = false;
  ++generation_;
  unreachable_ = false;
  return membership_;
}

StatusOr<Membership> ClientImpl::Round(int64_t round, std::optional<RoundVote> vote) {
  const std::string what = fmt::format("round {}", round);
  ATOLL_RETURN_IF_ERROR(CheckMember(what));
  coord::RoundRequest req;
  req.set_site(options_.site);
  req.set_round(round);
  req.set_incarnation(incarnation_);
  if (vote) {
    req.set_has_vote(true);
    req.set_vote_failed(vote->failed);
    req.set_vote_digest(vote->digest);
    req.set_vote_seconds(vote->seconds);
  }
  const auto deadline = Deadline();
  coord::Reply reply;
  ATOLL_RETURN_IF_ERROR(Call(what, &Stub::Round, req, &reply, deadline, AsMember(what, deadline)));
  AcceptReply(reply);
  return FromProto(reply.membership());
}

Status ClientImpl::Leave() {
  StopHeartbeats();
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!registered_) return Status::Ok();
  }
  coord::LeaveRequest req;
  req.set_site(options_.site);
  req.set_incarnation(incarnation_);
  coord::Reply reply;
  Status st = Call("leaving", &Stub::Leave, req, &reply,
                   Clock::now() + SteadySeconds(std::min(options_.timeout_s, 10.0)),
                   [](const grpc::Status& s) -> std::optional<Next> {
                     if (s.error_code() == grpc::StatusCode::NOT_FOUND)
                       return Next{Next::kStop, Status::Ok()};  // not known: nothing to leave
                     return std::nullopt;
                   });
  if (st.ok()) {
    std::lock_guard<std::mutex> lk(mu_);
    registered_ = false;
  }
  return st;
}

// ---------------------------------------------------------------------------------------------
// The parameter server's calls.

StatusOr<int64_t> ClientImpl::PsClient::Init(std::span<const float> params, int64_t max_staleness) {
  coord::PsInitRequest req;
  req.set_site(c_->options_.site);
  req.set_incarnation(c_->incarnation_);
  req.set_params(reinterpret_cast<const char*>(params.data()), params.size_bytes());
  req.set_max_staleness(max_staleness);
  req.set_build_id(BuildId());
  req.set_cpu(CpuDescription());
  coord::PsInitReply reply;
  ATOLL_RETURN_IF_ERROR(c_->PsCall("Init", &Stub::PsInit, req, &reply));
  return reply.last_step();
}

StatusOr<int64_t> ClientImpl::PsClient::Pull(std::span<float> params) {
  coord::PsPullRequest req;
  req.set_site(c_->options_.site);
  req.set_incarnation(c_->incarnation_);
  req.set_count(params.size());
  coord::PsPullReply reply;
  ATOLL_RETURN_IF_ERROR(c_->PsCall("Pull", &Stub::PsPull, req, &reply));
  if (reply.params().size() != params.size_bytes())
    return Status::Corruption(
        fmt::format("site {}: parameter server Pull: {} bytes received for {} floats",
                    c_->options_.site, reply.params().size(), params.size()));
  std::memcpy(params.data(), reply.params().data(), params.size_bytes());
  return reply.version();
}

StatusOr<PsPushResult> ClientImpl::PsClient::Push(const PsUpdate& update) {
  if (update.site != c_->options_.site)
    return Status::InvalidArgument(
        fmt::format("parameter server Push: update of site {} through the client of site {}",
                    update.site, c_->options_.site));
  coord::PsPushRequest req;
  req.set_site(c_->options_.site);
  req.set_incarnation(c_->incarnation_);
  req.set_seq(++seq_);
  req.set_base_version(update.base_version);
  req.set_first_step(update.first_step);
  req.set_last_step(update.last_step);
  req.set_weight(update.weight);
  req.set_encoded(reinterpret_cast<const char*>(update.encoded.data()), update.encoded.size());
  coord::PsPushReply reply;
  const std::string what = fmt::format("Push (steps {}..{})", update.first_step, update.last_step);
  ATOLL_RETURN_IF_ERROR(c_->PsCall(what, &Stub::PsPush, req, &reply));
  PsPushResult r;
  r.accepted = reply.accepted();
  r.update_id = reply.update_id();
  r.applied_version = reply.applied_version();
  r.current_version = reply.current_version();
  return r;
}

// ---------------------------------------------------------------------------------------------
// Heartbeats.

void ClientImpl::StartHeartbeats() {
  std::lock_guard<std::mutex> lk(hb_mu_);
  if (hb_thread_.joinable()) return;
  hb_stop_ = false;
  hb_thread_ = std::thread([this] { HeartbeatLoop(); });
}

void ClientImpl::StopHeartbeats() {
  std::thread t;
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    hb_stop_ = true;
    if (hb_call_ != nullptr) hb_call_->TryCancel();
    t = std::move(hb_thread_);
  }
  hb_cv_.notify_all();
  if (t.joinable()) t.join();
}

void ClientImpl::HeartbeatLoop() {
  auto next = Clock::now();
  bool first = true;  // at once: the registration counted as a beat, but its reply may have waited
  while (true) {
    double interval;
    {
      std::lock_guard<std::mutex> lk(mu_);
      interval = heartbeat_s_;
    }
    // Two beats per interval: one late or lost beat never makes a site look silent.
    if (!first) next = std::max(next + SteadySeconds(interval / 2), Clock::now());
    first = false;
    {
      std::unique_lock<std::mutex> lk(hb_mu_);
      if (hb_cv_.wait_until(lk, next, [&] { return hb_stop_; })) return;
    }
    SendHeartbeat();
  }
}

void ClientImpl::SendHeartbeat() {
  coord::HeartbeatRequest req;
  uint64_t known_id, generation;
  double interval;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (dead_) return;
    generation = generation_;
    req.set_epoch(membership_.epoch);
    known_id = coordinator_id_;
    interval = heartbeat_s_;
  }
  req.set_site(options_.site);
  req.set_incarnation(incarnation_);
  coord::Reply reply;
  grpc::ClientContext ctx;
  // A beat later than one interval is worth little: the next one is due by then. At least 0.5 s,
  // so a reconnection (a TCP and TLS handshake) fits.
  ctx.set_deadline(ToSystemClock(Clock::now() + SteadySeconds(std::max(interval, 0.5))));
  AddToken(&ctx, options_.security);
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    if (hb_stop_) return;
    hb_call_ = &ctx;
  }
  const grpc::Status st = beat_stub_->Heartbeat(&ctx, req, &reply);
  {
    std::lock_guard<std::mutex> lk(hb_mu_);
    hb_call_ = nullptr;
  }
  const auto code = st.error_code();
  bool reregister = false;
  if (st.ok()) {
    AcceptReply(reply);
    std::lock_guard<std::mutex> lk(mu_);
    if (unreachable_) LogInfo("site {}: the coordinator is reachable again", options_.site);
    unreachable_ = false;
    if (reply.coordinator_id() != known_id) {
      LogInfo("site {}: the coordinator at {} restarted; registering again", options_.site,
              options_.address);
      reregister = true;
    }
  } else if (code == grpc::StatusCode::NOT_FOUND) {
    LogInfo("site {}: {}; registering again", options_.site, st.error_message());
    reregister = true;
  } else if (code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::ALREADY_EXISTS) {
    std::lock_guard<std::mutex> lk(mu_);
    if (generation == generation_) {
      LogWarning("site {}: {}", options_.site, st.error_message());
      dead_ = true;
      dead_reason_ = st.error_message();
    }
  } else if (code != grpc::StatusCode::CANCELLED) {
    std::lock_guard<std::mutex> lk(mu_);
    if (!unreachable_)
      LogWarning("site {}: heartbeat to the coordinator at {} failed ({}); retrying", options_.site,
                 options_.address, st.error_message());
    unreachable_ = true;
  }
  if (reregister) {
    // Registering retries for up to timeout_s; heartbeats pause meanwhile (the coordinator that
    // forgot this process does not count its silence).
    auto m = DoRegister(Deadline(), /*stoppable=*/true);
    if (!m.ok() && m.status().message() != "client stopping")
      LogWarning("site {}: registering again failed: {}", options_.site, m.status().ToString());
  }
}

}  // namespace coordinator_client

StatusOr<std::unique_ptr<CoordinatorClient>> CoordinatorClient::Connect(
    const CoordinatorClientOptions& options) {
  if (options.address.empty() || options.address.rfind(':') == std::string::npos)
    return Status::InvalidArgument(fmt::format(
        "coordinator client: the coordinator address '{}' is not HOST:PORT", options.address));
  if (options.site < 0)
    return Status::InvalidArgument(
        fmt::format("coordinator client: site {} is negative", options.site));
  if (!(options.heartbeat_s > 0))
    return Status::InvalidArgument("coordinator client: heartbeat_s must be > 0");
  if (!(options.timeout_s > 0))
    return Status::InvalidArgument("coordinator client: timeout_s must be > 0");
  return std::unique_ptr<CoordinatorClient>(std::make_unique<coordinator_client::ClientImpl>(options));
}

}  // namespace atl
