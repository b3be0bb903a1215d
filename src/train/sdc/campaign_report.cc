// The fault-injection campaign's tables (train/sdc/campaign.h).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <string>

#include "train/sdc/campaign.h"

namespace atl {

namespace {

// Counts over a group of outcomes (the fired ones).
struct Tally {
  int64_t n = 0, detected = 0, guard = 0, fingerprint = 0, checksum = 0, memory = 0, replay = 0;
  int64_t within1 = 0;
  int64_t localized = 0, recovered = 0, harmful = 0, harmful_misses = 0, stopped = 0;
  int64_t delay_sum = 0, delay_max = 0;

  void Add(const Outcome& o, double harm) {
    if (!o.fired) return;
    ++n;
    guard += o.guard;
    fingerprint += o.fingerprint;
    checksum += o.checksum;
    memory += o.memory;
    replay += o.replay;
    const bool is_harmful = o.harm > harm;
    harmful += is_harmful;
    // A detection counts even when the run then stopped (a flip found in its step that nothing
    // could repair, such as a moment in one process; recovered: no).
    if (o.detected()) {
      ++detected;
      within1 += o.delay <= 1;
      localized += o.localized;
      recovered += o.recovered;
      delay_sum += o.delay;
      delay_max = std::max(delay_max, o.delay);
    }
    if (!o.error.empty()) {  // stopped: counted apart; a stop no detector saw is not a miss
      ++stopped;
      return;
    }
    harmful_misses += !o.detected() && is_harmful;
  }
};

std::string Pct(int64_t part, int64_t whole) {
  if (whole == 0) return "-";
  return fmt::format("{:.0f}%", 100.0 * double(part) / double(whole));
}

std::string Frac(int64_t part, int64_t whole) {
  if (whole == 0) return "-";
  return fmt::format("{}/{} ({:.1f}%)", part, whole, 100.0 * double(part) / double(whole));
}

Tally TallyOf(const CampaignResult& r, const std::function<bool(const Outcome&)>& pick) {
  Tally t;
  for (const Outcome& o : r.outcomes)
    if (pick(o)) t.Add(o, r.harm);
  return t;
}

bool IsTransient(const Outcome& o) {
  return o.kind != FaultKind::kParam && o.kind != FaultKind::kMoment;
}

}  // namespace

std::string CampaignTables(const CampaignResult& r) {
  std::string out;
  int64_t fired = 0;
  FalseFindings before;  // in injected runs before their flips, not in the clean run (0)
  for (const Outcome& o : r.outcomes) {
    fired += o.fired;
    before += o.false_findings;
  }
  const FalseFindings& found = r.clean_run;
  out += fmt::format(
      "{} injections ({} fired), {}; clean validation loss {:.6f}; harmful: the final "
      "validation loss moved by more than {:.2g}%\n\n",
      r.outcomes.size(), fired, r.layout, r.clean_val_loss, r.harm * 100);

  out +=
      "| injection site | flips | detected | guard | fingerprint | checksum | memory | replay | "
      "within 1 step | localized | recovered bitwise | harmful | harmful misses | stopped |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  auto row = [&](const std::string& name, const Tally& t) {
    out += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
                       name, t.n, Pct(t.detected, t.n), Pct(t.guard, t.n), Pct(t.fingerprint, t.n),
                       Pct(t.checksum, t.n), Pct(t.memory, t.n), Pct(t.replay, t.n),
                       Pct(t.within1, t.n), Pct(t.localized, t.detected),
                       Pct(t.recovered, t.detected), t.harmful, t.harmful_misses, t.stopped);
  };
  std::vector<FaultKind> kinds;
  for (const Outcome& o : r.outcomes)
    if (std::find(kinds.begin(), kinds.end(), o.kind) == kinds.end()) kinds.push_back(o.kind);
  for (FaultKind k : kinds)
    row(FaultKindName(k), TallyOf(r, [k](const Outcome& o) { return o.kind == k; }));
  row("**all**", TallyOf(r, [](const Outcome&) { return true; }));
  out +=
      "\nDetected, localized and recovered are shares of the flips (localized, recovered: of "
      "the detected ones).\n\n";

  out +=
      "| bit | flips | detected | guard | fingerprint | checksum | memory | replay | harmful | "
      "harmful misses |\n"
      "|---|---|---|---|---|---|---|---|---|---|\n";
  for (int b = 31; b >= 0; --b) {
    const Tally t = TallyOf(r, [b](const Outcome& o) { return o.bit == b; });
    if (t.n == 0) continue;
    const char* part = b == 31 ? " (sign)" : b >= 23 ? " (exp)" : "";
    out += fmt::format("| {}{} | {} | {} | {} | {} | {} | {} | {} | {} | {} |\n", b, part, t.n,
                       Pct(t.detected, t.n), Pct(t.guard, t.n), Pct(t.fingerprint, t.n),
                       Pct(t.checksum, t.n), Pct(t.memory, t.n), Pct(t.replay, t.n), t.harmful,
                       t.harmful_misses);
  }

  const Tally high = TallyOf(r, [](const Outcome& o) { return o.bit >= 23; });
  const Tally all = TallyOf(r, [](const Outcome&) { return true; });
  // What fingerprints can see: parameters, and moments unless ZeRO shards them.
  auto comparable = [&r](const Outcome& o) {
    return o.kind == FaultKind::kParam || (o.kind == FaultKind::kMoment && !r.zero);
  };
  const Tally at_rest = TallyOf(r, comparable);
  const Tally transient = TallyOf(r, IsTransient);
  int64_t at_rest_fp = 0;
  for (const Outcome& o : r.outcomes) at_rest_fp += o.fired && comparable(o) && o.fingerprint;
  int64_t transient_detected_recovered = 0;
  for (const Outcome& o : r.outcomes)
    transient_detected_recovered += o.fired && IsTransient(o) && o.detected() && o.recovered;
  out += "\n| goal | measured |\n|---|---|\n";
  out += fmt::format(
      "| >= 99% of sign and exponent flips (bits 23..31) detected within 1 step | "
      "{} |\n",
      Frac(high.within1, high.n));
  out += fmt::format("| 0 harmful misses | {} of {} harmful flips missed |\n", all.harmful_misses,
                     all.harmful);
  out += fmt::format("| 100% of detections localized (step, rank, tensor or op) | {} |\n",
                     Frac(all.localized, all.detected));
  int64_t at_rest_memory = 0;
  for (const Outcome& o : r.outcomes) at_rest_memory += o.fired && !IsTransient(o) && o.memory;
  const Tally at_rest_all = TallyOf(r, [](const Outcome& o) { return !IsTransient(o); });
  out += fmt::format("| 100% of parameter and moment flips caught by the memory checks | {} |\n",
                     r.memory ? Frac(at_rest_memory, at_rest_all.n) : std::string("- (off)"));
  out += fmt::format("| 100% of parameter and moment flips caught by fingerprints | {} |\n",
                     r.dp <= 1  ? std::string("- (dp 1: no replicas)")
                     : r.memory ? fmt::format("- (the memory checks repaired them first; {})",
                                              Frac(at_rest_fp, at_rest.n))
                                : Frac(at_rest_fp, at_rest.n));
  out += fmt::format(
      "| 0 false positives in clean steps | {} steps with corruption found (fingerprint, checksum "
      "or a replay's transient verdict) in {} clean steps; {} steps with a guard alarm, {} of them "
      "replayed and reproduced (a genuine spike: the run went on unchanged); {} findings before "
      "a flip that the clean run lacks |\n",
      found.verdict_steps, r.clean_run_steps, found.alarm_steps, found.reproduced,
      before.alarm_steps + before.verdict_steps);
  out += fmt::format(
      "| transient flips detected -> parameters bitwise equal to the clean run | "
      "{} |\n",
      Frac(transient_detected_recovered, transient.detected));
  out += fmt::format("\nSteps to detection: mean {:.2f}, max {} (over {} detections).\n",
                     all.detected > 0 ? double(all.delay_sum) / double(all.detected) : 0.0,
                     all.delay_max, all.detected);
  return out;
}

std::string CampaignBitsCsv(const CampaignResult& r) {
  std::string out = "bit,n,any,guard,fingerprint,checksum,memory,replay,harmful_misses\n";
  for (int b = 0; b < 32; ++b) {
    const Tally t = TallyOf(r, [b](const Outcome& o) { return o.bit == b; });
    auto rate = [&](int64_t k) { return t.n > 0 ? double(k) / double(t.n) : 0.0; };
    out += fmt::format("{},{},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{:.4f},{}\n", b, t.n,
                       rate(t.detected), rate(t.guard), rate(t.fingerprint), rate(t.checksum),
                       rate(t.memory), rate(t.replay), t.harmful_misses);
  }
  return out;
}

}  // namespace atl
