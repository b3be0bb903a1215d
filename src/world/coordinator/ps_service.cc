#include "world/coordinator/ps_service.h"

#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <span>

#include "core/file.h"
#include "core/hash.h"
#include "core/log.h"
#include "world/codec.h"
#include "world/coordinator.h"
#include "world/ps.h"

namespace atl {

namespace {

constexpr const char* kOpsName = "ops.jsonl";
constexpr const char* kSnapshotName = "ps_params.bin";
constexpr char kSnapshotMagic[8] = {'A', 'T', 'L', 'P', 'S', 'V', '0', '1'};
constexpr size_t kSnapshotHeader = sizeof kSnapshotMagic + 3 * sizeof(int64_t);

// The parameters and version in a snapshot file; kCorruption when it is not one of `count`.
struct Snapshot {
  int64_t version = 0;
  std::vector<float> params;
};
StatusOr<Snapshot> ReadSnapshot(const std::string& path, uint64_t count) {
  ATOLL_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  auto bad = [&](const std::string& why) {
    return Status::Corruption(fmt::format("{}: {}", path, why));
  };
  if (bytes.size() < kSnapshotHeader ||
      std::memcmp(bytes.data(), kSnapshotMagic, sizeof kSnapshotMagic) != 0)
    return bad("not a parameter server snapshot");
  Snapshot s;
  uint64_t n = 0, hash = 0;
  std::memcpy(&s.version, bytes.data() + 8, 8);
  std::memcpy(&n, bytes.data() + 16, 8);
  std::memcpy(&hash, bytes.data() + 24, 8);
  if (n != count || bytes.size() != kSnapshotHeader + n * sizeof(float))
    return bad(
        fmt::format("{} bytes for {} parameters, the op log's run has {}", bytes.size(), n, count));
  if (Hash64(bytes.data() + kSnapshotHeader, n * sizeof(float)) != hash)
    return bad("its checksum does not match its parameters");
  s.params.resize(n);
  std::memcpy(s.params.data(), bytes.data() + kSnapshotHeader, n * sizeof(float));
  return s;
}

// Cuts the last line of the file at `path` (a record never answered), and syncs it.
Status CutLastLine(const std::string& path) {
  ATOLL_ASSIGN_OR_RETURN(const std::string bytes, ReadFile(path));
  if (bytes.empty() || bytes.back() != '\n') return Status::Internal(path + ": no complete line");
  const size_t prev = bytes.rfind('\n', bytes.size() - 2);
  const size_t keep = prev == std::string::npos ? 0 : prev + 1;
  return WriteFileAtomic(path, std::string_view(bytes).substr(0, keep));
}
constexpr size_t kKeptPushes = 16;  // per site, for answering retried pushes
constexpr const char* kPsLost =
    "the parameter server's state was lost with the coordinator's restart (replay the op log "
    "with `atoll replay`)";

}  // namespace

grpc::Status RefuseCall(const grpc::ServerContext& ctx, const char* rpc, grpc::StatusCode code,
                        const std::string& message) {
  LogWarning("coordinator: refused {} from {}: {}", rpc, ctx.peer(), message);
  return grpc::Status(code, message);
}

grpc::Status CheckRequestSize(const grpc::ServerContext& ctx, const char* rpc,
                              const google::protobuf::Message& req, size_t limit) {
  const size_t bytes = req.ByteSizeLong();
  if (bytes <= limit) return grpc::Status::OK;
  return RefuseCall(
      ctx, rpc, grpc::StatusCode::RESOURCE_EXHAUSTED,
      fmt::format("a {} request of {} bytes, over the {} allowed", rpc, bytes, limit));
}

PsService::PsService(std::string state_dir, int sites, uint64_t coordinator_id,
                     CallerCheck check_caller)
    : path_(state_dir + "/" + kOpsName),
      snapshot_path_(state_dir + "/" + kSnapshotName),
      coordinator_id_(coordinator_id),
      check_caller_(std::move(check_caller)),
      memo_(size_t(sites)) {}

Status PsService::Start() {
  std::lock_guard<std::mutex> lk(mu_);
  // A snapshot's temporary file left by a process killed while writing it (WriteFileAtomic).
  {
    std::error_code ec;
    const std::filesystem::path snap(snapshot_path_);
    for (const auto& e : std::filesystem::directory_iterator(snap.parent_path(), ec))
      if (e.path().filename().string().rfind(snap.filename().string() + ".tmp.", 0) == 0)
        std::filesystem::remove(e.path(), ec);
  }
  ATOLL_ASSIGN_OR_RETURN(const LogContents contents, ReadLog(path_, "op log record"));
  if (contents.records.empty()) return Status::Ok();  // none, or only a torn init: start afresh
  ATOLL_ASSIGN_OR_RETURN(const OpLog log, ReadOpLog(path_));
  return RecoverLocked(contents, log);
}

Status PsService::RecoverLocked(const LogContents& contents, const OpLog& log) {
  logged_init_ = true;
  build_ = log.build;
  cpu_ = log.cpu;
  count_ = log.count;
  checksum_ = log.init_checksum;
  max_staleness_ = log.max_staleness;
  int64_t logged = 0;  // the last applied version in the log
  for (const auto& e : log.entries) logged = std::max(logged, e.applied_version);
  StatusOr<Snapshot> snap = ReadSnapshot(snapshot_path_, count_);
  if (!snap.ok() || snap->version < logged - 1 || snap->version > logged) {
    if (log.entries.empty()) {  // the next Init must match the init record, and sets them
      ATOLL_RETURN_IF_ERROR(log_.Open(path_, contents));
      LogInfo(
          "coordinator: {} holds the parameter server's init record ({} parameters, checksum {}) "
          "and no updates: the next PsInit must match it",
          path_, count_, HashToHex(checksum_));
      return Status::Ok();
    }
    broken_ = fmt::format("{}: {} holds {} updates (the last one gave version {}), {}", kPsLost,
                          path_, log.entries.size(), logged,
                          snap.ok() ? fmt::format("the snapshot holds version {}", snap->version)
                                    : snap.status().ToString());
    LogWarning("coordinator: {}; parameter server calls will be refused", broken_);
    return Status::Ok();
  }
  const nlohmann::json& last = contents.records.back().json;
  const bool cut = snap->version == logged - 1;
  if (cut) {
    // Killed between the log and the snapshot: the update was never answered nor pulled.
    if (last.value("t", "") != "update" || last.value("applied_version", int64_t(-1)) != logged)
      return Status::Corruption(fmt::format(
          "{}: the snapshot holds version {}, one behind the log, whose last record is not that "
          "update",
          path_, snap->version));
    ATOLL_RETURN_IF_ERROR(CutLastLine(path_));
    LogWarning("coordinator: {}: cut update {} (version {}), never answered: its site retries it",
               path_, last.value("update_id", int64_t(-1)), logged);
  }
  // Decisions so far: ids, each site's last step, and recent pushes for retried ones.
  int64_t version = 0;
  const size_t n = contents.records.size() - (cut ? 1 : 0);
  for (size_t i = 0; i < n; ++i) {
    const nlohmann::json& j = contents.records[i].json;
    if (j.value("t", "") != "update") continue;
    const int site = j.value("site", -1);
    const int64_t applied = j.value("applied_version", int64_t(-1));
    version = std::max(version, applied);
    next_id_ = std::max(next_id_, j.value("update_id", int64_t(-1)) + 1);
    if (site < 0 || size_t(site) >= memo_.size()) continue;
    last_step_[site] = std::max(last_step_[site], j.value("last_step", int64_t(0)));
    if (j.value("seq", uint64_t(0)) == 0) continue;
    PushMemo m;
    if (!HexToHash(j.value("incarnation", std::string()), &m.incarnation)) continue;
    m.seq = j.value("seq", uint64_t(0));
    m.reply.set_coordinator_id(coordinator_id_);
    m.reply.set_accepted(applied >= 0);
    m.reply.set_update_id(j.value("update_id", int64_t(-1)));
    m.reply.set_applied_version(applied);
    m.reply.set_current_version(version);
    memo_[size_t(site)].push_back(std::move(m));
    while (memo_[size_t(site)].size() > kKeptPushes) memo_[size_t(site)].pop_front();
  }
  if (cut) {
    ATOLL_RETURN_IF_ERROR(log_.Open(path_));
  } else {
    ATOLL_RETURN_IF_ERROR(log_.Open(path_, contents));
  }
  params_ = std::move(snap->params);
  version_ = snap->version;
  init_ = true;
  LogInfo(
      "coordinator: parameter server recovered from {} and {}: version {}, {} updates decided, "
      "{} parameters",
      path_, snapshot_path_, version_, next_id_, count_);
  return Status::Ok();
}

bool PsService::SnapshotLocked() {
  std::string out;
  out.reserve(kSnapshotHeader + params_.size() * sizeof(float));
  out.append(kSnapshotMagic, sizeof kSnapshotMagic);
  const uint64_t n = params_.size(), hash = Hash64(params_.data(), n * sizeof(float));
  out.append(reinterpret_cast<const char*>(&version_), 8);
  out.append(reinterpret_cast<const char*>(&n), 8);
  out.append(reinterpret_cast<const char*>(&hash), 8);
  out.append(reinterpret_cast<const char*>(params_.data()), n * sizeof(float));
  if (Status st = WriteFileAtomic(snapshot_path_, out); !st.ok()) {
    BreakLocked("its snapshot: " + st.message());
    return false;
  }
  return true;
}

grpc::Status PsService::UsableLocked(const grpc::ServerContext& ctx, const char* rpc, int site,
                                     bool init) const {
  if (!broken_.empty()) return RefuseCall(ctx, rpc, grpc::StatusCode::FAILED_PRECONDITION, broken_);
  if (!init && !init_)
    return RefuseCall(
        ctx, rpc, grpc::StatusCode::FAILED_PRECONDITION,
        fmt::format("site {}: the parameter server has no parameters yet (PsInit first)", site));
  return grpc::Status::OK;
}

void PsService::BreakLocked(const std::string& why) {
  broken_ = fmt::format(
      "the parameter server stopped: {} (its op log and parameters may disagree; replay {} "
      "with `atoll replay`)",
      why, path_);
  LogWarning("coordinator: {}", broken_);
}

grpc::Status PsService::Init(grpc::ServerContext* ctx, const coord::PsInitRequest& req,
                             coord::PsInitReply* reply) {
  constexpr const char* rpc = "PsInit";
  const int site = req.site();
  if (auto st = check_caller_(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  const std::string& bytes = req.params();
  if (bytes.empty() || bytes.size() % sizeof(float) != 0)
    return RefuseCall(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: PsInit with {} bytes of parameters (a positive "
                                  "multiple of 4 is needed)",
                                  site, bytes.size()));
  if (req.max_staleness() < 0)
    return RefuseCall(
        *ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
        fmt::format("site {}: max_staleness {} is negative", site, req.max_staleness()));
  const uint64_t count = bytes.size() / sizeof(float);
  const uint64_t checksum = Hash64(bytes.data(), bytes.size());
  std::lock_guard<std::mutex> lk(mu_);
  if (auto st = UsableLocked(*ctx, rpc, site, /*init=*/true); !st.ok()) return st;
  if ((init_ || logged_init_) && (count != count_ || checksum != checksum_))
    return RefuseCall(
        *ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
        fmt::format("site {}: initial parameters ({} floats, checksum {}) differ from the "
                    "parameter server's ({} floats, checksum {}{}): every site must start from "
                    "the same model config and seed",
                    site, count, HashToHex(checksum), count_, HashToHex(checksum_),
                    init_site_ >= 0 ? fmt::format(", set by site {}", init_site_)
                                    : std::string(", from the op log")));
  if (!init_) {
    if (!log_.is_open()) {
      if (Status st = log_.Open(path_); !st.ok()) {
        LogWarning("coordinator: {}", st.ToString());
        return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            "coordinator cannot open its op log: " + st.message());
      }
    }
    if (!logged_init_) {
      // Where the run's arithmetic came from, so a replay elsewhere can say why it differs.
      Status st = log_.Write({{"t", "init"},
                              {"count", count},
                              {"checksum", HashToHex(checksum)},
                              {"max_staleness", req.max_staleness()},
                              {"site", site},
                              {"build", req.build_id()},
                              {"cpu", req.cpu()}});
      if (!st.ok()) {
        BreakLocked(st.message());
        return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
      }
      logged_init_ = true;
      max_staleness_ = req.max_staleness();
      build_ = req.build_id();
      cpu_ = req.cpu();
    }
    count_ = count;
    checksum_ = checksum;
    init_site_ = site;
    params_.resize(count);
    std::memcpy(params_.data(), bytes.data(), bytes.size());
    version_ = 0;
    next_id_ = 0;
    init_ = true;
    if (!SnapshotLocked()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
    LogInfo(
        "coordinator: parameter server initialized by site {}: {} parameters (checksum {}), max "
        "staleness {}",
        site, count, HashToHex(checksum), max_staleness_);
  }
  if (!build_.empty() && (req.build_id() != build_ || req.cpu() != cpu_) &&
      build_noted_[site] != req.incarnation()) {
    // Sites whose arithmetic may round differently: the run goes on, but a replay (one build,
    // one CPU) cannot re-execute every site bitwise; the log says why.
    Status st =
        log_.Write({{"t", "build"}, {"site", site}, {"build", req.build_id()}, {"cpu", req.cpu()}});
    if (!st.ok()) {
      BreakLocked(st.message());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
    }
    build_noted_[site] = req.incarnation();
    LogWarning(
        "coordinator: site {} runs build {} on \"{}\", the parameter server was initialized by "
        "build {} on \"{}\": their arithmetic may round differently, so `atoll replay` of this "
        "run cannot be bitwise for every site",
        site, req.build_id(), req.cpu(), build_, cpu_);
  }
  const int64_t last_step = last_step_.count(site) ? last_step_[site] : 0;
  if (last_step > 0 && rejoined_[site] != req.incarnation()) {
    // A site calls Init once per process (a retry is the same incarnation): this is a new one
    // taking the site over.
    Status st = log_.Write({{"t", "rejoin"},
                            {"site", site},
                            {"step", last_step},
                            {"version", version_},
                            {"next_update", next_id_}});
    if (!st.ok()) {
      BreakLocked(st.message());
      return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
    }
    rejoined_[site] = req.incarnation();
    LogInfo(
        "coordinator: parameter server: a new process for site {} goes on after its step {} "
        "(version {})",
        site, last_step, version_);
  }
  current_[site] = req.incarnation();
  reply->set_coordinator_id(coordinator_id_);
  reply->set_version(version_);
  reply->set_max_staleness(max_staleness_);
  reply->set_last_step(last_step);
  return grpc::Status::OK;
}

grpc::Status PsService::Pull(grpc::ServerContext* ctx, const coord::PsPullRequest& req,
                             coord::PsPullReply* reply) {
  constexpr const char* rpc = "PsPull";
  const int site = req.site();
  if (auto st = check_caller_(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  if (auto st = CheckRequestSize(*ctx, rpc, req, kCoordinatorMaxSmallRequestBytes); !st.ok())
    return st;
  std::lock_guard<std::mutex> lk(mu_);
  if (auto st = UsableLocked(*ctx, rpc, site, /*init=*/false); !st.ok()) return st;
  if (req.count() != count_)
    return RefuseCall(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: PsPull of {} floats, but the parameter server holds {}",
                                  site, req.count(), count_));
  std::string* out = reply->mutable_params();
  out->resize(params_.size() * sizeof(float));
  std::memcpy(out->data(), params_.data(), out->size());
  reply->set_coordinator_id(coordinator_id_);
  reply->set_version(version_);
  return grpc::Status::OK;
}

grpc::Status PsService::Push(grpc::ServerContext* ctx, const coord::PsPushRequest& req,
                             coord::PsPushReply* reply) {
  constexpr const char* rpc = "PsPush";
  const int site = req.site();
  if (auto st = check_caller_(*ctx, rpc, site, req.incarnation()); !st.ok()) return st;
  const float weight = req.weight();
  if (!std::isfinite(weight))
    return RefuseCall(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: update weight {} is not finite", site, weight));
  if (req.base_version() < 0 || req.first_step() < 0 || req.first_step() > req.last_step())
    return RefuseCall(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: bad update: base version {}, steps {}..{}", site,
                                  req.base_version(), req.first_step(), req.last_step()));
  std::lock_guard<std::mutex> lk(mu_);
  if (auto st = UsableLocked(*ctx, rpc, site, /*init=*/false); !st.ok()) return st;
  // The caller check above ran before this lock: a new process may have taken the site over
  // since (its Init came in between); the old one's push must not count its steps again.
  if (auto it = current_.find(site); it != current_.end() && it->second != req.incarnation())
    return RefuseCall(*ctx, rpc, grpc::StatusCode::FAILED_PRECONDITION,
                      fmt::format("site {}: a push of process {:016x}, which a newer process "
                                  "({:016x}) has taken over from",
                                  site, req.incarnation(), it->second));
  auto& memo = memo_[size_t(site)];
  if (req.seq() != 0) {
    for (const auto& m : memo)
      if (m.incarnation == req.incarnation() && m.seq == req.seq()) {
        LogInfo("coordinator: site {} retried push {} (update {}): answering the first decision",
                site, req.seq(), m.reply.update_id());
        *reply = m.reply;
        return grpc::Status::OK;
      }
  }
  if (req.base_version() > version_)
    return RefuseCall(*ctx, rpc, grpc::StatusCode::INVALID_ARGUMENT,
                      fmt::format("site {}: update from version {}, but the parameter server is "
                                  "at version {}",
                                  site, req.base_version(), version_));
  // Validate the whole update before deciding anything: a bad one changes nothing.
  scratch_.resize(params_.size());
  const std::string& enc = req.encoded();
  const std::span<const uint8_t> encoded(reinterpret_cast<const uint8_t*>(enc.data()), enc.size());
  if (Status st = Decode(encoded, scratch_); !st.ok())
    return RefuseCall(
        *ctx, rpc,
        st.code() == StatusCode::kCorruption ? grpc::StatusCode::DATA_LOSS
                                             : grpc::StatusCode::INVALID_ARGUMENT,
        fmt::format("site {}: update (steps {}..{}, {} bytes) refused, parameters "
                    "unchanged: {}",
                    site, req.first_step(), req.last_step(), enc.size(), st.message()));
  const int64_t staleness = version_ - req.base_version();
  const bool accepted = staleness <= max_staleness_;
  const int64_t id = next_id_;
  const int64_t applied = accepted ? version_ + 1 : -1;
  // Durable before it takes effect: a failed append changes nothing (and stops the server).
  Status st = log_.Write({{"t", "update"},
                          {"update_id", id},
                          {"site", site},
                          {"base_version", req.base_version()},
                          {"first_step", req.first_step()},
                          {"last_step", req.last_step()},
                          {"applied_version", applied},
                          {"checksum", HashToHex(Hash64(enc.data(), enc.size()))},
                          {"bytes", uint64_t(enc.size())},
                          {"weight", double(weight)},
                          {"incarnation", HashToHex(req.incarnation())},
                          {"seq", req.seq()}});
  if (!st.ok()) {
    BreakLocked(st.message());
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
  }
  ++next_id_;
  last_step_[site] = std::max(last_step_[site], req.last_step());
  if (accepted) {
    ApplyUpdate(params_, scratch_, weight);
    version_ = applied;
    // Before the reply: what a pull or the pusher may see is what a restart finds.
    if (!SnapshotLocked()) return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION, broken_);
  }
  LogDebug("coordinator: update {} from site {} (steps {}..{}, base {}, staleness {}): {}", id,
           site, req.first_step(), req.last_step(), req.base_version(), staleness,
           accepted ? fmt::format("applied, version {}", applied)
                    : fmt::format("refused (max staleness {})", max_staleness_));
  reply->set_coordinator_id(coordinator_id_);
  reply->set_accepted(accepted);
  reply->set_update_id(id);
  reply->set_applied_version(applied);
  reply->set_current_version(version_);
  if (req.seq() != 0) {
    memo.push_back({req.incarnation(), req.seq(), *reply});
    while (memo.size() > kKeptPushes) memo.pop_front();
  }
  return grpc::Status::OK;
}

}  // namespace atl
