#include "world/coordinator.h"

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>
#include <utility>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "world/codec.h"
#include "world/proto/coordinator.grpc.pb.h"

namespace atl {

int Membership::live() const {
  int n = 0;
  for (const auto& s : sites) n += s.alive ? 1 : 0;
  return n;
}

namespace {

// Floats travel as their in-memory bytes; the wire format is little-endian float32.
static_assert(std::endian::native == std::endian::little, "the PS wire format is little-endian");

using Clock = std::chrono::steady_clock;
using std::chrono::duration;
using std::chrono::milliseconds;
using Json = nlohmann::json;

uint64_t RandomU64() {
  std::random_device rd;
  uint64_t v = (uint64_t(rd()) << 32) ^ uint64_t(rd());
  return v == 0 ? 1 : v;
}

double UnixNow() {
  return duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

Clock::duration Seconds(double s) {
  return std::chrono::duration_cast<Clock::duration>(duration<double>(s));
}

std::chrono::system_clock::time_point ToSystem(Clock::time_point t) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(t - Clock::now());
}

std::string Hex(uint64_t v) { return fmt::format("{:016x}", v); }

void ToProto(const Membership& m, coord::Membership* p) {
  p->set_epoch(m.epoch);
  for (const auto& s : m.sites) {
    auto* q = p->add_sites();
    q->set_site(s.site);
    q->set_wan_address(s.wan_address);
    q->set_alive(s.alive);
    q->set_last_round(s.last_round);
    q->set_join_round(s.join_round);
  }
}

Membership FromProto(const coord::Membership& p) {
  Membership m;
  m.epoch = p.epoch();
  for (const auto& q : p.sites()) {
    SiteInfo s;
    s.site = q.site();
    s.wan_address = q.wan_address();
    s.alive = q.alive();
    s.last_round = q.last_round();
    s.join_round = q.join_round();
    m.sites.push_back(std::move(s));
  }
  return m;
}

// ---------------------------------------------------------------------------------------------
// The durable log: JSON lines, appended and fdatasync'ed.

class DurableLog {
 public:
  ~DurableLog() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Reads every complete record; a torn last line (no newline: never acknowledged) is cut off.
  static StatusOr<std::vector<Json>> Replay(const std::string& path) {
    std::vector<Json> out;
    if (!FileExists(path)) return out;
    ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(path));
    size_t end = text.rfind('\n');
    size_t good = end == std::string::npos ? 0 : end + 1;
    if (good < text.size()) {
      LogWarning("coordinator: {}: dropping a torn last record ({} bytes, never acknowledged)",
                 path, text.size() - good);
      if (::truncate(path.c_str(), off_t(good)) != 0)
        return Status::IoError(
            fmt::format("truncating the torn tail of {}: {}", path, std::strerror(errno)));
    }
    size_t pos = 0;
    int line = 0;
    while (pos < good) {
      size_t nl = text.find('\n', pos);
      std::string_view l(text.data() + pos, nl - pos);
      pos = nl + 1;
      ++line;
      if (l.empty()) continue;
      Json j = Json::parse(l, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("t") || !j["t"].is_string())
        return Status::Corruption(
            fmt::format("{} line {}: not a coordinator record: {}", path, line, l));
      j["_line"] = line;
      out.push_back(std::move(j));
    }
    return out;
  }

  Status Open(const std::string& path) {
    bool existed = FileExists(path);
    fd_ = ::open(path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::IoError(fmt::format("opening {}: {}", path, std::strerror(errno)));
    path_ = path;
    if (!existed) {
      auto dir = path.substr(0, path.rfind('/'));
      return SyncDir(dir.empty() ? "." : dir);
    }
    return Status::Ok();
  }

  Status Append(Json j) {
    j["time"] = UnixNow();
    std::string line = j.dump() + "\n";
    size_t done = 0;
    while (done < line.size()) {
      ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::IoError(fmt::format("appending to {}: {}", path_, std::strerror(errno)));
      }
      done += size_t(n);
    }
    if (::fdatasync(fd_) != 0)
      return Status::IoError(fmt::format("fdatasync of {}: {}", path_, std::strerror(errno)));
    return Status::Ok();
  }

 private:
  int fd_ = -1;
  std::string path_;
};

// ---------------------------------------------------------------------------------------------
// The server.

enum class SiteState { kUnregistered, kAlive, kDead, kLeft };

struct SiteRecord {
  SiteState state = SiteState::kUnregistered;
  std::string wan_address;
  uint64_t incarnation = 0;
  int64_t last_round = -1;
  int64_t join_round = 0;  // a rejoined process takes part from this round on
  Clock::time_point last_heartbeat;
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
      : options_(o), id_(RandomU64()), sites_(size_t(o.sites)), service_(this) {}
  ~CoordinatorImpl() override { Shutdown(); }

  Status Init();
  std::string address() const override { return address_; }
  Membership membership() const override {
    std::lock_guard<std::mutex> lk(mu_);
    return CurrentLocked();
  }
  void Shutdown() override;

  grpc::Status Register(grpc::ServerContext* ctx, const coord::RegisterRequest& req,
                        coord::Reply* reply);
  grpc::Status Heartbeat(grpc::ServerContext* ctx, const coord::HeartbeatRequest& req,
                         coord::Reply* reply);
  grpc::Status Round(grpc::ServerContext* ctx, const coord::RoundRequest& req, coord::Reply* reply);
  grpc::Status Leave(grpc::ServerContext* ctx, const coord::LeaveRequest& req, coord::Reply* reply);
  grpc::Status Peek(grpc::ServerContext* ctx, const coord::PeekRequest& req, coord::Reply* reply);
  grpc::Status PsInit(grpc::ServerContext* ctx, const coord::PsInitRequest& req,
                      coord::PsInitReply* reply);
  grpc::Status PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest& req,
                      coord::PsPullReply* reply);
  grpc::Status PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest& req,
                      coord::PsPushReply* reply);

 private:
  // The parameter server's part of Init: reads DIR/ops.jsonl if there is one.
  Status InitPs();
  // Authenticates a PS call and checks that (site, incarnation) is a live member.
  grpc::Status CheckPsCaller(const grpc::ServerContext& ctx, const char* rpc, int site,
                             uint64_t incarnation) const;
  // OK when the parameter server can serve (initialized unless `init`); else the reason.
  grpc::Status PsUsableLocked(const grpc::ServerContext& ctx, const char* rpc, int site,
                              bool init) const;
  void BreakPsLocked(const std::string& why);
  Status ApplyRecord(const Json& j, const std::string& path);
  grpc::Status Authorize(const grpc::ServerContext& ctx, const char* rpc) const;
  grpc::Status Refuse(const grpc::ServerContext& ctx, const char* rpc, grpc::StatusCode code,
                      const std::string& msg) const;
  grpc::Status CheckSite(const grpc::ServerContext& ctx, const char* rpc, int site) const;
  // OK when (site, incarnation) is a live member; otherwise NOT_FOUND / ABORTED / ALREADY_EXISTS.
  grpc::Status CheckMemberLocked(int site, uint64_t incarnation) const;
  Membership CurrentLocked() const;
  void FillReply(const Membership& m, coord::Reply* reply) const;
  void MaybeQuorumLocked();
  void MaybeCompleteRoundsLocked();
  void DeclareDeadLocked(int site, double silent_s);
  std::string MissingLocked() const;
  std::string LateLocked(int64_t round) const;
  void Monitor();
  Clock::time_point WaitDeadline(const grpc::ServerContext& ctx) const;

  const CoordinatorOptions options_;
  const uint64_t id_;
  std::string address_;
  std::string log_path_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<SiteRecord> sites_;
  int64_t epoch_ = 0;
  bool have_hash_ = false;
  uint64_t config_hash_ = 0;
  int hash_site_ = -1;
  bool quorum_ = false;
  int64_t completed_round_ = -1;
  std::map<int64_t, Membership> rounds_;  // recent completed rounds: who took part
  bool stopping_ = false;
  DurableLog log_;

  // The parameter server (ps_mu_; never held together with mu_).
  struct PushMemo {
    uint64_t incarnation = 0, seq = 0;
    coord::PsPushReply reply;
  };
  mutable std::mutex ps_mu_;
  std::string ops_path_;
  DurableLog ops_;
  bool ops_open_ = false;
  bool ps_logged_init_ = false;  // ops.jsonl has the init record (this or an earlier process)
  bool ps_init_ = false;         // ps_params_ hold the parameters
  uint64_t ps_count_ = 0, ps_checksum_ = 0;
  int ps_init_site_ = -1;
  int64_t ps_max_staleness_ = 0;
  std::vector<float> ps_params_, ps_scratch_;
  int64_t ps_version_ = 0, ps_next_id_ = 0;
  std::map<int, int64_t> ps_last_step_;  // by site: the last step of its decided pushes
  std::map<int, uint64_t> ps_rejoined_;   // by site: the process whose rejoin is logged
  std::string ps_broken_;  // non-empty: every PS call is refused with this reason
  std::vector<std::deque<PushMemo>> ps_memo_;  // per site: recent pushes, for retries

  std::mutex shutdown_mu_;
  bool shut_down_ = false;
  Service service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread monitor_;
};

constexpr size_t kKeptRounds = 64;
constexpr const char* kLogName = "coordinator.log";
constexpr const char* kOpsName = "ops.jsonl";
constexpr size_t kKeptPushes = 16;  // per site, for answering retried pushes
constexpr const char* kPsLost =
    "the parameter server's state was lost with the coordinator's restart (replay the op log "
    "with `atoll replay`)";

Status CoordinatorImpl::ApplyRecord(const Json& j, const std::string& path) {
  const std::string t = j["t"].get<std::string>();
  const int line = j["_line"].get<int>();
  auto bad = [&](const std::string& what) {
    return Status::Corruption(fmt::format("{} line {}: {} record: {}", path, line, t, what));
  };
  try {
    if (t == "start") {
      int sites = j.at("sites").get<int>();
      if (sites != options_.sites)
        return Status::InvalidArgument(fmt::format(
            "{} belongs to a world of {} sites, not {}: use another --state directory or the "
            "same --sites",
            path, sites, options_.sites));
      return Status::Ok();
    }
    if (t == "restart") return Status::Ok();
    if (t == "quorum") {
      quorum_ = true;
      epoch_ = std::max(epoch_, j.at("epoch").get<int64_t>());
      return Status::Ok();
    }
    if (t == "round") {
      int64_t r = j.at("round").get<int64_t>();
      epoch_ = std::max(epoch_, j.at("epoch").get<int64_t>());
      for (int s : j.at("live").get<std::vector<int>>()) {
        if (s < 0 || s >= options_.sites) return bad(fmt::format("site {} out of range", s));
        if (sites_[size_t(s)].state == SiteState::kAlive)
          sites_[size_t(s)].last_round = std::max(sites_[size_t(s)].last_round, r);
      }
      completed_round_ = std::max(completed_round_, r);
      rounds_[r] = CurrentLocked();
      while (rounds_.size() > kKeptRounds) rounds_.erase(rounds_.begin());
      return Status::Ok();
    }
    int site = j.at("site").get<int>();
    if (site < 0 || site >= options_.sites) return bad(fmt::format("site {} out of range", site));
    auto& rec = sites_[size_t(site)];
    epoch_ = std::max(epoch_, j.at("epoch").get<int64_t>());
    if (t == "register") {
      rec.state = SiteState::kAlive;
      rec.incarnation = std::stoull(j.at("incarnation").get<std::string>(), nullptr, 16);
      rec.wan_address = j.at("wan").get<std::string>();
      rec.join_round = j.contains("join_round") ? j.at("join_round").get<int64_t>() : 0;
      rec.last_round = rec.join_round - 1;
      if (!have_hash_) {
        have_hash_ = true;
        config_hash_ = std::stoull(j.at("config_hash").get<std::string>(), nullptr, 16);
        hash_site_ = site;
      }
      return Status::Ok();
    }
    if (t == "death") {
      rec.state = SiteState::kDead;
      return Status::Ok();
    }
    if (t == "leave") {
      rec.state = SiteState::kLeft;
      return Status::Ok();
    }
  } catch (const std::exception& e) {
    return bad(e.what());
  }
  return Status::Corruption(fmt::format("{} line {}: unknown record type '{}'", path, line, t));
}

Status CoordinatorImpl::Init() {
  ATOLL_RETURN_IF_ERROR(MakeDirs(options_.state_dir));
  log_path_ = options_.state_dir + "/" + kLogName;
  ATOLL_ASSIGN_OR_RETURN(std::vector<Json> records, DurableLog::Replay(log_path_));
  std::unique_lock<std::mutex> lk(mu_);  // calls that arrive before the log is open wait
  for (const auto& j : records) ATOLL_RETURN_IF_ERROR(ApplyRecord(j, log_path_));
  ATOLL_RETURN_IF_ERROR(InitPs());
  // Replayed live sites get a grace period to find the restarted coordinator.
  const auto grace = Clock::now() + Seconds(std::max(options_.heartbeat_s, 1.0));
  for (auto& s : sites_) s.last_heartbeat = grace;

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

  ATOLL_RETURN_IF_ERROR(log_.Open(log_path_));
  if (records.empty()) {
    ATOLL_RETURN_IF_ERROR(log_.Append(
        {{"t", "start"}, {"sites", options_.sites}, {"version", kCoordinatorProtocolVersion}}));
  } else {
    const Membership m = CurrentLocked();
    std::string live;
    for (const auto& s : m.sites)
      if (s.alive) live += fmt::format("{}{}", live.empty() ? "" : ",", s.site);
    LogInfo("coordinator: resumed from {} ({} records): epoch {}, live sites [{}], last round {}",
            log_path_, records.size(), m.epoch, live, completed_round_);
    ATOLL_RETURN_IF_ERROR(log_.Append({{"t", "restart"}, {"epoch", m.epoch}}));
  }
  lk.unlock();
  monitor_ = std::thread([this] { Monitor(); });
  LogInfo("coordinator: listening on {} for {} sites (heartbeat {} s, {}), log {}", address_,
          options_.sites, options_.heartbeat_s,
          options_.security.insecure ? "INSECURE: no TLS, no token" : "mutual TLS + token",
          log_path_);
  return Status::Ok();
}

void CoordinatorImpl::Shutdown() {
  std::lock_guard<std::mutex> g(shutdown_mu_);
  if (shut_down_) return;
  shut_down_ = true;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now() + milliseconds(2000));
  if (monitor_.joinable()) monitor_.join();
  if (server_ != nullptr) server_->Wait();
}

Membership CoordinatorImpl::CurrentLocked() const {
  Membership m;
  m.epoch = epoch_;
  for (size_t i = 0; i < sites_.size(); ++i) {
    SiteInfo s;
    s.site = int(i);
    s.wan_address = sites_[i].wan_address;
    s.alive = sites_[i].state == SiteState::kAlive;
    s.last_round = sites_[i].last_round;
    s.join_round = sites_[i].join_round;
    m.sites.push_back(std::move(s));
  }
  return m;
}

void CoordinatorImpl::FillReply(const Membership& m, coord::Reply* reply) const {
  ToProto(m, reply->mutable_membership());
  reply->set_coordinator_id(id_);
  reply->set_heartbeat_s(options_.heartbeat_s);
}

grpc::Status CoordinatorImpl::Authorize(const grpc::ServerContext& ctx, const char* rpc) const {
  grpc::Status st = CheckToken(ctx, options_.security);
  if (!st.ok()) LogWarning("coordinator: refused {}: {}", rpc, st.error_message());
  return st;
}

grpc::Status CoordinatorImpl::Refuse(const grpc::ServerContext& ctx, const char* rpc,
                                     grpc::StatusCode code, const std::string& msg) const {
  LogWarning("coordinator: refused {} from {}: {}", rpc, ctx.peer(), msg);
  return grpc::Status(code, msg);
}

grpc::Status CoordinatorImpl::CheckSite(const grpc::ServerContext& ctx, const char* rpc,
                                        int site) const {
  if (site < 0 || site >= options_.sites)
    return Refuse(ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {} is out of range: this coordinator expects {} sites "
                              "(0..{})",
                              site, options_.sites, options_.sites - 1));
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::CheckMemberLocked(int site, uint64_t incarnation) const {
  const auto& rec = sites_[size_t(site)];
  switch (rec.state) {
    case SiteState::kUnregistered:
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          fmt::format("site {} is not registered with this coordinator", site));
    case SiteState::kAlive:
      if (rec.incarnation == incarnation) return grpc::Status::OK;
      return grpc::Status(grpc::StatusCode::ALREADY_EXISTS,
                          fmt::format("site {} is registered by another process (WAN address {})",
                                      site, rec.wan_address));
    case SiteState::kDead:
    case SiteState::kLeft:
      if (rec.incarnation != incarnation)
        return grpc::Status(grpc::StatusCode::NOT_FOUND,
                            fmt::format("site {} (this process) is not registered", site));
      return grpc::Status(
          grpc::StatusCode::ABORTED,
          fmt::format("site {} {} (membership epoch {}); register again to rejoin", site,
                      rec.state == SiteState::kDead ? "was declared dead by the coordinator"
                                                    : "has left the world",
                      epoch_));
  }
  return grpc::Status(grpc::StatusCode::INTERNAL, "bad site state");
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

std::string CoordinatorImpl::MissingLocked() const {
  std::string out;
  for (size_t i = 0; i < sites_.size(); ++i)
    if (sites_[i].state != SiteState::kAlive)
      out += fmt::format("{}{}", out.empty() ? "" : ", ", i);
  return out;
}

std::string CoordinatorImpl::LateLocked(int64_t round) const {
  std::string out;
  for (size_t i = 0; i < sites_.size(); ++i)
    if (sites_[i].state == SiteState::kAlive && sites_[i].last_round < round)
      out +=
          fmt::format("{}site {} (at round {})", out.empty() ? "" : ", ", i, sites_[i].last_round);
  return out;
}

void CoordinatorImpl::MaybeQuorumLocked() {
  if (quorum_) return;
  for (const auto& s : sites_)
    if (s.state != SiteState::kAlive) return;
  quorum_ = true;
  Status st = log_.Append({{"t", "quorum"}, {"epoch", epoch_}});
  if (!st.ok()) LogWarning("coordinator: {}", st.ToString());
  LogInfo("coordinator: all {} sites registered (epoch {})", options_.sites, epoch_);
  cv_.notify_all();
}

void CoordinatorImpl::MaybeCompleteRoundsLocked() {
  int64_t m = std::numeric_limits<int64_t>::max();
  std::vector<int> live;
  for (size_t i = 0; i < sites_.size(); ++i) {
    if (sites_[i].state != SiteState::kAlive) continue;
    m = std::min(m, sites_[i].last_round);
    live.push_back(int(i));
  }
  if (live.empty() || m <= completed_round_) return;
  Status st = log_.Append({{"t", "round"}, {"round", m}, {"epoch", epoch_}, {"live", live}});
  if (!st.ok()) LogWarning("coordinator: {}", st.ToString());
  completed_round_ = m;
  rounds_[m] = CurrentLocked();
  while (rounds_.size() > kKeptRounds) rounds_.erase(rounds_.begin());
  LogDebug("coordinator: round {} complete ({} live sites, epoch {})", m, live.size(), epoch_);
  cv_.notify_all();
}

void CoordinatorImpl::DeclareDeadLocked(int site, double silent_s) {
  Status st =
      log_.Append({{"t", "death"}, {"site", site}, {"silent_s", silent_s}, {"epoch", epoch_ + 1}});
  if (!st.ok()) LogWarning("coordinator: {}", st.ToString());
  sites_[size_t(site)].state = SiteState::kDead;
  ++epoch_;
  LogWarning(
      "coordinator: site {} declared dead after {:.2f} s without a heartbeat (limit "
      "{:.2f} s); epoch {}, {} live sites",
      site, silent_s, 2 * options_.heartbeat_s, epoch_, CurrentLocked().live());
  MaybeCompleteRoundsLocked();
  cv_.notify_all();
}

void CoordinatorImpl::Monitor() {
  const auto limit = Seconds(2 * options_.heartbeat_s);
  const auto period =
      std::max<Clock::duration>(milliseconds(5), Seconds(options_.heartbeat_s / 20));
  std::unique_lock<std::mutex> lk(mu_);
  while (!stopping_) {
    cv_.wait_for(lk, period);
    if (stopping_) break;
    const auto now = Clock::now();
    for (size_t i = 0; i < sites_.size(); ++i) {
      const auto& s = sites_[i];
      if (s.state == SiteState::kAlive && now - s.last_heartbeat > limit)
        DeclareDeadLocked(int(i), duration<double>(now - s.last_heartbeat).count());
    }
  }
}

grpc::Status CoordinatorImpl::Register(grpc::ServerContext* ctx, const coord::RegisterRequest& req,
                                       coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Register"); !st.ok()) return st;
  const int site = req.site();
  if (req.version() != kCoordinatorProtocolVersion)
    return Refuse(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: coordinator protocol version {} differs from the "
                              "coordinator's {}: run the same atoll release everywhere",
                              site, req.version(), kCoordinatorProtocolVersion));
  if (auto st = CheckSite(*ctx, "Register", site); !st.ok()) return st;
  if (req.wan_address().empty() || req.wan_address().size() > 1024)
    return Refuse(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: the WAN address must be HOST:PORT (got '{}')", site,
                              req.wan_address().substr(0, 64)));
  std::unique_lock<std::mutex> lk(mu_);
  if (have_hash_ && req.config_hash() != config_hash_)
    return Refuse(*ctx, "Register", grpc::StatusCode::FAILED_PRECONDITION,
                  fmt::format("site {}: config hash {} differs from {} registered by site {}: "
                              "every site must train the same model config",
                              site, Hex(req.config_hash()), Hex(config_hash_), hash_site_));
  auto& rec = sites_[size_t(site)];
  if (rec.state == SiteState::kAlive && rec.incarnation != req.incarnation())
    return Refuse(*ctx, "Register", grpc::StatusCode::ALREADY_EXISTS,
                  fmt::format("site {} is already registered by another live process (WAN "
                              "address {}); two processes claim the same site? (a site that "
                              "died is declared dead after {:.1f} s without heartbeats)",
                              site, rec.wan_address, 2 * options_.heartbeat_s));
  const bool same = rec.state == SiteState::kAlive && rec.wan_address == req.wan_address();
  if (!same && req.rejoin()) {
    if (!quorum_ || rec.state == SiteState::kUnregistered)
      return Refuse(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                    fmt::format("site {}: cannot rejoin a world it never joined (register it "
                                "normally until the initial quorum)",
                                site));
    if (req.join_round() < 0)
      return Refuse(*ctx, "Register", grpc::StatusCode::INVALID_ARGUMENT,
                    fmt::format("site {}: join round {} is negative", site, req.join_round()));
    for (size_t i = 0; i < sites_.size(); ++i)
      if (sites_[i].state == SiteState::kAlive && sites_[i].last_round >= req.join_round())
        return grpc::Status(grpc::StatusCode::OUT_OF_RANGE,
                            fmt::format("site {}: too late to rejoin at round {}: site {} has "
                                        "reached round {}",
                                        site, req.join_round(), i, sites_[i].last_round));
  }
  if (!same) {
    Json record = {{"t", "register"},
                   {"site", site},
                   {"incarnation", Hex(req.incarnation())},
                   {"wan", req.wan_address()},
                   {"config_hash", Hex(req.config_hash())},
                   {"peer", ctx->peer()},
                   {"epoch", epoch_ + 1}};
    if (req.rejoin()) record["join_round"] = req.join_round();
    Status st = log_.Append(record);
    if (!st.ok()) {
      LogWarning("coordinator: {}", st.ToString());
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "coordinator cannot write its log: " + st.message());
    }
    const bool rejoin = rec.state != SiteState::kUnregistered;
    rec.state = SiteState::kAlive;
    rec.incarnation = req.incarnation();
    rec.wan_address = req.wan_address();
    // A rejoining site counts as having reached every round before its first: the others'
    // rounds do not wait for it until then.
    rec.join_round = req.rejoin() ? req.join_round() : 0;
    rec.last_round = rec.join_round - 1;
    ++epoch_;
    if (!have_hash_) {
      have_hash_ = true;
      config_hash_ = req.config_hash();
      hash_site_ = site;
    }
    LogInfo("coordinator: site {} {} from {} (WAN {}), epoch {}", site,
            rejoin ? "rejoined" : "registered", ctx->peer(), rec.wan_address, epoch_);
    MaybeQuorumLocked();
    cv_.notify_all();
  } else {
    LogInfo("coordinator: site {} registered again (same process, from {})", site, ctx->peer());
  }
  rec.last_heartbeat = Clock::now();
  const auto deadline = WaitDeadline(*ctx);
  const auto slice =
      std::min<Clock::duration>(milliseconds(100), Seconds(options_.heartbeat_s / 4));
  while (!quorum_) {
    if (stopping_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (auto st = CheckMemberLocked(site, req.incarnation()); !st.ok()) return st;
    const auto now = Clock::now();
    if (now >= deadline)
      return grpc::Status(
          grpc::StatusCode::DEADLINE_EXCEEDED,
          fmt::format("initial quorum not reached: {} of {} sites registered; waiting for "
                      "site(s) {}",
                      CurrentLocked().live(), options_.sites, MissingLocked()));
    // A site waiting here is alive: its heartbeats start when Register returns.
    rec.last_heartbeat = now;
    cv_.wait_until(lk, std::min(deadline, now + slice));
  }
  FillReply(CurrentLocked(), reply);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::Heartbeat(grpc::ServerContext* ctx,
                                        const coord::HeartbeatRequest& req, coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Heartbeat"); !st.ok()) return st;
  if (auto st = CheckSite(*ctx, "Heartbeat", req.site()); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto st = CheckMemberLocked(req.site(), req.incarnation()); !st.ok()) return st;
  sites_[size_t(req.site())].last_heartbeat = Clock::now();
  FillReply(CurrentLocked(), reply);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::Round(grpc::ServerContext* ctx, const coord::RoundRequest& req,
                                    coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Round"); !st.ok()) return st;
  if (auto st = CheckSite(*ctx, "Round", req.site()); !st.ok()) return st;
  const int64_t r = req.round();
  if (r < 0)
    return Refuse(*ctx, "Round", grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: round {} is negative", req.site(), r));
  std::unique_lock<std::mutex> lk(mu_);
  if (auto st = CheckMemberLocked(req.site(), req.incarnation()); !st.ok()) return st;
  auto& rec = sites_[size_t(req.site())];
  rec.last_round = r;
  MaybeCompleteRoundsLocked();
  const auto deadline = WaitDeadline(*ctx);
  while (completed_round_ < r) {
    if (stopping_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
    if (ctx->IsCancelled()) return grpc::Status(grpc::StatusCode::CANCELLED, "cancelled");
    if (auto st = CheckMemberLocked(req.site(), req.incarnation()); !st.ok()) return st;
    const auto now = Clock::now();
    if (now >= deadline)
      return grpc::Status(grpc::StatusCode::DEADLINE_EXCEEDED,
                          fmt::format("round {}: still waiting for {}", r, LateLocked(r)));
    cv_.wait_until(lk, std::min(deadline, now + milliseconds(100)));
  }
  auto it = rounds_.lower_bound(r);
  FillReply(it != rounds_.end() ? it->second : CurrentLocked(), reply);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::Peek(grpc::ServerContext* ctx, const coord::PeekRequest& req,
                                   coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Peek"); !st.ok()) return st;
  if (auto st = CheckSite(*ctx, "Peek", req.site()); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  FillReply(CurrentLocked(), reply);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::Leave(grpc::ServerContext* ctx, const coord::LeaveRequest& req,
                                    coord::Reply* reply) {
  if (auto st = Authorize(*ctx, "Leave"); !st.ok()) return st;
  if (auto st = CheckSite(*ctx, "Leave", req.site()); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  auto& rec = sites_[size_t(req.site())];
  if (auto st = CheckMemberLocked(req.site(), req.incarnation()); !st.ok()) {
    if (st.error_code() != grpc::StatusCode::ABORTED) return st;
    FillReply(CurrentLocked(), reply);  // already dead or gone: nothing to do
    return grpc::Status::OK;
  }
  Status st = log_.Append({{"t", "leave"}, {"site", req.site()}, {"epoch", epoch_ + 1}});
  if (!st.ok()) {
    LogWarning("coordinator: {}", st.ToString());
    return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                        "coordinator cannot write its log: " + st.message());
  }
  rec.state = SiteState::kLeft;
  ++epoch_;
  LogInfo("coordinator: site {} left (epoch {}, {} live sites)", req.site(), epoch_,
          CurrentLocked().live());
  MaybeCompleteRoundsLocked();
  cv_.notify_all();
  FillReply(CurrentLocked(), reply);
  return grpc::Status::OK;
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
  return c_->PsInit(ctx, *req, reply);
}
grpc::Status Service::PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest* req,
                             coord::PsPullReply* reply) {
  return c_->PsPull(ctx, *req, reply);
}
grpc::Status Service::PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest* req,
                             coord::PsPushReply* reply) {
  return c_->PsPush(ctx, *req, reply);
}

// ---------------------------------------------------------------------------------------------
// The parameter server (world/ps.h).

Status CoordinatorImpl::InitPs() {
  std::lock_guard<std::mutex> lk(ps_mu_);
  ops_path_ = options_.state_dir + "/" + kOpsName;
  ps_memo_.assign(size_t(options_.sites), {});
  if (!FileExists(ops_path_)) return Status::Ok();
  ATOLL_ASSIGN_OR_RETURN(std::string text, ReadFile(ops_path_));
  const size_t end = text.rfind('\n');
  const size_t good = end == std::string::npos ? 0 : end + 1;
  if (good == 0) {
    // Nothing complete: the init record itself was torn (never acknowledged). Start afresh.
    if (::truncate(ops_path_.c_str(), 0) != 0)
      return Status::IoError(fmt::format("truncating {}: {}", ops_path_, std::strerror(errno)));
    return Status::Ok();
  }
  ATOLL_ASSIGN_OR_RETURN(OpLog log, ReadOpLog(ops_path_));
  if (!log.entries.empty()) {
    ps_broken_ = fmt::format("{}: {} holds {} updates (the last one gave version {})", kPsLost,
                             ops_path_, log.entries.size(), [&] {
                               int64_t v = 0;
                               for (const auto& e : log.entries) v = std::max(v, e.applied_version);
                               return v;
                             }());
    LogWarning("coordinator: {}; parameter server calls will be refused", ps_broken_);
    return Status::Ok();
  }
  // Only the init record: the next PsInit must match it and sets the parameters again.
  if (good < text.size()) {
    LogWarning("coordinator: {}: dropping a torn last record ({} bytes, never acknowledged)",
               ops_path_, text.size() - good);
    if (::truncate(ops_path_.c_str(), off_t(good)) != 0)
      return Status::IoError(
          fmt::format("truncating the torn tail of {}: {}", ops_path_, std::strerror(errno)));
  }
  ps_logged_init_ = true;
  ps_count_ = log.count;
  ps_checksum_ = log.init_checksum;
  ps_max_staleness_ = log.max_staleness;
  LogInfo(
      "coordinator: {} holds the parameter server's init record ({} parameters, checksum {}) "
      "and no updates: the next PsInit must match it",
      ops_path_, ps_count_, Hex(ps_checksum_));
  return Status::Ok();
}

grpc::Status CoordinatorImpl::CheckPsCaller(const grpc::ServerContext& ctx, const char* rpc,
                                            int site, uint64_t incarnation) const {
  if (auto st = Authorize(ctx, rpc); !st.ok()) return st;
  if (auto st = CheckSite(ctx, rpc, site); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(mu_);
  if (stopping_)
    return grpc::Status(grpc::StatusCode::UNAVAILABLE, "the coordinator is shutting down");
  return CheckMemberLocked(site, incarnation);
}

grpc::Status CoordinatorImpl::PsUsableLocked(const grpc::ServerContext& ctx, const char* rpc,
                                             int site, bool init) const {
  if (!ps_broken_.empty())
    return Refuse(ctx, rpc, grpc::StatusCode::FAILED_PRECONDITION, ps_broken_);
  if (!init && !ps_init_)
    return Refuse(ctx, rpc, grpc::StatusCode::FAILED_PRECONDITION,
                  fmt::format("site {}: the parameter server has no parameters yet (PsInit "
                              "first)",
                              site));
  return grpc::Status::OK;
}

void CoordinatorImpl::BreakPsLocked(const std::string& why) {
  ps_broken_ = fmt::format(
      "the parameter server stopped: {} (its op log and parameters may disagree; replay {} "
      "with `atoll replay`)",
      why, ops_path_);
  LogWarning("coordinator: {}", ps_broken_);
}

grpc::Status CoordinatorImpl::PsInit(grpc::ServerContext* ctx, const coord::PsInitRequest& req,
                                     coord::PsInitReply* reply) {
  constexpr const char* rpc = "PsInit";
  const int site = req.site();
  if (auto st = CheckPsCaller(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  const std::string& bytes = req.params();
  if (bytes.empty() || bytes.size() % sizeof(float) != 0)
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: PsInit with {} bytes of parameters (a positive multiple "
                              "of 4 is needed)",
                              site, bytes.size()));
  if (req.max_staleness() < 0)
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: max_staleness {} is negative", site, req.max_staleness()));
  const uint64_t count = bytes.size() / sizeof(float);
  const uint64_t checksum = Hash64(bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lk(ps_mu_);
  if (auto st = PsUsableLocked(*ctx, rpc, site, /*init=*/true); !st.ok()) return st;
  if (ps_init_ || ps_logged_init_) {
    if (count != ps_count_ || checksum != ps_checksum_)
      return Refuse(
          *ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
          fmt::format("site {}: initial parameters ({} floats, checksum {}) differ from the "
                      "parameter server's ({} floats, checksum {}{}): every site must start "
                      "from the same model config and seed",
                      site, count, Hex(checksum), ps_count_, Hex(ps_checksum_),
                      ps_init_site_ >= 0 ? fmt::format(", set by site {}", ps_init_site_)
                                         : std::string(", from the op log")));
  }
  if (!ps_init_) {
    if (!ops_open_) {
      if (Status st = ops_.Open(ops_path_); !st.ok()) {
        LogWarning("coordinator: {}", st.ToString());
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "coordinator cannot open its op log: " + st.message());
      }
      ops_open_ = true;
    }
    if (!ps_logged_init_) {
      Status st = ops_.Append({{"t", "init"},
                               {"count", count},
                               {"checksum", Hex(checksum)},
                               {"max_staleness", req.max_staleness()},
                               {"site", site}});
      if (!st.ok()) {
        BreakPsLocked(st.ToString());
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, ps_broken_);
      }
      ps_logged_init_ = true;
      ps_max_staleness_ = req.max_staleness();
    }
    ps_count_ = count;
    ps_checksum_ = checksum;
    ps_init_site_ = site;
    ps_params_.resize(count);
    std::memcpy(ps_params_.data(), bytes.data(), bytes.size());
    ps_version_ = 0;
    ps_next_id_ = 0;
    ps_init_ = true;
    LogInfo(
        "coordinator: parameter server initialized by site {}: {} parameters (checksum {}), "
        "max staleness {}",
        site, count, Hex(checksum), ps_max_staleness_);
  }
  const int64_t last_step = ps_last_step_.count(site) ? ps_last_step_[site] : 0;
  if (last_step > 0 && ps_rejoined_[site] != req.incarnation()) {
    // A site calls Init once per process (a retry is the same incarnation): this is a new one
    // taking the site over.
    Status st = ops_.Append({{"t", "rejoin"},
                             {"site", site},
                             {"step", last_step},
                             {"version", ps_version_},
                             {"next_update", ps_next_id_}});
    if (!st.ok()) {
      BreakPsLocked(st.ToString());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, ps_broken_);
    }
    ps_rejoined_[site] = req.incarnation();
    LogInfo("coordinator: parameter server: a new process for site {} goes on after its step {} "
            "(version {})",
            site, last_step, ps_version_);
  }
  reply->set_coordinator_id(id_);
  reply->set_version(ps_version_);
  reply->set_max_staleness(ps_max_staleness_);
  reply->set_last_step(last_step);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::PsPull(grpc::ServerContext* ctx, const coord::PsPullRequest& req,
                                     coord::PsPullReply* reply) {
  constexpr const char* rpc = "PsPull";
  const int site = req.site();
  if (auto st = CheckPsCaller(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  std::lock_guard<std::mutex> lk(ps_mu_);
  if (auto st = PsUsableLocked(*ctx, rpc, site, /*init=*/false); !st.ok()) return st;
  if (req.count() != ps_count_)
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: PsPull of {} floats, but the parameter server holds {}",
                              site, req.count(), ps_count_));
  std::string* out = reply->mutable_params();
  out->resize(ps_params_.size() * sizeof(float));
  std::memcpy(out->data(), ps_params_.data(), out->size());
  reply->set_coordinator_id(id_);
  reply->set_version(ps_version_);
  return grpc::Status::OK;
}

grpc::Status CoordinatorImpl::PsPush(grpc::ServerContext* ctx, const coord::PsPushRequest& req,
                                     coord::PsPushReply* reply) {
  constexpr const char* rpc = "PsPush";
  const int site = req.site();
  if (auto st = CheckPsCaller(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  const float weight = req.weight();
  if (!std::isfinite(weight))
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: update weight {} is not finite", site, weight));
  if (req.base_version() < 0 || req.first_step() < 0 || req.first_step() > req.last_step())
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: bad update: base version {}, steps {}..{}", site,
                              req.base_version(), req.first_step(), req.last_step()));
  std::lock_guard<std::mutex> lk(ps_mu_);
  if (auto st = PsUsableLocked(*ctx, rpc, site, /*init=*/false); !st.ok()) return st;
  auto& memo = ps_memo_[size_t(site)];
  if (req.seq() != 0) {
    for (const auto& m : memo)
      if (m.incarnation == req.incarnation() && m.seq == req.seq()) {
        LogInfo("coordinator: site {} retried push {} (update {}): answering the first decision",
                site, req.seq(), m.reply.update_id());
        *reply = m.reply;
        return grpc::Status::OK;
      }
  }
  if (req.base_version() > ps_version_)
    return Refuse(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: update from version {}, but the parameter server is at "
                              "version {}",
                              site, req.base_version(), ps_version_));
  // Validate the whole update before deciding anything: a bad one changes nothing.
  ps_scratch_.resize(ps_params_.size());
  const std::string& enc = req.encoded();
  const std::span<const uint8_t> encoded(reinterpret_cast<const uint8_t*>(enc.data()), enc.size());
  if (Status st = Decode(encoded, ps_scratch_); !st.ok())
    return Refuse(*ctx, rpc,
                  st.code() == StatusCode::kCorruption ? grpc::StatusCode::DATA_LOSS
                                                       : grpc::StatusCode::INVALID_ARGUMENT,
                  fmt::format("site {}: update (steps {}..{}, {} bytes) refused, parameters "
                              "unchanged: {}",
                              site, req.first_step(), req.last_step(), enc.size(), st.message()));
  const int64_t staleness = ps_version_ - req.base_version();
  const bool accepted = staleness <= ps_max_staleness_;
  const int64_t id = ps_next_id_;
  const int64_t applied = accepted ? ps_version_ + 1 : -1;
  // Durable before it takes effect: a failed append changes nothing (and stops the server).
  Status st = ops_.Append({{"t", "update"},
                           {"update_id", id},
                           {"site", site},
                           {"base_version", req.base_version()},
                           {"first_step", req.first_step()},
                           {"last_step", req.last_step()},
                           {"applied_version", applied},
                           {"checksum", Hex(Hash64(enc.data(), enc.size()))},
                           {"bytes", uint64_t(enc.size())},
                           {"weight", double(weight)}});
  if (!st.ok()) {
    BreakPsLocked(st.ToString());
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, ps_broken_);
  }
  ++ps_next_id_;
  ps_last_step_[site] = std::max(ps_last_step_[site], req.last_step());
  if (accepted) {
    ApplyUpdate(ps_params_, ps_scratch_, weight);
    ps_version_ = applied;
  }
  LogDebug("coordinator: update {} from site {} (steps {}..{}, base {}, staleness {}): {}", id,
           site, req.first_step(), req.last_step(), req.base_version(), staleness,
           accepted ? fmt::format("applied, version {}", applied)
                    : fmt::format("refused (max staleness {})", ps_max_staleness_));
  reply->set_coordinator_id(id_);
  reply->set_accepted(accepted);
  reply->set_update_id(id);
  reply->set_applied_version(applied);
  reply->set_current_version(ps_version_);
  if (req.seq() != 0) {
    memo.push_back({req.incarnation(), req.seq(), *reply});
    while (memo.size() > kKeptPushes) memo.pop_front();
  }
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------------------------
// The client.

bool IsRefusal(grpc::StatusCode c) {
  return c == grpc::StatusCode::INVALID_ARGUMENT || c == grpc::StatusCode::FAILED_PRECONDITION ||
         c == grpc::StatusCode::ALREADY_EXISTS || c == grpc::StatusCode::UNAUTHENTICATED ||
         c == grpc::StatusCode::PERMISSION_DENIED || c == grpc::StatusCode::OUT_OF_RANGE;
}

bool IsRetryable(grpc::StatusCode c) {
  return c == grpc::StatusCode::UNAVAILABLE || c == grpc::StatusCode::DEADLINE_EXCEEDED ||
         c == grpc::StatusCode::CANCELLED || c == grpc::StatusCode::UNKNOWN ||
         c == grpc::StatusCode::INTERNAL || c == grpc::StatusCode::RESOURCE_EXHAUSTED;
}

// The coordinator's own reason (e.g. who is late) is worth more than gRPC's bare timeout.
void KeepReason(const grpc::Status& st, std::string* reason) {
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED &&
      st.error_message() == "Deadline Exceeded" && !reason->empty())
    return;
  *reason = st.error_message();
}

// A failed TLS handshake (wrong CA, wrong certificate) reads as UNAVAILABLE; recognize it so a
// misconfigured site fails quickly with a clear message instead of retrying until timeout_s.
bool LooksLikeTls(const std::string& msg) {
  std::string m = msg;
  for (auto& c : m) c = char(std::tolower(static_cast<unsigned char>(c)));
  return m.find("handshake") != std::string::npos || m.find("ssl") != std::string::npos ||
         m.find("certificate") != std::string::npos || m.find("tls") != std::string::npos;
}

class ClientImpl final : public CoordinatorClient {
 public:
  explicit ClientImpl(const CoordinatorClientOptions& o)
      : options_(o), incarnation_(RandomU64()), heartbeat_s_(o.heartbeat_s) {
    grpc::ChannelArguments args;
    // Reconnect quickly to a restarted coordinator (gRPC's default backoff grows to 120 s).
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
    stub_ = coord::Coordinator::NewStub(
        MakeChannel(o.address, o.security, args, kCoordinatorMaxMessageBytes));
  }
  ~ClientImpl() override { StopHeartbeats(); }

  StatusOr<Membership> Register(const std::string& wan_address) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      wan_address_ = wan_address;
    }
    ATOLL_ASSIGN_OR_RETURN(Membership m,
                           DoRegister(Clock::now() + Seconds(options_.timeout_s), false));
    StartHeartbeats();
    return m;
  }

  StatusOr<Membership> Rejoin(const std::string& wan_address, int64_t join_round) override {
    {
      std::lock_guard<std::mutex> lk(mu_);
      wan_address_ = wan_address;
      join_round_ = join_round;
    }
    StatusOr<Membership> m = DoRegister(Clock::now() + Seconds(options_.timeout_s), false);
    {
      // Registered (or not) now; a later re-registration (a restarted coordinator) is plain.
      std::lock_guard<std::mutex> lk(mu_);
      join_round_ = -1;
    }
    if (m.ok()) StartHeartbeats();
    return m;
  }

  StatusOr<Membership> Round(int64_t round) override;
  Status Leave() override;

  StatusOr<Membership> Peek() override {
    coord::PeekRequest req;
    req.set_site(options_.site);
    const auto deadline = Clock::now() + Seconds(options_.timeout_s);
    double delay = 0.05;
    std::string reason;
    while (true) {
      coord::Reply reply;
      grpc::Status st = Call(&coord::Coordinator::Stub::Peek, req, &reply, deadline, false);
      if (st.ok()) return FromProto(reply.membership());
      if (IsRefusal(st.error_code())) return Refused("a look at the membership", st);
      KeepReason(st, &reason);
      if (!IsRetryable(st.error_code()) || Clock::now() >= deadline ||
          st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED)
        return Status::Unavailable(fmt::format("site {}: the coordinator at {}: {}", options_.site,
                                               options_.address, reason));
      if (!Backoff(&delay, deadline, false)) return Status::Unavailable("client stopping");
    }
  }
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

  // A parameter server call with Round's retries; `what` names it in errors.
  template <class Req, class Rep>
  Status PsCall(const std::string& what,
                grpc::Status (coord::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Req&,
                                                              Rep*),
                const Req& req, Rep* reply);

  template <class Req>
  grpc::Status Call(grpc::Status (coord::Coordinator::Stub::*rpc)(grpc::ClientContext*, const Req&,
                                                                  coord::Reply*),
                    const Req& req, coord::Reply* reply, Clock::time_point deadline,
                    bool from_heartbeat_thread) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToSystem(deadline));
    AddToken(&ctx, options_.security);
    if (from_heartbeat_thread) {
      std::lock_guard<std::mutex> lk(hb_mu_);
      if (hb_stop_) return grpc::Status(grpc::StatusCode::CANCELLED, "client stopping");
      hb_call_ = &ctx;
    }
    grpc::Status st = (stub_.get()->*rpc)(&ctx, req, reply);
    if (from_heartbeat_thread) {
      std::lock_guard<std::mutex> lk(hb_mu_);
      hb_call_ = nullptr;
    }
    return st;
  }

  // Sleeps with exponential backoff (50 ms .. 1 s), never past `deadline`; false when the
  // heartbeat thread is asked to stop.
  bool Backoff(double* delay_s, Clock::time_point deadline, bool from_heartbeat_thread) {
    auto until = std::min(deadline, Clock::now() + Seconds(*delay_s));
    *delay_s = std::min(*delay_s * 2, 1.0);
    std::unique_lock<std::mutex> lk(hb_mu_);
    if (from_heartbeat_thread) return !hb_cv_.wait_until(lk, until, [&] { return hb_stop_; });
    lk.unlock();
    std::this_thread::sleep_until(until);
    return true;
  }

  Status Refused(const char* what, const grpc::Status& st) const {
    return Status::InvalidArgument(fmt::format("coordinator {} refused {} of site {}: {}",
                                               options_.address, what, options_.site,
                                               st.error_message()));
  }

  void AcceptReply(const coord::Reply& reply) {
    std::lock_guard<std::mutex> lk(mu_);
    membership_ = FromProto(reply.membership());
    if (reply.heartbeat_s() > 0) heartbeat_s_ = std::min(options_.heartbeat_s, reply.heartbeat_s());
  }

  StatusOr<Membership> DoRegister(Clock::time_point deadline, bool from_heartbeat_thread);
  void StartHeartbeats();
  void StopHeartbeats();
  void HeartbeatLoop();
  void SendHeartbeat();

  const CoordinatorClientOptions options_;
  const uint64_t incarnation_;
  std::unique_ptr<coord::Coordinator::Stub> stub_;

  std::mutex mu_;  // guards the fields below
  std::string wan_address_;
  int64_t join_round_ = -1;  // >= 0 while Rejoin registers
  bool registered_ = false;
  bool dead_ = false;  // declared dead or left: no heartbeats until registered again
  std::string dead_reason_;
  uint64_t generation_ = 0;  // successful registrations (a stale heartbeat reply is ignored)
  uint64_t coordinator_id_ = 0;
  Membership membership_;
  double heartbeat_s_;
  bool unreachable_ = false;

  std::mutex hb_mu_;  // guards hb_stop_, hb_call_
  std::condition_variable hb_cv_;
  bool hb_stop_ = false;
  grpc::ClientContext* hb_call_ = nullptr;
  std::thread hb_thread_;

  PsClient ps_{this};
};

StatusOr<Membership> ClientImpl::DoRegister(Clock::time_point deadline,
                                            bool from_heartbeat_thread) {
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
    }
  }
  double delay = 0.05;
  int tls_failures = 0;
  std::string reason;
  while (true) {
    coord::Reply reply;
    grpc::Status st =
        Call(&coord::Coordinator::Stub::Register, req, &reply, deadline, from_heartbeat_thread);
    if (st.ok()) {
      AcceptReply(reply);
      std::lock_guard<std::mutex> lk(mu_);
      coordinator_id_ = reply.coordinator_id();
      registered_ = true;
      dead_ = false;
      ++generation_;
      unreachable_ = false;
      return membership_;
    }
    if (req.rejoin() && st.error_code() == grpc::StatusCode::OUT_OF_RANGE)
      return Status::NotFound(
          fmt::format("coordinator {}: {}", options_.address, st.error_message()));
    // The process this one replaces is live until the coordinator misses its heartbeats.
    const bool wait_for_death = req.rejoin() && st.error_code() == grpc::StatusCode::ALREADY_EXISTS;
    if (IsRefusal(st.error_code()) && !wait_for_death) return Refused("the registration", st);
    KeepReason(st, &reason);
    if (wait_for_death) reason = st.error_message();
    if (!IsRetryable(st.error_code()) && st.error_code() != grpc::StatusCode::ABORTED &&
        st.error_code() != grpc::StatusCode::NOT_FOUND && !wait_for_death)
      return Status::Internal(fmt::format("registering site {} with the coordinator at {}: {}",
                                          options_.site, options_.address, st.error_message()));
    if (st.error_code() == grpc::StatusCode::UNAVAILABLE && LooksLikeTls(st.error_message())) {
      if (++tls_failures >= 3)
        return Status::InvalidArgument(fmt::format(
            "site {}: the TLS handshake with the coordinator at {} failed: {} (do the site and "
            "the coordinator use certificates from the same CA? see `atoll certs`)",
            options_.site, options_.address, st.error_message()));
    } else {
      tls_failures = 0;
    }
    // Each attempt runs to the overall deadline: a deadline error means time is up.
    if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED || Clock::now() >= deadline) {
      std::string hint;
      if (reason.find("Socket closed") != std::string::npos)
        hint =
            " (the coordinator closed the connection after the TLS handshake: is this site's "
            "certificate signed by the coordinator's CA? see `atoll certs`)";
      return Status::Unavailable(
          fmt::format("site {}: registering with the coordinator at {} timed out after {:.0f} "
                      "s: {}{}",
                      options_.site, options_.address, options_.timeout_s, reason, hint));
    }
    if (!Backoff(&delay, deadline, from_heartbeat_thread))
      return Status::Unavailable("client stopping");
  }
}

StatusOr<Membership> ClientImpl::Round(int64_t round) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!registered_)
      return Status::Internal(fmt::format("site {}: CoordinatorClient::Round({}) before Register",
                                          options_.site, round));
    if (dead_) return Status::Unavailable(dead_reason_);
  }
  coord::RoundRequest req;
  req.set_site(options_.site);
  req.set_round(round);
  req.set_incarnation(incarnation_);
  const auto deadline = Clock::now() + Seconds(options_.timeout_s);
  double delay = 0.05;
  std::string reason;
  while (true) {
    coord::Reply reply;
    grpc::Status st = Call(&coord::Coordinator::Stub::Round, req, &reply, deadline, false);
    KeepReason(st, &reason);
    if (st.ok()) {
      AcceptReply(reply);
      return FromProto(reply.membership());
    }
    const auto code = st.error_code();
    // Declared dead, left, or replaced by another process registered for this site.
    if (code == grpc::StatusCode::ABORTED || code == grpc::StatusCode::ALREADY_EXISTS) {
      std::lock_guard<std::mutex> lk(mu_);
      dead_ = true;
      dead_reason_ = st.error_message();
      return Status::Unavailable(fmt::format("round {}: {}", round, st.error_message()));
    }
    if (code == grpc::StatusCode::NOT_FOUND) {
      LogInfo("site {}: the coordinator does not know this site ({}); registering again",
              options_.site, st.error_message());
      auto m = DoRegister(deadline, false);
      if (!m.ok()) return m.status().WithContext(fmt::format("round {}", round));
      continue;
    }
    if (IsRefusal(code)) return Refused(fmt::format("round {}", round).c_str(), st);
    if (!IsRetryable(code))
      return Status::Internal(
          fmt::format("site {}: round {}: {}", options_.site, round, st.error_message()));
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED || Clock::now() >= deadline)
      return Status::Unavailable(fmt::format("site {}: round {} not reached after {:.0f} s: {}",
                                             options_.site, round, options_.timeout_s, reason));
    Backoff(&delay, deadline, false);
  }
}

template <class Req, class Rep>
Status ClientImpl::PsCall(const std::string& what,
                          grpc::Status (coord::Coordinator::Stub::*rpc)(grpc::ClientContext*,
                                                                        const Req&, Rep*),
                          const Req& req, Rep* reply) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!registered_)
      return Status::Internal(
          fmt::format("site {}: parameter server {} before Register", options_.site, what));
    if (dead_) return Status::Unavailable(fmt::format("{}: {}", what, dead_reason_));
  }
  const auto deadline = Clock::now() + Seconds(options_.timeout_s);
  double delay = 0.05;
  std::string reason;
  while (true) {
    grpc::ClientContext ctx;
    ctx.set_deadline(ToSystem(deadline));
    AddToken(&ctx, options_.security);
    grpc::Status st = (stub_.get()->*rpc)(&ctx, req, reply);
    if (st.ok()) return Status::Ok();
    KeepReason(st, &reason);
    const auto code = st.error_code();
    const std::string msg = fmt::format("site {}: parameter server {} at {}: {}", options_.site,
                                        what, options_.address, st.error_message());
    switch (code) {
      case grpc::StatusCode::ABORTED:
      case grpc::StatusCode::ALREADY_EXISTS: {  // declared dead, left, or replaced
        std::lock_guard<std::mutex> lk(mu_);
        dead_ = true;
        dead_reason_ = st.error_message();
        return Status::Unavailable(msg);
      }
      case grpc::StatusCode::NOT_FOUND: {
        LogInfo("site {}: the coordinator does not know this site ({}); registering again",
                options_.site, st.error_message());
        auto m = DoRegister(deadline, false);
        if (!m.ok()) return m.status().WithContext(fmt::format("parameter server {}", what));
        continue;
      }
      case grpc::StatusCode::INVALID_ARGUMENT:
      case grpc::StatusCode::OUT_OF_RANGE:
      case grpc::StatusCode::UNAUTHENTICATED:
      case grpc::StatusCode::PERMISSION_DENIED:
      case grpc::StatusCode::RESOURCE_EXHAUSTED:  // a message over the size limit
        return Status::InvalidArgument(msg);
      case grpc::StatusCode::DATA_LOSS:
        return Status::Corruption(msg);
      case grpc::StatusCode::FAILED_PRECONDITION:  // not initialized, state lost, log broken
      case grpc::StatusCode::UNIMPLEMENTED:        // a coordinator without a parameter server
        return Status::Internal(msg);
      default:
        break;
    }
    if (!IsRetryable(code)) return Status::Internal(msg);
    if (code == grpc::StatusCode::DEADLINE_EXCEEDED || Clock::now() >= deadline)
      return Status::Unavailable(
          fmt::format("site {}: parameter server {} at {} failed for {:.0f} "
                      "s: {}",
                      options_.site, what, options_.address, options_.timeout_s, reason));
    Backoff(&delay, deadline, false);
  }
}

StatusOr<int64_t> ClientImpl::PsClient::Init(std::span<const float> params,
                                             int64_t max_staleness) {
  coord::PsInitRequest req;
  req.set_site(c_->options_.site);
  req.set_incarnation(c_->incarnation_);
  req.set_params(reinterpret_cast<const char*>(params.data()), params.size_bytes());
  req.set_max_staleness(max_staleness);
  coord::PsInitReply reply;
  ATOLL_RETURN_IF_ERROR(c_->PsCall("Init", &coord::Coordinator::Stub::PsInit, req, &reply));
  return reply.last_step();
}

StatusOr<int64_t> ClientImpl::PsClient::Pull(std::span<float> params) {
  coord::PsPullRequest req;
  req.set_site(c_->options_.site);
  req.set_incarnation(c_->incarnation_);
  req.set_count(params.size());
  coord::PsPullReply reply;
  ATOLL_RETURN_IF_ERROR(c_->PsCall("Pull", &coord::Coordinator::Stub::PsPull, req, &reply));
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
  ATOLL_RETURN_IF_ERROR(
      c_->PsCall(fmt::format("Push (steps {}..{})", update.first_step, update.last_step),
                 &coord::Coordinator::Stub::PsPush, req, &reply));
  PsPushResult r;
  r.accepted = reply.accepted();
  r.update_id = reply.update_id();
  r.applied_version = reply.applied_version();
  r.current_version = reply.current_version();
  return r;
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
  const auto deadline = Clock::now() + Seconds(std::min(options_.timeout_s, 10.0));
  double delay = 0.05;
  while (true) {
    coord::Reply reply;
    grpc::Status st = Call(&coord::Coordinator::Stub::Leave, req, &reply, deadline, false);
    const auto code = st.error_code();
    if (st.ok() || code == grpc::StatusCode::NOT_FOUND) {
      std::lock_guard<std::mutex> lk(mu_);
      registered_ = false;
      return Status::Ok();
    }
    if (IsRefusal(code)) return Refused("leaving", st);
    if (!IsRetryable(code) || Clock::now() >= deadline)
      return Status::Unavailable(fmt::format("site {}: leaving the world at {}: {}", options_.site,
                                             options_.address, st.error_message()));
    Backoff(&delay, deadline, false);
  }
}

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
  while (true) {
    double period;
    {
      std::lock_guard<std::mutex> lk(mu_);
      period = heartbeat_s_;
    }
    next = std::max(next + Seconds(period), Clock::now());
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
  double period;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (dead_) return;
    generation = generation_;
    req.set_epoch(membership_.epoch);
    known_id = coordinator_id_;
    period = heartbeat_s_;
  }
  req.set_site(options_.site);
  req.set_incarnation(incarnation_);
  coord::Reply reply;
  grpc::Status st = Call(&coord::Coordinator::Stub::Heartbeat, req, &reply,
                         Clock::now() + Seconds(std::max(period, 0.5)), true);
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
    auto m = DoRegister(Clock::now() + Seconds(options_.timeout_s), true);
    if (!m.ok() && m.status().message() != "client stopping")
      LogWarning("site {}: registering again failed: {}", options_.site, m.status().ToString());
  }
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
  if (options.state_dir.empty())
    return Status::InvalidArgument("coordinator: a state directory is required (--state DIR)");
  if (options.listen.rfind(':') == std::string::npos)
    return Status::InvalidArgument(
        fmt::format("coordinator: listen address '{}' is not HOST:PORT", options.listen));
  auto c = std::make_unique<CoordinatorImpl>(options);
  ATOLL_RETURN_IF_ERROR(c->Init());
  return std::unique_ptr<Coordinator>(std::move(c));
}

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
  return std::unique_ptr<CoordinatorClient>(std::make_unique<ClientImpl>(options));
}

}  // namespace atl
