// The coordinator's server (world/coordinator.h), declared for its two files: server.cc (start,
// shutdown, the durable log and what is published from it, the heartbeat monitor) and calls.cc
// (the calls: authentication, Register, Heartbeat, Round, Peek, Leave, and the parameter
// server's, handed to PsService).
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
#pragma once

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/rng.h"
#include "core/status.h"
#include "world/coordinator.h"
#include "world/coordinator/durable_log.h"
#include "world/coordinator/membership.h"
#include "world/coordinator/ps_service.h"
#include "world/proto/coordinator.grpc.pb.h"

namespace atl {

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
struct MembershipSnapshot {
  uint64_t version = 0;
  std::shared_ptr<const MembershipState> state;
};

class CoordinatorImpl;

class CoordinatorService final : public coord::Coordinator::Service {
 public:
  explicit CoordinatorService(CoordinatorImpl* c) : c_(c) {}
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
  bool CommitLocked(const nlohmann::json& record);
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
  MembershipSnapshot CaptureLocked();
  // Makes `s` what heartbeats see, unless a later state is published already. REQUIRES: every
  // record applied before `s` was captured is durable.
  void Publish(const MembershipSnapshot& s);
  std::shared_ptr<const MembershipState> Published() const;
  void Monitor();
  // Makes the monitor's records durable and publishes them, off the monitor's thread.
  void Syncer();
  std::chrono::steady_clock::time_point WaitDeadline(const grpc::ServerContext& ctx) const;

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
  MembershipSnapshot captured_;      // the last capture
  bool sync_wanted_ = false;         // the monitor has logged records for the syncer

  BeatBoard beats_;
  mutable std::mutex pub_mu_;
  MembershipSnapshot published_;  // guarded by pub_mu_

  PsService ps_;

  std::mutex shutdown_mu_;
  bool shut_down_ = false;
  CoordinatorService service_;
  std::unique_ptr<grpc::Server> server_;
  std::thread monitor_, syncer_;
};

}  // namespace atl
