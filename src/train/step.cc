// One step of the training loop (train/step.h): its computation, the detectors' check and the
// audit replay.
#include "train/step.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "core/log.h"
#include "parallel/data_parallel.h"
#include "parallel/grad_norm.h"
#include "train/schedule.h"
#include "train/sdc/peers.h"

namespace atl {

Status CheckStep(Run& run, int64_t s, StepMetrics* m) {
  // The state is read for the fingerprints alone (on the GPU, hashed there).
  const bool hashed = run.sdc->fingerprints();
  ATOLL_ASSIGN_OR_RETURN(std::vector<SdcEvent> events,
                         run.sdc->AfterStep(s, m->loss, m->grad_norm, m->lr,
                                            hashed ? run.model->resident_params() : nullptr,
                                            hashed ? run.optimizer->resident_m() : nullptr,
                                            hashed ? run.optimizer->resident_v() : nullptr));
  std::vector<std::string> mine;
  for (const SdcEvent& e : events) {
    LogWarning("silent data corruption suspected: {}", e.ToString());
    mine.push_back(e.ToJson());
  }
  if (run.mesh.size() > 1) {
    ATOLL_ASSIGN_OR_RETURN(m->sdc, ShareEvents(*run.mesh.world(), mine));
  } else {
    m->sdc = std::move(mine);
  }
  if (!m->sdc.empty() && !OnlyRepaired(m->sdc) && run.cfg.sdc.on_alarm == "stop")
    return Status::Internal(fmt::format(
        "silent data corruption suspected at step {} ({}{}); sdc.on_alarm = stop ends the run",
        s + 1, m->sdc.front(),
        m->sdc.size() > 1 ? fmt::format(" and {} more", m->sdc.size() - 1) : ""));
  return Status::Ok();
}

Status ComputeStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                   std::vector<double>& local_losses, StepMetrics* m) {
  const Mesh& me = run.mesh;
  const TrainConfig& tc = run.cfg.train;
  const size_t n_params = run.model->num_params();
  const bool over_wan = SyncOverSites(run.cfg);
  std::vector<double> all_losses(static_cast<size_t>(run.accum), 0.0);
  // The site's passes and its sums with the other sites, again when the live sites changed before
  // they agreed (sync: the survivors take over a lost site's micro-batches).
  // This replica's micro-batches: its own, then those of the lost sites it takes over; with
  // world.balance, its site's share of the sites' shares laid end to end, cut at their ends.
  std::vector<int64_t> firsts, counts;  // each block's first micro-batch and micro-batches
  // The objective's micro-batches: `objective`, or with a share of the sites' that this site's
  // replica trains on alone (diloco, streaming), the share's.
  int64_t own = objective;
  for (bool agreed = false; !agreed;) {
    own = objective;
    firsts = {run.first_micro};
    ATOLL_ASSIGN_OR_RETURN(const std::vector<int> taken, strategy.TakenOver());
    for (int lost : taken)
      firsts.push_back((int64_t(lost) * me.dp() + me.dp_rank()) * run.local_accum);
    counts.assign(firsts.size(), run.local_accum);
    const auto share = strategy.Share(s);
    if (!share.empty()) {
      firsts.clear();
      counts.clear();
      const int64_t L = run.local_accum;
      for (auto [from, to] : share)
        for (int64_t x = from; x < to;) {
          const int64_t site = x / L, end = std::min(to, (site + 1) * L);
          firsts.push_back((site * me.dp() + me.dp_rank()) * L + x % L);
          counts.push_back(end - x);
          x = end;
        }
      if (!strategy.whole_batch())
        own = me.dp() * std::accumulate(counts.begin(), counts.end(), int64_t(0));
    }
    run.loss_scale = 1.0f / float(own);
    try {
      // Blocks of any size only with world.balance (they take a schedule each).
      ATOLL_RETURN_IF_ERROR(ForwardBackward(run, s, &local_losses, firsts,
                                            share.empty() ? std::span<const int64_t>() : counts));
    } catch (const std::runtime_error& e) {  // a failed tensor-parallel all-reduce
      return Status::Internal(fmt::format("step {}: {}", s + 1, e.what()));
    }
    double passes_s = run.passes_s;
    if (run.slowdown > 1) {
      std::this_thread::sleep_for(std::chrono::duration<double>((run.slowdown - 1) * passes_s));
      passes_s *= run.slowdown;
    }
    // Every micro-batch's loss, summed in global order (the last stage's tp rank 0 of replica r
    // holds micro-batches r*k/D ...).
    std::fill(all_losses.begin(), all_losses.end(), 0.0);
    if (me.last_stage() && me.tp_rank() == 0)
      for (size_t b = 0, at = 0; b < firsts.size(); ++b) {
        std::copy_n(local_losses.begin() + std::ptrdiff_t(at), counts[b],
                    all_losses.begin() + firsts[b]);
        at += size_t(counts[b]);
      }
    if (me.size() > 1) ATOLL_RETURN_IF_ERROR(me.world()->AllReduce(std::span<double>(all_losses)));
    if (run.faults != nullptr) run.faults->AtWan(s);
    // The sites' sums: the gradients (the reproducible mode's exact int64 sums), the losses and,
    // with sync across sites, the gradient checksum's records, which the WAN sums with the
    // losses. The reduced gradient is checked against them where the optimizer reads it.
    const std::span<double> records =
        over_wan && run.grad_sums != nullptr ? run.grad_sums->records() : std::span<double>();
    std::vector<double> sums = all_losses;
    sums.insert(sums.end(), records.begin(), records.end());
    // world.balance: this site's seconds per micro-batch in its slot, the others' zero (sync
    // sums them over the sites; diloco and streaming vote with their own at exchanges).
    const size_t timed = run.sites > 1 && run.cfg.world.balance ? size_t(run.sites) : 0;
    sums.resize(sums.size() + timed, 0.0);
    if (timed > 0) {
      const int64_t computed = std::accumulate(counts.begin(), counts.end(), int64_t(0));
      sums[sums.size() - timed + size_t(run.site)] = passes_s / double(computed);
    }
    SiteSums site;
    // Only sync over sites sums gradients (on the GPU, reading them downloads them).
    if (over_wan) site.grads = std::span<float>(run.model->grads(), n_params);
    if (over_wan && run.reducer != nullptr) site.fixed = run.reducer->fixed_sums();
    site.losses = std::span<double>(sums);
    site.seconds = std::span<double>(sums).last(timed);
    ATOLL_ASSIGN_OR_RETURN(agreed, strategy.AfterBackward(s, site));
    if (!agreed) continue;
    run.blocks = firsts.size();
    run.generation = strategy.generation();
    if (!site.fixed.empty()) run.reducer->ConvertFixed(run.model->grads());
    std::copy(sums.begin(), sums.begin() + run.accum, all_losses.begin());
    std::copy_n(sums.begin() + run.accum, records.size(), records.begin());
  }
  InjectBufferFaults(run, FaultKind::kGrad, s);
  CheckReducedGradient(run, me.dp() * (over_wan ? run.sites : 1));
  if (run.trace != nullptr) {
    std::vector<int64_t> micros;  // the whole batch's index of each local micro-batch
    for (size_t b = 0; b < firsts.size(); ++b)
      for (int64_t j = 0; j < counts[b]; ++j) micros.push_back(firsts[b] + j);
    run.trace->SetLosses(local_losses, std::move(micros));
    if (Zero(run))
      run.trace->SetGrads({}, run.reducer->shard_grads(), run.optimizer->size());
    else
      run.trace->SetGrads(run.model->layout(), ModelView(run).grads(), n_params);
  }
  double loss_sum = 0.0;
  for (double l : all_losses) loss_sum += l;
  m->loss = loss_sum / double(own);
  ATOLL_ASSIGN_OR_RETURN(const double squared_norm, SquaredGradNorm(run));
  m->grad_norm = std::sqrt(squared_norm);
  m->lr = LearningRate(tc, s);
  const float clip = ClipScale(m->grad_norm, tc.grad_clip);
  if (run.sdc != nullptr)  // it compares the parameters with ZeRO alone
    ATOLL_RETURN_IF_ERROR(
        run.sdc->BeforeUpdate(s, Zero(run) ? run.model->resident_params() : nullptr));
  if (run.optimizer->on_device())  // the parameters and gradients stay on the GPU
    run.optimizer->StepOnDevice(run.model->device_params(), run.model->device_grads(), m->lr, clip);
  else
    run.optimizer->Step(run.model->params(),
                        Zero(run) ? run.reducer->shard_grads() : run.model->grads(), m->lr, clip);
  if (run.sdc != nullptr)
    ATOLL_RETURN_IF_ERROR(
        run.sdc->OnUpdate(run.optimizer->update_squares(), run.optimizer->owned_numel()));
  return Zero(run) ? run.reducer->AllGatherInPlace(run.model->params()) : Status::Ok();
}

bool Finite(const StepMetrics& m) { return std::isfinite(m.loss) && std::isfinite(m.grad_norm); }

Status Diverged(const StepMetrics& m) {
  return Status::Internal(
      fmt::format("training diverged at step {}: loss {}, gradient norm {} (lower train.lr?)",
                  m.step, m.loss, m.grad_norm));
}

Status ReplayStep(Run& run, WorldStrategy& strategy, int64_t s, int64_t objective,
                  std::vector<double>& local_losses, const StepSnapshot& snapshot, StepMetrics* m,
                  bool* agreed, FaultyRank* faulty) {
  Communicator* site = run.mesh.world();
  const std::vector<ParamTensor> none;
  const std::vector<ParamTensor>& layout = Zero(run) ? none : run.model->layout();
  auto compute = [&](StepMetrics* out) {
    snapshot.Restore(run.model->params(), run.optimizer.get());
    if (run.sdc != nullptr) run.sdc->RestoreState();
    out->step = m->step;
    return ComputeStep(run, strategy, s, objective, local_losses, out);
  };
  // How many ranks say yes: of the site, or of the world when the sites replay together.
  auto count = [&](bool mine) -> StatusOr<int64_t> {
    ATOLL_ASSIGN_OR_RETURN(const int64_t n, CountOnSite(site, mine));
    return strategy.SumOverSites(n);
  };
  // Runs of one live set are compared: when a site is lost in the middle (sync), the micro-batches
  // each site computes change, and the latest run becomes the first of a new replay.
  const StepTrace first = *run.trace;
  const int64_t generation = run.generation;
  auto relive = [&] {
    return ReplayStep(run, strategy, s, objective, local_losses, snapshot, m, agreed, faulty);
  };
  StepMetrics kept;
  ATOLL_RETURN_IF_ERROR(compute(&kept));
  if (run.generation != generation) return relive();
  auto diff = FirstDifference(first, *run.trace, layout);
  ATOLL_ASSIGN_OR_RETURN(const int64_t differing, count(diff.has_value()));
  if (differing > 0) {
    const StepTrace replay = *run.trace;
    kept = StepMetrics();
    ATOLL_RETURN_IF_ERROR(compute(&kept));
    if (run.generation != generation) return relive();
    const bool first_bad = diff && !FirstDifference(replay, *run.trace, layout);
    const bool replay_bad = diff && !FirstDifference(first, *run.trace, layout);
    if (diff) diff->run = first_bad ? "first" : "replay";
    const bool three = diff && !first_bad && !replay_bad;
    ATOLL_ASSIGN_OR_RETURN(const int64_t split, count(three));
    if (split > 0) {  // the step is not trusted; m keeps the first run's events
      ATOLL_ASSIGN_OR_RETURN(const int64_t here, CountOnSite(site, three));
      *faulty = FaultyRank{.named = true, .here = here > 0, .unsure = false, .why = {}};
      faulty->why = fmt::format(
          "step {}: three runs of the step gave three different results on {} rank(s){}: a rank "
          "that keeps computing wrong results",
          s + 1, split,
          three
              ? fmt::format(", this one (rank {} of site {}) among them", run.mesh.rank(), run.site)
              : "");
      return Status::Ok();
    }
  }
  std::vector<std::string> peers;
  NamedFaulty named;
  Communicator* sites = strategy.PeerSites();
  // Only each replica's own micro-batches are recomputed by its peers: not with a lost site's.
  // The site's replicas may span several ranks each (tp, pp); the sites' leaders hold whole
  // replicas only with tp = pp = 1.
  const bool whole = run.mesh.tp() == 1 && run.mesh.pp() == 1;
  if (differing == 0 && (run.mesh.dp() > 1 || whole) && run.blocks == 1 && !run.cfg.world.balance) {
    if (run.mesh.dp() > 1) {
      ATOLL_ASSIGN_OR_RETURN(peers,
                             CheckOnPeers(run, s, snapshot, *run.mesh.dp_group(), false, &named));
    } else if (sites != nullptr) {
      ATOLL_ASSIGN_OR_RETURN(peers, CheckOnPeers(run, s, snapshot, *sites, true, &named));
    }
  }
  ATOLL_ASSIGN_OR_RETURN(std::vector<std::string> verdict,
                         ShareReplays(site, run.site, run.mesh.rank(), s, diff));
  if (!peers.empty()) verdict = std::move(peers);  // in place of "reproduced"
  ATOLL_ASSIGN_OR_RETURN(const int64_t faulty_ranks, count(named.any()));
  *faulty = FaultyRank{.named = faulty_ranks > 0, .here = false, .unsure = false, .why = {}};
  if (faulty->named) {
    ATOLL_ASSIGN_OR_RETURN(const int64_t unsure, count(named.unsure));
    const bool mine =
        std::find(named.sites.begin(), named.sites.end(), run.site) != named.sites.end();
    ATOLL_ASSIGN_OR_RETURN(const int64_t here, CountOnSite(site, mine));
    faulty->unsure = unsure > 0;
    faulty->here = here > 0;
  }
  // Where some site computed the step differently, the other sites' sums differ after the WAN
  // because they received it: not a payload of their own.
  ATOLL_ASSIGN_OR_RETURN(const int64_t computed, count(diff && diff->op != "wan"));
  if (computed > 0)
    verdict.erase(std::remove_if(verdict.begin(), verdict.end(),
                                 [](const std::string& e) {
                                   return e.find("\"op\":\"wan\"") != std::string::npos;
                                 }),
                  verdict.end());
  if (faulty->named) {  // the step is not trusted: its line with the verdicts
    std::vector<std::string> events = std::move(m->sdc);
    events.insert(events.end(), verdict.begin(), verdict.end());
    // Every named rank: with tp or pp > 1 a fault shows on several ranks of its replica.
    std::string named_events;
    for (const std::string& e : events)
      if (HasFaultyRank({e})) named_events += (named_events.empty() ? "" : "; ") + e;
    faulty->why = fmt::format(
        "step {}: a rank (or site) computes wrong results that its own replay repeats ({})", s + 1,
        named_events.empty() ? std::string("on another site") : named_events);
    kept.sdc = std::move(events);
    *m = std::move(kept);
    return Status::Ok();
  }
  if (!Finite(kept)) return Diverged(kept);  // two runs agree on it: not a transient fault
  if (run.sdc != nullptr) {
    ATOLL_RETURN_IF_ERROR(CheckStep(run, s, &kept));
    // Two runs agree on what the guard flags: a genuine spike, part of the run from now on.
    if (HasEvent(kept.sdc, "guard") && !HasEvent(kept.sdc, "checksum")) run.sdc->AcceptFlagged();
  }
  *agreed = !HasEvent(kept.sdc, "fingerprint");
  std::vector<std::string> events = std::move(m->sdc);
  events.insert(events.end(), verdict.begin(), verdict.end());
  events.insert(events.end(), kept.sdc.begin(), kept.sdc.end());
  kept.sdc = std::move(events);
  *m = std::move(kept);
  return Status::Ok();
}

}  // namespace atl
