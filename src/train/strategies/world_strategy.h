// How the sites of a world agree, as the training loop (train/trainer.cc) sees it: one interface
// with an implementation per world.strategy, so the loop is the step loop and nothing else, and
// new ways to agree (a corruption guard, elastic sync) plug in without another branch there.
//
//   sync        sync_strategy.cc      the world sum of the gradients after backward, every step
//   diloco,     lowcomm_strategy.cc   train/strategies/lowcomm.h after the optimizer step;
//   streaming                         rejoins (a lost site's new process takes a live site's state)
//   async       async_strategy.cc     train/strategies/async_client.h after the optimizer step
//   (one site)  world_strategy.cc     nothing to agree on
//
// One object per rank. The site's leader (rank 0 of the site's Communicator) does the WAN work
// through WorldHooks (supplied by `atoll train`, or by tests and `atoll replay`); the site's other
// ranks follow the same schedule and take what changed by broadcast inside the site.
//
// The loop calls, on every rank:
//   Start(start)         once, before the first step: returns the step to train from (a process
//                        that takes a lost site over starts where it took over), having set the
//                        parameters where the strategy decides them (async's first pull, a
//                        rejoin's state);
//   TakenOver()          before each step's passes: the lost sites whose micro-batches this site
//                        computes besides its own (sync: the live sites share a lost site's, so
//                        the batch does not change);
//   AfterBackward(...)   after the site's gradients are reduced: sync sums gradients and losses
//                        over the live sites and agrees on the sums in the coordinator's round;
//                        false when the live sites changed before they agreed: the loop computes
//                        the step's passes again (TakenOver has changed) and calls it again;
//   AfterStep(...)       after the optimizer step: exchanges, merges, pushes and pulls; on the last
//                        step also the end (the final exchange, async's barrier and last pull);
//   Fill(&metrics)       the step's WAN fields;
//   Summary()            a line for the log at the end ("" for none);
//   lead_site()          the site that validates and writes checkpoints: the lowest live one;
//   AgreeOnLive()        before a checkpoint and the last validation: the live sites meet and
//                        agree who is live, so lead_site() is live and the same everywhere;
//   generation()         how many times the live sites changed (a replayed step compares runs
//                        of one generation).
// and for the corruption detectors (train/sdc/), where the sites hold one model (sync):
//   SumOverSites(n)      a count summed over the sites, so that they decide alike whether to replay
//                        a step (which they then do together);
//   GatherOverSites(h)   the leader's fingerprints gathered from every live site (cross-site
//                        replicas);
//   RepairAcrossSites    state at rest a site's memory check could not repair, copied from a site
//                        whose check passed.
//
// Thread-safety: one thread calls each object.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/config.h"
#include "train/metrics.h"
#include "train/optimizer.h"
#include "train/sdc/monitor.h"
#include "world/exchange.h"
#include "world/ps.h"
#include "world/wan.h"

namespace atl {

// What the strategies reach the world through, on the site's leader (empty for one site).
struct WorldHooks {
  int site = 0;  // this site's index
  // sync: the WAN Communicator among the sites' leaders (rank = site), the coordinator's round
  // with votes (CoordinatorClient::Round: every step's sums are agreed there, and a lost site is
  // seen there; may be empty: every site stays, nothing is agreed) and the bytes the leader has
  // sent over the WAN (for metrics; may be empty).
  Communicator* wan = nullptr;
  std::function<StatusOr<Membership>(int64_t round, std::optional<RoundVote> vote)> commit;
  std::function<uint64_t()> wan_bytes;
  // sync, after a site came back as a new process: the address each other site's link was made
  // to (empty: none yet), and a fresh link with a site at its new address (WanEndpoint::Reconnect,
  // which the site calls too). Empty: a site cannot come back.
  std::vector<std::string> addresses;
  std::function<Status(int site, const std::string& address)> reconnect;
  // This site leaves the world cleanly, now (CoordinatorClient::Leave): the others stop waiting
  // for it at once (sdc.on_faulty = exclude). May be empty.
  std::function<Status()> leave;
  // diloco, streaming: the average over the live sites (SiteExchange::Average, world/exchange.h).
  AverageFn average;
  // Rejoins. sync (train/strategies/sync_state.h): a new process for a lost site joins at step
  // J = current + 2 (current_round(): the latest step a live site has begun;
  // join(kSyncRoundsPerStep * J, kSyncRoundsPerStep): refused when a live site began step
  // J - 1), then fetches J's state (index: the step, 0-based), which the live sites publish only
  // while a registered process waits to join.
  // diloco, streaming (train/strategies/lowcomm.h LowCommState): publish is called at
  // every quiet point with the state a lost site's new process can take over (index: the next
  // exchange's round; WanEndpoint::Publish). With rejoin, this process takes over a site that was
  // lost: current_round() is the latest exchange round a live site has begun (-1: none); join(r,
  // early_by) registers this process for the world from coordinator round r on (kNotFound: too
  // late, a live site has reached r - early_by; exchange round J begins at coordinator round
  // 16 J); fetch(min)
  // returns a live site's state with index >= min (kNotFound while there is none). The process
  // joins at J = current + 2, waits for the state that leads into J (polling fetch, up to
  // rejoin_timeout_s in all) and trains from its step. async: join(AsyncEndRound(train.steps)),
  // then the parameter server's Init tells the step after which the site goes on, and Pull the
  // parameters.
  std::function<void(uint64_t index, std::shared_ptr<const std::string> state)> publish;
  bool rejoin = false;
  std::function<StatusOr<int64_t>()> current_round;
  std::function<Status(int64_t coordinator_round, int64_t early_by)> join;
  std::function<StatusOr<std::pair<uint64_t, std::string>>(uint64_t min_index)> fetch;
  double rejoin_timeout_s = 600;
  // async: the parameter server, and the barrier at the end (returns when every live site has
  // made its last push; may be empty).
  ParameterServer* ps = nullptr;
  std::function<Status()> finish_barrier;
  // Fault injection (train/sdc/faults.h kind wan): installs (null: removes) the function the WAN
  // transport calls on every data chunk this site sends, before its checksum
  // (WanEndpoint::SetPayloadFault). Empty: not available (an in-process WAN).
  std::function<void(WanPayloadFault)> payload_fault;
};

// Micro-batches of a site's data-parallel replica in a step (Run::local_accum): what the sites'
// shares (world.balance) are counted in, site by site.
inline int64_t LocalAccum(const RunConfig& c) {
  return c.train.batch_size / c.train.micro_batch_size / (c.parallel.dp * c.world.sites);
}

// sync: the coordinator rounds of step s are kSyncRoundsPerStep * s + the rounds taken in it so
// far (the step's sums, each computed again, the detectors' collectives, the agreements before
// checkpoints). A lost site's new process joins at the first round of a step.
inline constexpr int64_t kSyncRoundsPerStep = 64;

// async: the coordinator rounds. The sites meet only at a checkpoint's step k (rounds 2k - 1: every
// push is in, and 2k: every pull is done, a consistent cut), at the barrier at the end (round
// 2 * train.steps, which a lost site's new process joins) and in the agreements after it.
inline int64_t AsyncCheckpointRound(int64_t step, int phase) { return 2 * step - 1 + phase; }
inline int64_t AsyncEndRound(int64_t steps) { return 2 * steps; }

// What a site has after backward: sync sums it with the other sites; diloco and streaming read
// only their own `seconds` (world.balance).
struct SiteSums {
  std::span<float> grads;  // the site's reduced gradients (n_params)
  // The reproducible mode: their exact int64 sums (GradientReducer::fixed_sums), summed over the
  // sites in place of grads (the caller converts them afterwards, so any share of the batch
  // gives the same bits). Otherwise empty.
  std::span<int64_t> fixed;
  // Every micro-batch's loss of the whole batch (the site's own filled in, the others' zero),
  // followed by any other doubles the sites sum with them (the gradient checksum's records; with
  // world.balance, `seconds`).
  std::span<double> losses;
  // world.balance: by site, its passes' seconds per micro-batch in this step (this site's filled
  // in, the others' zero): the tail of losses (sync sums them; diloco and streaming vote with
  // their own at exchanges). Empty without.
  std::span<double> seconds;
};

// Where a strategy runs: the run's config, the world, the site's ranks.
struct StrategyContext {
  const RunConfig* cfg = nullptr;
  const WorldHooks* world = nullptr;
  Communicator* site_comm = nullptr;  // the site's ranks (null or size 1: one rank)
  bool leader = true;                 // rank 0 of the site
  size_t n_params = 0;                // this rank's parameters (the whole model: tp = pp = 1)
  AdamW* optimizer = nullptr;         // this rank's (sync rejoins serve and take its moments)
  bool resumed = false;               // the run continues from a checkpoint
  std::string resume_path;            // ... this one (its per-site states: SiteStatePath)
  // sync: called with the site's reduced gradients (SiteSums::fixed in the reproducible mode, else
  // grads, as bytes) just before they cross the WAN (after: false)
  // and with the world's sum just after (after: true): the audit replay's trace, where a
  // difference that appears across the WAN came over it. May be empty.
  std::function<void(std::span<const std::byte> sums, bool after)> on_wan;
};

class WorldStrategy {
 public:
  virtual ~WorldStrategy() = default;
  // The step to train from, given the loop's (0, or a resumed checkpoint's); may set params.
  virtual StatusOr<int64_t> Start(int64_t start, float* params) = 0;
  // The lost sites whose micro-batches of the next step this site computes besides its own,
  // sorted (sync after a site was lost; otherwise none).
  // Collective over the site's ranks.
  virtual StatusOr<std::vector<int>> TakenOver() { return std::vector<int>{}; }
  // world.balance (sync, diloco, streaming), after TakenOver: this site's part of step `step`'s
  // micro-batches, as
  // ranges [from, to) of the sites' shares laid end to end (position p: micro-batch
  // p % local_accum of site p / local_accum's share). Empty: its own share and those TakenOver
  // named. The same on every rank of the site, and for a step in every execution of it.
  virtual std::vector<std::pair<int64_t, int64_t>> Share(int64_t step) { return {}; }
  // Step `step` (0-based): what the site sums with the others (SiteSums). false: the live sites
  // changed before the sums were agreed; compute the step's passes again, with TakenOver(), and
  // call again (the sums were not changed).
  virtual StatusOr<bool> AfterBackward(int64_t step, const SiteSums& sums) = 0;
  // After the optimizer step that completed step `completed`; `last`: the run's last step.
  virtual Status AfterStep(int64_t completed, float* params, bool last) = 0;
  virtual void Fill(StepMetrics* m) const = 0;
  virtual std::string Summary() const = 0;
  // true: the objective is the mean loss over the whole batch (sync: gradients are summed over
  // the sites); false: over the site's share of it (the sites train apart between exchanges).
  virtual bool whole_batch() const = 0;
  // The site that validates and writes the checkpoints: the lowest live site (sync: of the last
  // round; diloco, streaming: of the last merged exchange; async: site 0, then the lowest site that
  // met at the last checkpoint's cut, until the end).
  virtual int lead_site() const { return 0; }
  // With a coordinator: the live sites meet in a round and adopt who is live there (a site lost
  // since the last step's sums is seen). sync: any time; the others: after the last step's end
  // (their final exchange or barrier; before it, nothing). Collective over the world.
  virtual Status AgreeOnLive() { return Status::Ok(); }
  // Before a validation that is not the last: the leader's lead_site() to the site's ranks (the
  // same on every rank, as the validation is collective in the site).
  virtual Status ShareLead() { return Status::Ok(); }
  // Beside the checkpoint of step `step` in checkpoint_dir (written by the lead site): this
  // site's own state, which a resume needs besides it (diloco, streaming: SiteStatePath). On
  // every rank of every site.
  virtual Status SaveSiteState(const std::string& checkpoint_dir, int64_t step,
                               const float* params) {
    return Status::Ok();
  }
  // The number of changes of the live sites so far, the same on every rank of every live site.
  virtual int64_t generation() const { return 0; }
  // Whether the world goes on without a site that is lost or leaves (WorldHooks::leave) at a
  // step boundary, with the same batch (sync with a coordinator). The same on the site's ranks.
  virtual bool elastic() const { return false; }
  // sync over several sites of one rank each, while every site is live: the sites' leaders (the
  // WAN), whose ranks are the sites, for the audit replay's peer check (train/sdc/peers.h);
  // otherwise null.
  virtual Communicator* PeerSites() { return nullptr; }
  // n summed over the sites when they hold one model and must decide together (sync), on every
  // rank; otherwise n. Collective over the world (sync) or nothing.
  virtual StatusOr<int64_t> SumOverSites(int64_t n) { return n; }
  // sync, on the leader: every live site's `mine` (the same length everywhere). Otherwise, and
  // on the other ranks: empty (no cross-site replicas). Collective over the sites' leaders.
  virtual StatusOr<SiteHashes> GatherOverSites(const std::vector<uint64_t>& mine) {
    (void)mine;
    return SiteHashes{};
  }
  // sync: when some site's memory check left state it could not repair (`corrupt`: this rank's
  // verdict), every rank of every site takes the parameters and moments of the lowest site with
  // none (train/sdc/memory.h RepairFromReplica over the sites' leaders, then inside each site);
  // returns that site, or -1 (nothing to repair, no clean site, or not sync). Collective over
  // the world (sync).
  virtual StatusOr<int> RepairAcrossSites(bool corrupt, const HostStateFn& state) {
    (void)corrupt, (void)state;
    return -1;
  }
};

// The strategy of cfg.world (one site: none). Bad or missing hooks: kInvalidArgument.
StatusOr<std::unique_ptr<WorldStrategy>> MakeWorldStrategy(const StrategyContext& context);

// The implementations (world_strategy.cc picks one).
StatusOr<std::unique_ptr<WorldStrategy>> MakeSyncStrategy(const StrategyContext& context);
StatusOr<std::unique_ptr<WorldStrategy>> MakeLowCommStrategy(const StrategyContext& context);
StatusOr<std::unique_ptr<WorldStrategy>> MakeAsyncStrategy(const StrategyContext& context);

// Sync over several sites (world.strategy = "sync", world.sites > 1): the sites hold one model,
// their gradients are summed over the WAN every step, and the detectors compare and repair
// across them.
inline bool SyncOverSites(const RunConfig& cfg) {
  return cfg.world.sites > 1 && cfg.world.strategy == "sync";
}

// What the sync strategy would have sent by step `steps` for the same progress (its ring
// all-reduce of the float32 gradient every step: 2 (sites - 1) / sites of it per leader): the
// low-communication strategies' metrics compare against it.
uint64_t SyncBytesByStep(const RunConfig& cfg, int64_t steps);

// The data chunks each site's leader sends in one step's gradient all-reduce over the WAN (a ring
// reduce-scatter then all-gather of the float32 gradients in chunks of chunk_bytes, world/wan.h):
// 2 (sites - 1) blocks of about params / sites. Where a drawn wan fault strikes (faults.h).
int64_t SyncWanChunksPerStep(const RunConfig& cfg, size_t chunk_bytes = size_t{1} << 20);

// A lost site's new process (its leader), for sync and diloco/streaming alike: registers for unit
// J = (the latest unit a live site has begun) + 2 (a unit is a sync step or an exchange round:
// coordinator round rounds_per_unit * J; join refuses it when a live site has reached
// rounds_per_unit * J - early_by), trying a later J when it was too late, then polls fetch for the
// state published under J, up to w.rejoin_timeout_s in all. name(J): "step 5", for messages;
// past_end(J): J is past the run's last unit (kUnavailable). The unit and the state's bytes.
struct FetchedState {
  int64_t unit = 0;
  std::string bytes;
};
StatusOr<FetchedState> RegisterAndFetch(const WorldHooks& w, int64_t rounds_per_unit,
                                        int64_t early_by,
                                        const std::function<std::string(int64_t)>& name,
                                        const std::function<bool(int64_t)>& past_end);

// After the run's last exchange (diloco, streaming) or barrier (async), where no round of theirs
// follows: the leader meets the live sites in coordinator round `round`; the lowest live site
// there, to the site's ranks. `fallback` without a coordinator. kUnavailable when this site is
// not live in that round.
StatusOr<int> LowestLiveAfterTheEnd(const StrategyContext& c, int64_t round, int fallback);

// Where site `site` keeps its state beside the checkpoint in checkpoint_dir (DIR.sites/site-N.bin).
std::string SiteStatePath(const std::string& checkpoint_dir, int site);
// A resumed run (diloco, streaming, async), on the leader: the bytes of this site's state beside
// the checkpoint it resumes from (kInvalidArgument naming the file when there are none).
StatusOr<std::string> ReadSiteState(const StrategyContext& c);
// Writes this site's state beside the checkpoint in dir (the leader's), atomically.
Status WriteSiteState(const StrategyContext& c, const std::string& dir, const std::string& bytes);
// A resumed run: the leader's AdamW moments (set from its site state) and update count to the
// site's other ranks (every rank of a site keeps the same inner optimizer: tp = pp = 1, no ZeRO
// with sites).
Status ShareOptimizerInSite(const StrategyContext& c, int64_t adam_steps);

// Inside the site: the leader's `data` to every rank (a no-op for one rank).
template <class T>
Status ShareInSite(const StrategyContext& c, std::span<T> data) {
  if (c.site_comm == nullptr || c.site_comm->size() == 1 || data.empty()) return Status::Ok();
  return c.site_comm->Broadcast(data, 0);
}

}  // namespace atl
