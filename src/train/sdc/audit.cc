#include "train/sdc/audit.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <nlohmann/json.hpp>

#include "core/hash.h"
#include "core/log.h"
#include "train/sdc/fingerprint.h"

namespace atl {

void StepTrace::Clear() {
  micro_ = -1;
  first_micro_ = 0;
  ops_.clear();
  grads_.clear();
  losses_.clear();
  sent_ = received_ = 0;
}

void StepTrace::SetWan(const void* sums, size_t bytes, bool after) {
  const SdcTimer timer(&seconds_);
  (after ? received_ : sent_) = Hash64(sums, bytes) | 1;  // never 0 (none)
}

void StepTrace::SetLosses(const std::vector<double>& losses, int64_t first_micro) {
  losses_ = losses;
  first_micro_ = first_micro;
  micros_.clear();
}

void StepTrace::SetLosses(const std::vector<double>& losses, std::vector<int64_t> micros) {
  losses_ = losses;
  first_micro_ = micros.empty() ? 0 : micros.front();
  micros_ = std::move(micros);
}

void StepTrace::OnOp(FaultKind kind, int layer, int gemm, const float* out, size_t n) {
  const SdcTimer timer(&seconds_);
  ops_.push_back({micro_, kind, layer, gemm, Hash64(out, n * sizeof(float))});
}

void StepTrace::SetGrads(const std::vector<ParamTensor>& layout, const float* grads, size_t n) {
  const SdcTimer timer(&seconds_);
  if (layout.empty())
    grads_ = {Hash64(grads, n * sizeof(float))};
  else
    grads_ = TensorFingerprints(layout, grads);
}

std::optional<TraceDifference> FirstDifference(const StepTrace& first, const StepTrace& replay,
                                               const std::vector<ParamTensor>& layout) {
  const auto& a = first.ops();
  const auto& b = replay.ops();
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    if (a[i].hash == b[i].hash) continue;
    TraceDifference d;
    d.micro = a[i].micro;
    d.layer = a[i].layer;
    d.op = OpName(a[i].kind, a[i].gemm);
    return d;
  }
  if (a.size() != b.size()) {  // the same program ran: cannot happen unless memory is corrupt
    TraceDifference d;
    d.op = fmt::format("op count ({} then {})", a.size(), b.size());
    return d;
  }
  const auto& la = first.losses();
  const auto& lb = replay.losses();
  for (size_t j = 0; j < std::min(la.size(), lb.size()); ++j) {
    if (std::memcmp(&la[j], &lb[j], sizeof(double)) == 0) continue;
    TraceDifference d;
    d.micro = first.MicroAt(j);
    d.op = "loss";
    return d;
  }
  const auto& g = first.grads();
  const auto& h = replay.grads();
  for (size_t t = 0; t < std::min(g.size(), h.size()); ++t) {
    if (g[t] == h[t]) continue;
    TraceDifference d;
    // Across the WAN: what the site sent matched, the sum it got back did not.
    const bool wan =
        first.sent() != 0 && first.sent() == replay.sent() && first.received() != replay.received();
    d.op = wan ? "wan" : "grad";
    d.tensor = t < layout.size() ? ShortTensorName(layout[t].name) : "shard";
    return d;
  }
  return std::nullopt;
}

StatusOr<std::vector<std::string>> ShareReplays(Communicator* site_world, int site, int rank,
                                                int64_t s,
                                                const std::optional<TraceDifference>& mine) {
  std::vector<std::string> events;
  if (mine) {
    SdcEvent e;
    e.step = s + 1;
    e.site = site;
    e.rank = rank;
    e.detector = "replay";
    e.verdict = "transient";
    e.micro = mine->micro;
    e.layer = mine->layer;
    e.op = mine->op;
    e.what = mine->tensor;
    e.run = mine->run;
    LogWarning("silent data corruption found by replay: {}", e.ToString());
    events.push_back(e.ToJson());
  }
  if (site_world != nullptr && site_world->size() > 1) {
    ATOLL_ASSIGN_OR_RETURN(events, ShareEvents(*site_world, events));
  }
  if (events.empty()) {
    SdcEvent e;
    e.step = s + 1;
    e.site = site;
    e.detector = "replay";
    e.verdict = "reproduced";
    return std::vector<std::string>{e.ToJson()};
  }
  // A rank whose own ops differed is where the fault struck; ranks whose only difference is a
  // gradient got it through the reduction (unless no rank's ops differed: a fault after it).
  auto only_grad = [](const std::string& json) {
    return nlohmann::json::parse(json).value("op", "") == "grad";
  };
  if (!std::all_of(events.begin(), events.end(), only_grad))
    events.erase(std::remove_if(events.begin(), events.end(), only_grad), events.end());
  return events;
}

StatusOr<int64_t> CountOnSite(Communicator* site_world, bool mine) {
  int64_t n = mine ? 1 : 0;
  if (site_world != nullptr && site_world->size() > 1)
    ATOLL_RETURN_IF_ERROR(site_world->AllReduce(std::span<int64_t>(&n, 1)));
  return n;
}

namespace {
std::string DetectorOf(const std::string& json) {
  return nlohmann::json::parse(json).value("detector", "");
}
// A memory check's finding: whether it was repaired (nothing: another detector's event).
std::optional<bool> MemoryRepaired(const std::string& json) {
  const auto j = nlohmann::json::parse(json);
  if (j.value("detector", "") != "memory") return std::nullopt;
  return j.value("verdict", "") == "repaired";
}
}  // namespace

bool HasEvent(const std::vector<std::string>& events, std::string_view detector) {
  return std::any_of(events.begin(), events.end(),
                     [&](const std::string& e) { return DetectorOf(e) == detector; });
}

bool HasUnrepaired(const std::vector<std::string>& events) {
  return std::any_of(events.begin(), events.end(),
                     [](const std::string& e) { return MemoryRepaired(e) == false; });
}

bool OnlyRepaired(const std::vector<std::string>& events) {
  return std::all_of(events.begin(), events.end(),
                     [](const std::string& e) { return MemoryRepaired(e) == true; });
}

bool HasComputeAlarm(const std::vector<std::string>& events) {
  return HasEvent(events, "guard") || HasEvent(events, "checksum");
}

void StepSnapshot::Take(const float* params, size_t n, const AdamW& optimizer) {
  params_.assign(params, params + n);
  const size_t k = optimizer.size();
  m_.assign(optimizer.m(), optimizer.m() + k);
  v_.assign(optimizer.v(), optimizer.v() + k);
  t_ = optimizer.step_count();
}

void StepSnapshot::RestoreParams(float* params) const {
  std::copy(params_.begin(), params_.end(), params);
}

void StepSnapshot::Restore(float* params, AdamW* optimizer) const {
  std::copy(params_.begin(), params_.end(), params);
  std::copy(m_.begin(), m_.end(), optimizer->m());
  std::copy(v_.begin(), v_.end(), optimizer->v());
  optimizer->set_step_count(t_);
}

}  // namespace atl
