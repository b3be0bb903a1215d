// The asynchronous parameter server the coordinator hosts (world/ps.h semantics; behaviour as
// documented in world/coordinator.h): PsInit, PsPull and PsPush, its op log STATE/ops.jsonl
// (opened at the first PsInit, so runs of other strategies have none), and what a restart finds.
//
// Beside the log, STATE/ps_params.bin holds the parameters of the latest version (written
// atomically at Init and after every accepted update, before the reply; format: "ATLPSV01",
// int64 version, uint64 count, uint64 XXH3 of the floats, count float32). A push is logged,
// applied, snapshotted, then answered, under the server's lock, so a restart finds the snapshot
// at the log's last applied version, or (killed between the two) one behind it: that last
// update was never answered nor seen by a pull, so it is cut from the log and the site's retry
// decides it again. Update records carry the pushing process and its sequence number, so the
// restarted server answers a retried push with the first decision too.
//
// It has its own lock, never held together with the coordinator's membership lock: a push of a
// large update never delays heartbeats or rounds. The server authenticates every call and checks
// membership through `check_caller` before anything here looks at the request.
//
// Thread-safety: every method is thread-safe.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/status.h"
#include "world/coordinator/durable_log.h"
#include "world/proto/coordinator.grpc.pb.h"
#include "world/ps.h"

namespace atl {

// Logs a refused call (what, from whom, why) and returns its status.
grpc::Status RefuseCall(const grpc::ServerContext& ctx, const char* rpc, grpc::StatusCode code,
                        const std::string& message);
// The per-method limit: RESOURCE_EXHAUSTED (logged) when `req` is larger than `limit` bytes.
// The transport's own limit (kCoordinatorMaxMessageBytes) is the parameter server's transfers'.
grpc::Status CheckRequestSize(const grpc::ServerContext& ctx, const char* rpc,
                              const google::protobuf::Message& req, size_t limit);

class PsService {
 public:
  // OK when the call is authenticated and (site, incarnation) is a live member.
  using CallerCheck = std::function<grpc::Status(const grpc::ServerContext& ctx, const char* rpc,
                                                 int site, uint64_t incarnation)>;
  PsService(std::string state_dir, int sites, uint64_t coordinator_id, CallerCheck check_caller);

  // Reads STATE/ops.jsonl if there is one (see world/coordinator.h: a restart). kCorruption for a
  // damaged log.
  Status Start();

  grpc::Status Init(grpc::ServerContext* ctx, const coord::PsInitRequest& req,
                    coord::PsInitReply* reply);
  grpc::Status Pull(grpc::ServerContext* ctx, const coord::PsPullRequest& req,
                    coord::PsPullReply* reply);
  grpc::Status Push(grpc::ServerContext* ctx, const coord::PsPushRequest& req,
                    coord::PsPushReply* reply);

 private:
  // OK when the server can serve (it has parameters, unless `init`); else the reason.
  grpc::Status UsableLocked(const grpc::ServerContext& ctx, const char* rpc, int site,
                            bool init) const;
  void BreakLocked(const std::string& why);
  // Writes STATE/ps_params.bin for version_; false (broken) when it cannot.
  bool SnapshotLocked();
  // Start with updates in the log: the parameters from the snapshot; false when it does not
  // match the log (then broken_ says why).
  Status RecoverLocked(const LogContents& contents, const OpLog& log);

  struct PushMemo {
    uint64_t incarnation = 0, seq = 0;
    coord::PsPushReply reply;
  };

  const std::string path_, snapshot_path_;
  const uint64_t coordinator_id_;
  const CallerCheck check_caller_;

  mutable std::mutex mu_;
  DurableLog log_;
  bool logged_init_ = false;  // ops.jsonl has the init record (this or an earlier process)
  bool init_ = false;         // params_ hold the parameters
  uint64_t count_ = 0, checksum_ = 0;
  int init_site_ = -1;
  int64_t max_staleness_ = 0;
  std::vector<float> params_, scratch_;
  int64_t version_ = 0, next_id_ = 0;
  std::map<int, int64_t> last_step_;     // by site: the last step of its decided pushes
  std::map<int, uint64_t> rejoined_;     // by site: the process whose rejoin is logged
  std::string build_, cpu_;              // of the init record ("" : an older log)
  std::map<int, uint64_t> build_noted_;  // by site: the process whose other build is logged
  // By site: the process whose Init came last (since this server started): a push of an older
  // one, decided after a new process took the site over, is refused.
  std::map<int, uint64_t> current_;
  std::string broken_;                      // non-empty: every call is refused with this reason
  std::vector<std::deque<PushMemo>> memo_;  // per site: recent pushes, for retries
};

}  // namespace atl
