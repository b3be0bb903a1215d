// The peer check of an audit replay (train/sdc/audit.h): a step whose replay matched its first
// run on every rank is either what the data makes it, or the work of a rank that computes the
// same wrong value every time (a defective unit, not a marginal one). Only another rank's
// execution tells the two apart.
//
// Each data-parallel replica of the site recomputes the forward and backward passes of its
// neighbours' micro-batches from the same pre-step state (train/run.h ReplicaPass): the next
// replica's, and with three or more replicas the previous one's too. The traces are compared
// bitwise: every traced op's fingerprint (StepTrace::ops) and each micro-batch's loss.
//   - All executions agree: the step is what the data makes it (a genuine spike). The replay's
//     "reproduced" event carries peers "agree".
//   - dp >= 3: each replica's micro-batches have three executions, its own and its two
//     neighbours'. The one outside the majority names the faulty rank (verdict "faulty_rank"),
//     whether it computed its own micro-batches or a neighbour's; `peer` is a rank that
//     disagreed with it. The event names the micro-batch, block and op where the faulty
//     execution first differed from the majority's.
//   - dp 2: two executions disagree and no third decides: the event names both ranks (rank and
//     peer, majority false).
// A rank named faulty stops the run (train/trainer.cc): its results cannot be trusted, and
// leaving it out needs a world that can shrink.
//
// The replicas: the site's (dp >= 2; with tp or pp > 1 a replica's ranks recompute together, and
// each rank's traces are compared over its dp group, the same (tp, pp) position of every
// replica: train/peer_check.cc), or with sync over sites of one rank each (tp = pp = 1), the
// sites (their leaders joined by the WAN), which then name a site.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"
#include "train/sdc/audit.h"

namespace atl {

// One execution of one replica's micro-batches, as comparable words: every traced op's
// fingerprint in order, then each micro-batch's loss, bit for bit.
std::vector<uint64_t> TraceWords(const StepTrace& t);

// A rank the executions name: event (verdict "faulty_rank": rank, peer, majority, where, what),
// whose micro-batches it computed (data_of), and the rank whose single execution of them the
// verdict rests on (recomputer; -1: none, the rank's own twice-run result is the odd one out),
// which must compute them again and repeat its result before the verdict stands.
struct PeerFinding {
  SdcEvent event;
  int data_of = -1;
  int recomputer = -1;
  size_t first_word = 0;  // where the faulty execution's words first differ (TraceWords)
};

// Replicas of several ranks (tp, pp > 1): where a finding's first difference lies in the step's
// data flow, to tell the rank a fault struck from the ranks of its replica it reached (through
// the tensor-parallel all-reduce or the pipeline's sends), whose first differences come later:
// by micro-batch (micro-batches do not mix within a step), then forward before backward, then
// the stage's place in that pass (forward: the first stage first; backward: the last), then the
// op's place in the rank's trace (the tp ranks of a stage trace the same ops in the same order).
// layout: the rank's own trace; stage, stages: its pipeline stage and their number.
std::array<int64_t, 4> FlowKey(const PeerFinding& f, const StepTrace& layout, int stage,
                               int stages);

// The verdict from every replica's three traces' words, by dp rank: own[x] its own execution,
// next[x] its execution of replica x+1's micro-batches, prev[x] of replica x-1's (dp >= 3).
// layout: this rank's own trace (the ops' kinds, blocks and micro-batches, the same on every
// replica); first_micro[x]: replica x's first micro-batch in the whole batch. Empty: all agree.
// sites: the executions are the sites' (one rank each, sync), by site: an event names a site
// (site, peer; rank 0, across "sites") instead of a rank of `site`.
std::vector<PeerFinding> PeerVerdict(const std::vector<std::vector<uint64_t>>& own,
                                     const std::vector<std::vector<uint64_t>>& next,
                                     const std::vector<std::vector<uint64_t>>& prev,
                                     const StepTrace& layout,
                                     const std::vector<int64_t>& first_micro, int site, int64_t s,
                                     bool sites = false);

// The step's peer-check events, as SdcEvent::ToJson writes them: each finding's, then, unless
// one names a faulty rank, a "reproduced" one with peers "agree". log: warn of each finding.
std::vector<std::string> PeerEvents(const std::vector<PeerFinding>& findings, int site, int64_t s,
                                    bool log);

// Collective over dp_group (the site's replicas, dp >= 2): all-gathers every replica's traces
// (own, next, prev: prev ignored at dp 2) and returns PeerVerdict, the same on every rank. The
// replicas must have started the step from the same parameters (state: their hash) on the same
// kernels (backend: a hash of the build and the BLAS kernel family); where they did not, their
// executions cannot be compared: *comparable is false and nothing is found.
// sites: dp_group is the sites' leaders (one rank a site, sync; PeerVerdict's sites).
StatusOr<std::vector<PeerFinding>> SharePeerCheck(Communicator& dp_group, const StepTrace& own,
                                                  const StepTrace& next, const StepTrace& prev,
                                                  const std::vector<int64_t>& first_micro, int site,
                                                  int64_t s, uint64_t state, uint64_t backend,
                                                  bool* comparable, bool sites = false);

// Whether one of the events is a replay's "faulty_rank" verdict.
bool HasFaultyRank(const std::vector<std::string>& events);

}  // namespace atl
