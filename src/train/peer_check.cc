// The peer check of an audit replay (train/run.h CheckOnPeers): other replicas' executions of a
// step's micro-batches, compared with each one's own (train/sdc/peers.h).
#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "core/hash.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "train/run.h"
#include "train/sdc/monitor.h"
#include "train/sdc/peers.h"

namespace atl {

namespace {

// Replicas of several ranks: of the ranks a replica's findings name faulty, only those whose
// first difference comes first in the step's data flow (FlowKey, over the site's ranks) keep
// the verdict; the others' differences came from them ("reached"). Collective over the site.
Status KeepOrigins(Communicator& world, const Mesh& mesh, const StepTrace& layout,
                   std::vector<PeerFinding>* found) {
  constexpr int64_t kNone = std::numeric_limits<int64_t>::max();
  const size_t dp = size_t(mesh.dp()), words = 4;
  auto replica_of = [&](const PeerFinding& f) { return size_t(f.event.rank); };  // a dp rank
  auto key_of = [&](const PeerFinding& f) { return FlowKey(f, layout, mesh.pp_rank(), mesh.pp()); };
  // This rank's earliest key per replica, then the site's.
  std::vector<int64_t> mine(dp * words, kNone);
  for (const PeerFinding& f : *found) {
    if (f.event.verdict != "faulty_rank") continue;
    const auto k = key_of(f);
    int64_t* at = mine.data() + replica_of(f) * words;
    if (std::lexicographical_compare(k.begin(), k.end(), at, at + words))
      std::copy(k.begin(), k.end(), at);
  }
  std::vector<int64_t> all(mine.size() * size_t(world.size()));
  ATOLL_RETURN_IF_ERROR(world.AllGather(mine.data(), all.data(), mine.size(), DType::kInt64));
  std::vector<int64_t> first(mine.size(), kNone);
  for (int r = 0; r < world.size(); ++r)
    for (size_t x = 0; x < dp; ++x) {
      const int64_t* k = all.data() + (size_t(r) * dp + x) * words;
      int64_t* at = first.data() + x * words;
      if (std::lexicographical_compare(k, k + words, at, at + words)) std::copy(k, k + words, at);
    }
  for (PeerFinding& f : *found) {
    if (f.event.verdict != "faulty_rank") continue;
    const auto k = key_of(f);
    if (!std::equal(k.begin(), k.end(), first.begin() + ptrdiff_t(replica_of(f) * words)))
      f.event.verdict = "reached";
  }
  return Status::Ok();
}

}  // namespace

StatusOr<std::vector<std::string>> CheckOnPeers(Run& run, int64_t s, const StepSnapshot& before,
                                                Communicator& group, bool sites,
                                                NamedFaulty* named) {
  const int n = group.size(), d = group.rank();
  // tp or pp > 1: a replica is several ranks, and every rank of the site takes part, each in the
  // dp group of its (tp, pp) position; a replica's ranks recompute together.
  const Mesh& mesh = run.mesh;
  Communicator* world = mesh.world();
  const bool spread = !sites && world != nullptr && world->size() > n;
  // The world rank of replica x's rank at this position.
  auto rank_of = [&](int x) { return spread ? mesh.RankOf(x, mesh.tp_rank(), mesh.pp_rank()) : x; };
  // Replica r's first micro-batch: the site's replicas, or site r's (one replica each: dp 1).
  auto first_of = [&](int r) {
    return sites ? (int64_t(r) * run.mesh.dp() + run.mesh.dp_rank()) * run.local_accum
                 : FirstMicro(run, r);
  };
  const size_t n_params = run.model->num_params();
  const std::vector<float> after(run.model->params(), run.model->params() + n_params);
  const StepTrace own = *run.trace;
  before.RestoreParams(run.model->params());
  const int next_replica = (d + 1) % n, prev_replica = (d + n - 1) % n;
  ATOLL_RETURN_IF_ERROR(ReplicaPass(run, s, first_of(next_replica)));
  const StepTrace next = *run.trace;
  StepTrace prev;
  if (n > 2) {
    ATOLL_RETURN_IF_ERROR(ReplicaPass(run, s, first_of(prev_replica)));
    prev = *run.trace;
  }
  std::vector<int64_t> first(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) first[size_t(r)] = first_of(r);
  // Replicas on different kernels (BLAS family, compiler, CPU or GPU model) are not comparable.
  const std::string backend = kernels::InitBackend().blas_core + " " + __VERSION__ + " " +
                              DeviceDescription(run.model->device());
  bool comparable = true;
  StatusOr<std::vector<PeerFinding>> shared =
      SharePeerCheck(group, own, next, prev, first, run.site, s,
                     Hash64(before.params().data(), n_params * sizeof(float)),
                     Hash64(backend.data(), backend.size()), &comparable, sites);
  if (spread) {  // every position ends alike: compared only where every one's executions are
    int64_t flags[2] = {shared.ok() ? 0 : 1, shared.ok() && comparable ? 0 : 1};
    ATOLL_RETURN_IF_ERROR(world->AllReduce(std::span<int64_t>(flags)));
    if (flags[0] > 0 && shared.ok())
      return Status::Internal(fmt::format(
          "step {}: the replicas' ranks at another (tp, pp) position traced different numbers "
          "of ops; cannot compare their executions",
          s + 1));
    if (flags[1] > 0 && shared.ok()) {
      comparable = false;
      shared->clear();
    }
  }
  ATOLL_ASSIGN_OR_RETURN(std::vector<PeerFinding> found, std::move(shared));
  if (!comparable && run.mesh.rank() == 0)
    LogWarning(
        "step {}: the replicas started from different parameters or run different kernels; "
        "no peer check",
        s + 1);
  // The confirmations: 1 repeated, 0 not, -1 not asked.
  int again = -1;
  for (const PeerFinding& f : found)
    if (f.recomputer == d) again = f.data_of;
  bool confirm = std::any_of(found.begin(), found.end(),
                             [](const PeerFinding& f) { return f.recomputer >= 0; });
  // Spread: the positions' findings may differ (a fault shows on the ranks it reached), and a
  // recomputation needs all of a replica's ranks: each replica repeats the one any of its
  // positions asks for (the highest). A position whose own finding asked for another one leaves
  // it unconfirmed: it stands, naming the rank (two faults at once; the run stops either way).
  int redo = again;
  if (spread) {
    std::vector<int64_t> asks(size_t(world->size()));
    const int64_t mine = again;
    ATOLL_RETURN_IF_ERROR(world->AllGather(&mine, asks.data(), 1, DType::kInt64));
    confirm = std::any_of(asks.begin(), asks.end(), [](int64_t a) { return a >= 0; });
    for (int t = 0; t < mesh.tp(); ++t)
      for (int p = 0; p < mesh.pp(); ++p)
        redo = std::max(redo, int(asks[size_t(mesh.RankOf(d, t, p))]));
  }
  if (confirm) {
    int64_t repeated = -1;
    if (redo >= 0) {
      ATOLL_RETURN_IF_ERROR(ReplicaPass(run, s, first_of(redo)));
      const StepTrace& earlier = redo == next_replica ? next : prev;
      if (again == redo) repeated = TraceWords(*run.trace) == TraceWords(earlier) ? 1 : 0;
    }
    std::vector<int64_t> all(static_cast<size_t>(n));
    ATOLL_RETURN_IF_ERROR(
        group.AllGather(std::span<const int64_t>(&repeated, 1), std::span<int64_t>(all)));
    for (PeerFinding& f : found)
      if (f.recomputer >= 0 && all[size_t(f.recomputer)] == 0) {
        f.event.verdict = "transient";  // the recomputer's second run differed from its first
        f.event.site = sites ? f.recomputer : run.site;
        f.event.rank = sites ? 0 : f.recomputer;
        f.event.peer = -1;
        f.event.run = "peer check";
      }
  }
  std::copy(after.begin(), after.end(), run.model->params());
  *run.trace = own;
  if (spread) ATOLL_RETURN_IF_ERROR(KeepOrigins(*world, mesh, own, &found));
  *named = NamedFaulty();
  for (const PeerFinding& f : found) {
    if (f.event.verdict != "faulty_rank") continue;
    if (!f.event.has_majority) named->unsure = true;
    const int site = sites ? f.event.site : run.site;
    if (f.event.has_majority &&
        std::find(named->sites.begin(), named->sites.end(), site) == named->sites.end())
      named->sites.push_back(site);
  }
  if (!comparable) return std::vector<std::string>();
  if (!spread) return PeerEvents(found, run.site, s, run.mesh.rank() == 0);
  // Spread: the events name world ranks; every position's, the same on every rank.
  for (PeerFinding& f : found) {
    f.event.rank = rank_of(f.event.rank);
    if (f.event.peer >= 0) f.event.peer = rank_of(f.event.peer);
    f.event.what = fmt::format("micro-batches of replica {}", f.data_of);
  }
  std::vector<std::string> mine = PeerEvents(found, run.site, s, group.rank() == 0);
  if (!HasFaultyRank(mine)) mine.pop_back();  // the "agree" event: added once below
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::string> events, ShareEvents(*world, mine));
  if (!HasFaultyRank(events)) events.push_back(PeerEvents({}, run.site, s, false).back());
  return events;
}

}  // namespace atl
