#include "train/sdc/peers.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <nlohmann/json.hpp>
#include <span>

#include "core/log.h"
#include "train/sdc/monitor.h"

namespace atl {

std::vector<uint64_t> TraceWords(const StepTrace& t) {
  std::vector<uint64_t> w;
  w.reserve(t.ops().size() + t.losses().size());
  for (const StepTrace::Op& op : t.ops()) w.push_back(op.hash);
  for (double l : t.losses()) w.push_back(std::bit_cast<uint64_t>(l));
  return w;
}

namespace {

// Where execution `bad` of replica x's micro-batches first differs from `good` (the word's index,
// TraceWords).
size_t NameDifference(const std::vector<uint64_t>& bad, const std::vector<uint64_t>& good,
                      const StepTrace& layout, int64_t first_micro, SdcEvent* e) {
  size_t i = 0;
  while (i < std::min(bad.size(), good.size()) && bad[i] == good[i]) ++i;
  const auto& ops = layout.ops();
  if (i < ops.size()) {
    const StepTrace::Op& op = ops[i];
    e->micro = op.micro - layout.first_micro() + first_micro;
    e->layer = op.layer;
    e->op = OpName(op.kind, op.gemm);
    return i;
  }
  e->micro = first_micro + int64_t(i - ops.size());
  e->op = "loss";
  return i;
}

}  // namespace

std::vector<PeerFinding> PeerVerdict(const std::vector<std::vector<uint64_t>>& own,
                                     const std::vector<std::vector<uint64_t>>& next,
                                     const std::vector<std::vector<uint64_t>>& prev,
                                     const StepTrace& layout,
                                     const std::vector<int64_t>& first_micro, int site, int64_t s,
                                     bool sites) {
  const int dp = int(own.size());
  std::vector<PeerFinding> found;
  auto faulty = [&](int rank, int peer, bool majority, int x, int recomputer,
                    const std::vector<uint64_t>& bad, const std::vector<uint64_t>& good) {
    for (const PeerFinding& f : found) {  // named already?
      const int named = sites ? f.event.site : f.event.rank;
      if (named == rank || (dp == 2 && named == peer)) return;
    }
    PeerFinding f;
    SdcEvent& e = f.event;
    e.step = s + 1;
    e.site = sites ? rank : site;
    e.rank = sites ? 0 : rank;
    e.peer = peer;
    e.has_majority = majority;
    e.across_sites = sites;
    e.detector = "replay";
    e.verdict = "faulty_rank";
    e.what = fmt::format("micro-batches of {} {}", sites ? "site" : "rank", x);
    f.first_word = NameDifference(bad, good, layout, first_micro[size_t(x)], &e);
    f.data_of = x;
    f.recomputer = recomputer;
    found.push_back(f);
  };
  // First the ranks that computed their own micro-batches wrong (named where they did), then
  // those that computed a neighbour's wrong.
  for (const bool own_pass : {true, false}) {
    for (int x = 0; x < dp; ++x) {
      const int a = (x + dp - 1) % dp, b = (x + 1) % dp;
      const auto& mine = own[size_t(x)];
      const auto& by_a = next[size_t(a)];  // replica a's execution of x's micro-batches
      if (dp == 2) {
        if (mine != by_a) faulty(x, a, false, x, a, mine, by_a);
        continue;
      }
      const auto& by_b = prev[size_t(b)];  // replica b's
      const bool agree_a = mine == by_a, agree_b = mine == by_b;
      if (agree_a && agree_b) continue;
      if (own_pass) {
        if (by_a == by_b) faulty(x, a, true, x, -1, mine, by_a);  // the other two agree
        continue;
      }
      if (agree_a)
        faulty(b, x, true, x, b, by_b, mine);
      else if (agree_b)
        faulty(a, x, true, x, a, by_a, mine);
      else if (by_a != by_b)
        faulty(x, a, false, x, -1, mine, by_a);  // three results: more than one rank is faulty
    }
  }
  return found;
}

std::vector<std::string> PeerEvents(const std::vector<PeerFinding>& findings, int site, int64_t s,
                                    bool log) {
  std::vector<std::string> events;
  bool named = false;
  for (const PeerFinding& f : findings) {
    if (log)
      LogWarning("silent data corruption found by another rank's execution: {}",
                 f.event.ToString());
    events.push_back(f.event.ToJson());
    named |= f.event.verdict == "faulty_rank";
  }
  if (!named) {
    SdcEvent e;
    e.step = s + 1;
    e.site = site;
    e.detector = "replay";
    e.verdict = "reproduced";
    e.peers_agree = true;
    events.push_back(e.ToJson());
  }
  return events;
}

StatusOr<std::vector<PeerFinding>> SharePeerCheck(Communicator& dp_group, const StepTrace& own,
                                                  const StepTrace& next, const StepTrace& prev,
                                                  const std::vector<int64_t>& first_micro, int site,
                                                  int64_t s, uint64_t state, uint64_t backend,
                                                  bool* comparable, bool sites) {
  const int dp = dp_group.size();
  const std::vector<uint64_t> mine = TraceWords(own);
  const std::vector<uint64_t> after = TraceWords(next);
  const std::vector<uint64_t> before = dp > 2 ? TraceWords(prev) : std::vector<uint64_t>();
  // First what makes the executions comparable, on every rank before anyone returns: the same
  // program (the same number of words, else memory is corrupt), the same starting parameters
  // and the same kernels. (64-bit words: int64 on the wire.)
  const uint64_t head[5] = {mine.size(), after.size(), dp > 2 ? before.size() : mine.size(), state,
                            backend};
  std::vector<uint64_t> heads(5 * size_t(dp));
  ATOLL_RETURN_IF_ERROR(dp_group.AllGather(head, heads.data(), 5, DType::kInt64));
  const size_t n = mine.size();
  *comparable = true;
  for (int r = 0; r < dp; ++r) {
    const uint64_t* h = heads.data() + 5 * size_t(r);
    if (h[0] != n || h[1] != n || h[2] != n)
      return Status::Internal(fmt::format(
          "step {}: the replicas traced different numbers of ops ({} here, {}/{}/{} on replica "
          "{}); cannot compare their executions",
          s + 1, n, h[0], h[1], h[2], r));
    *comparable &= h[3] == state && h[4] == backend;
  }
  if (!*comparable) return std::vector<PeerFinding>();
  std::vector<uint64_t> send;
  send.reserve(3 * n);
  send.insert(send.end(), mine.begin(), mine.end());
  send.insert(send.end(), after.begin(), after.end());
  if (dp > 2)
    send.insert(send.end(), before.begin(), before.end());
  else
    send.resize(3 * n, 0);
  std::vector<uint64_t> all(send.size() * size_t(dp));
  ATOLL_RETURN_IF_ERROR(dp_group.AllGather(send.data(), all.data(), send.size(), DType::kInt64));
  const size_t replicas = static_cast<size_t>(dp);
  std::vector<std::vector<uint64_t>> o(replicas), nx(replicas), pv(replicas);
  for (size_t r = 0; r < replicas; ++r) {
    const auto base = all.begin() + ptrdiff_t(r * 3 * n);
    o[r].assign(base, base + ptrdiff_t(n));
    nx[r].assign(base + ptrdiff_t(n), base + ptrdiff_t(2 * n));
    pv[r].assign(base + ptrdiff_t(2 * n), base + ptrdiff_t(3 * n));
  }
  return PeerVerdict(o, nx, pv, own, first_micro, site, s, sites);
}

std::array<int64_t, 4> FlowKey(const PeerFinding& f, const StepTrace& layout, int stage,
                               int stages) {
  const auto& ops = layout.ops();
  // The loss ends the forward pass (the last stage's, after its ops).
  const bool backward =
      f.first_word < ops.size() && ops[f.first_word].kind == FaultKind::kGemmBackward;
  return {f.event.micro, backward ? 1 : 0, backward ? stages - 1 - stage : stage,
          int64_t(f.first_word)};
}

bool HasFaultyRank(const std::vector<std::string>& events) {
  return std::any_of(events.begin(), events.end(), [](const std::string& e) {
    const auto j = nlohmann::json::parse(e);
    return j.value("detector", "") == "replay" && j.value("verdict", "") == "faulty_rank";
  });
}

}  // namespace atl
