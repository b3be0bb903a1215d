// The coordinator's server (world/coordinator/server_impl.h), its life and its state's
// durability: start (the log replayed, the port, the grace of replayed live sites), shutdown,
// records committed and made durable before any reply shows them, the state published to
// heartbeats, and the monitor that declares silent sites dead. The calls are in calls.cc.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "core/file.h"
#include "core/log.h"
#include "world/coordinator/server_impl.h"
#include "world/security.h"

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;
using Json = nlohmann::json;

constexpr const char* kLogName = "coordinator.log";

}  // namespace

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
  const MembershipSnapshot snap = CaptureLocked();
  lk.unlock();
  if (Status synced = log_.Sync(ticket); !synced.ok()) {
    lk.lock();
    StopLocked(synced);
    return ServingLocked();
  }
  Publish(snap);
  return st;
}

MembershipSnapshot CoordinatorImpl::CaptureLocked() {
  if (captured_.state == nullptr || captured_.version != version_)
    captured_ = {version_, std::make_shared<const MembershipState>(state_)};
  return captured_;
}

void CoordinatorImpl::Publish(const MembershipSnapshot& s) {
  std::lock_guard<std::mutex> lk(pub_mu_);
  if (published_.state == nullptr || s.version > published_.version) published_ = s;
}

std::shared_ptr<const MembershipState> CoordinatorImpl::Published() const {
  std::lock_guard<std::mutex> lk(pub_mu_);
  return published_.state;
}

void CoordinatorImpl::Monitor() {
  const auto period =
      std::max<Clock::duration>(milliseconds(5), SteadySeconds(options_.heartbeat_s / 20));
  const double period_s = std::chrono::duration<double>(period).count();
  // Looks further apart than this mean the coordinator did not run meanwhile: its process was
  // stopped, its machine lost the CPU (a VM's stolen time), or the monitor waited for mu_. Beats
  // sent meanwhile may wait in its sockets, unheard, so that time is not the sites' silence: it
  // is taken out of every site's (MembershipState::Pause) before the beats heard are folded in.
  // Silence then counts only while the coordinator runs: a site that really died is declared
  // dead after a dead-site time of the coordinator's running, however often it stalls.
  const double stalled_after = std::max(options_.heartbeat_s / 2, 4 * period_s);
  double last_look = NowSeconds();
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_ && failure_.ok()) {
    cv_.wait_for(lk, period);
    if (stopping_ || !failure_.ok()) break;
    const double now = NowSeconds();  // one clock reading for the whole look
    const double gap = now - last_look;
    last_look = now;
    if (gap > stalled_after) {
      state_.Pause(gap - period_s, now);
      LogWarning(
          "coordinator: it did not run for {:.2f} s (its process stopped, starved of CPU or "
          "waiting for its lock): that time is not counted as any site's silence",
          gap);
    }
    beats_.FoldInto(state_, now);
    bool died = false;
    while (auto death = state_.NextDeath(now)) {
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
    const MembershipSnapshot snap = CaptureLocked();
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
