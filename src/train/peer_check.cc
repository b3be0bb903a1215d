// The peer check of an audit replay (train/run.h CheckOnPeers): other replicas' executions of a
// step's micro-batches, compared with each one's own (train/sdc/peers.h).
#include <algorithm>
#include <string>
#include <vector>

#include "core/hash.h"
#include "core/log.h"
#include "kernels/ops.h"
#include "train/run.h"
#include "train/sdc/peers.h"

namespace atl {

StatusOr<std::vector<std::string>> CheckOnPeers(Run& run, int64_t s, const StepSnapshot& before,
                                                Communicator& group, bool sites,
                                                NamedFaulty* named) {
  const int n = group.size(), d = group.rank();
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
  const std::string backend = kernels::InitBackend().blas_core + " " + __VERSION__;
  bool comparable = true;
  ATOLL_ASSIGN_OR_RETURN(
      std::vector<PeerFinding> found,
      SharePeerCheck(group, own, next, prev, first, run.site, s,
                     Hash64(before.params().data(), n_params * sizeof(float)),
                     Hash64(backend.data(), backend.size()), &comparable, sites));
  if (!comparable && run.mesh.rank() == 0)
    LogWarning(
        "step {}: the replicas started from different parameters or run different kernels; "
        "no peer check",
        s + 1);
  // The confirmations: 1 repeated, 0 not, -1 not asked.
  int again = -1;
  for (const PeerFinding& f : found)
    if (f.recomputer == d) again = f.data_of;
  const bool confirm = std::any_of(found.begin(), found.end(),
                                   [](const PeerFinding& f) { return f.recomputer >= 0; });
  if (confirm) {
    int64_t repeated = -1;
    if (again >= 0) {
      ATOLL_RETURN_IF_ERROR(ReplicaPass(run, s, first_of(again)));
      const StepTrace& earlier = again == next_replica ? next : prev;
      repeated = TraceWords(*run.trace) == TraceWords(earlier) ? 1 : 0;
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
  return PeerEvents(found, run.site, s, run.mesh.rank() == 0);
}

}  // namespace atl
