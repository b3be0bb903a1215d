#include "train/sdc/monitor.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <span>

#include "core/log.h"
#include "train/sdc/checksum.h"
#include "train/sdc/fingerprint.h"

namespace atl {

std::string SdcEvent::ToJson() const {
  nlohmann::ordered_json j;  // the step is the metrics line's
  // JSON has no inf or nan: a non-finite value is written as its text.
  const nlohmann::ordered_json value_json = std::isfinite(value)
                                                ? nlohmann::ordered_json(value)
                                                : nlohmann::ordered_json(fmt::format("{}", value));
  j["site"] = site;
  j["rank"] = rank;
  j["detector"] = detector;
  j["what"] = what;
  if (detector == "guard") {
    j["value"] = value_json;
    j["median"] = median;
    j["deviations"] = deviations;
  } else if (detector == "checksum") {
    j["micro"] = micro;
    j["layer"] = layer;
    j["op"] = op;
    j["count"] = count;
    j["value"] = value_json;
    j["expected"] = median;
    j["deviations"] = deviations;
  } else if (detector == "memory") {
    j["verdict"] = verdict;
    if (source >= 0) j["source"] = source;
    if (source_site >= 0) j["source_site"] = source_site;
  } else if (detector == "replay") {
    j["verdict"] = verdict;
    if (micro >= 0) j["micro"] = micro;
    if (layer >= 0) j["layer"] = layer;
    if (!op.empty()) j["op"] = op;
    if (!run.empty()) j["run"] = run;
    if (peer >= 0) {
      j["peer"] = peer;
      j["majority"] = has_majority;
    }
    if (peers_agree) j["peers"] = "agree";
    if (across_sites) j["across"] = "sites";  // sites recomputed each other's: site names one
  } else {
    j["majority"] = has_majority;
    if (across_sites) j["across"] = "sites";
  }
  return j.dump();
}

std::string SdcEvent::ToString() const {
  const std::string where =
      rank >= 0 ? fmt::format("site {} rank {}", site, rank) : fmt::format("site {}", site);
  if (detector == "guard") {
    if (!std::isfinite(value))
      return fmt::format("step {} ({}): guard: {} = {}, not finite", step, where, what, value);
    return fmt::format(
        "step {} ({}): guard: {} = {:.6g}, {:.0f} robust deviations from the "
        "median {:.6g}",
        step, where, what, value, deviations, median);
  }
  if (detector == "memory")
    return fmt::format(
        "step {} ({}): memory: {} changed at rest since the last update; {}", step, where, what,
        source >= 0        ? fmt::format("repaired from rank {}", source)
        : source_site >= 0 ? fmt::format("repaired from site {}", source_site)
                           : std::string("not repaired (no clean replica holds it)"));
  if (detector == "checksum" && op == "grad")
    return fmt::format(
        "step {} ({}): checksum: the reduced gradient of {}: segment sum {:.9g}, expected {:.9g} "
        "({:.3g} times the rounding bound); {} check(s) of the step failed",
        step, where, what, value, median, deviations, count);
  if (detector == "checksum")
    return fmt::format(
        "step {} ({}): checksum: {} of micro-batch {} in block {}: column sum {:.9g}, expected "
        "{:.9g} ({:.3g} times the rounding bound); {} check(s) of the step failed",
        step, where, op, micro, layer, value, median, deviations, count);
  if (detector == "replay") {
    if (verdict == "reproduced")
      return fmt::format(
          "step {} ({}): replay: every rank's replay matched its first run bitwise{}", step, where,
          peers_agree ? ", and other ranks' executions of its micro-batches too" : "");
    std::string at = op;
    if (micro >= 0) at += fmt::format(" of micro-batch {}", micro);
    if (layer >= 0) at += fmt::format(" in block {}", layer);
    if (verdict == "faulty_rank")
      return fmt::format(
          "step {} ({}): replay: {} computes wrong results: its own replay repeated them, "
          "another {}'s execution differs; first difference: {} ({})",
          step, where,
          across_sites ? (has_majority ? fmt::format("site {}", site)
                                       : fmt::format("site {} or site {} (no third execution "
                                                     "decides)",
                                                     site, peer))
          : has_majority
              ? fmt::format("rank {}", rank)
              : fmt::format("rank {} or rank {} (no third execution decides)", rank, peer),
          across_sites ? "site" : "rank", at, what);
    if (!what.empty()) at += fmt::format(" ({})", what);
    if (verdict == "reached")
      return fmt::format(
          "step {} ({}): replay: rank {}'s execution differs only because a faulty rank of its "
          "replica passed it wrong values; first difference: {}",
          step, where, rank, at);
    return fmt::format(
        "step {} ({}): replay: a transient fault in the {} run; first difference: {}", step, where,
        run, at);
  }
  if (across_sites)
    return fmt::format("step {} ({}): fingerprint: {} differs from {}", step, where, what,
                       has_majority ? "the other sites'" : "the other site's (no majority)");
  return fmt::format("step {} ({}): fingerprint: {} differs from {}", step, where, what,
                     has_majority ? "the other replicas'" : "the other replica's (no majority)");
}

SdcMonitor::SdcMonitor(SdcOptions o, std::vector<ParamTensor> layout, size_t moments_size, int site,
                       int rank, Communicator* dp_group, std::vector<int> replica_ranks, bool zero)
    : o_(o),
      layout_(std::move(layout)),
      site_(site),
      rank_(rank),
      dp_(dp_group),
      zero_(zero),
      replica_ranks_(std::move(replica_ranks)),
      guard_(o.guard_options),
      seal_(layout_, moments_size, zero, o.params_on, o.moments_on) {}

void SdcMonitor::AddMismatches(int64_t s, const char* what,
                               const std::vector<FingerprintMismatch>& mismatches,
                               const std::vector<int>* sites, std::vector<SdcEvent>* out) const {
  const bool across_sites = sites != nullptr;
  for (const FingerprintMismatch& mm : mismatches) {
    SdcEvent e;
    e.step = s + 1;
    // A replica is named by its rank in this site; a site by its index, at this rank.
    e.site = !across_sites                        ? site_
             : size_t(mm.replica) < sites->size() ? (*sites)[size_t(mm.replica)]
                                                  : mm.replica;
    e.rank = across_sites                                 ? rank_
             : size_t(mm.replica) < replica_ranks_.size() ? replica_ranks_[size_t(mm.replica)]
                                                          : mm.replica;
    e.detector = "fingerprint";
    e.what = fmt::format("{}:{}", what, ShortTensorName(layout_[mm.tensor].name));
    e.has_majority = mm.has_majority;
    e.across_sites = across_sites;
    out->push_back(e);
  }
}

Status SdcMonitor::Compare(int64_t s, const Hashed& buffer, std::vector<SdcEvent>* out) {
  ATOLL_ASSIGN_OR_RETURN(auto mismatches, CompareFingerprints(*dp_, buffer.second));
  AddMismatches(s, buffer.first, mismatches, nullptr, out);
  return Status::Ok();
}

Status SdcMonitor::CompareSites(int64_t s, const std::vector<Hashed>& buffers,
                                std::vector<SdcEvent>* out) {
  std::vector<uint64_t> mine;
  for (const Hashed& b : buffers) mine.insert(mine.end(), b.second.begin(), b.second.end());
  ATOLL_ASSIGN_OR_RETURN(const SiteHashes gathered, sites_(mine));
  const std::vector<std::vector<uint64_t>>& all = gathered.hashes;
  const size_t n = layout_.size();
  for (size_t p = 0; p < buffers.size() && !all.empty(); ++p) {
    std::vector<std::vector<uint64_t>> section;
    for (const std::vector<uint64_t>& site : all)
      section.emplace_back(site.begin() + std::ptrdiff_t(p * n),
                           site.begin() + std::ptrdiff_t(p * n + n));
    AddMismatches(s, buffers[p].first, FindMismatches(section), &gathered.sites, out);
  }
  return Status::Ok();
}

void SdcMonitor::OnActivation(int layer, const float* out, size_t n, bool on_device) {
  if (!o_.guard) return;
  const SdcTimer timer(&cost_.guard);
  if (on_device) {
    if (act_max_gpu_.size() <= size_t(layer)) {
      activation_maxima();  // what the smaller buffer holds (the first step only)
      act_max_gpu_.Allocate(Device::kCuda, std::max(size_t(layer) + 1, 2 * act_max_gpu_.size()));
    }
    DeviceMaxAbsInto(act_max_gpu_.data() + layer, out, n);  // infinity when one is not finite
    act_max_on_gpu_ = true;
    return;
  }
  if (act_max_.size() <= size_t(layer)) act_max_.resize(size_t(layer) + 1, 0.0);
  float mx = 0;
  bool finite = true;
  for (size_t i = 0; i < n; ++i) {
    const float a = std::abs(out[i]);
    finite &= std::isfinite(a);
    mx = std::max(mx, a);
  }
  act_max_[size_t(layer)] = finite ? std::max(act_max_[size_t(layer)], double(mx))
                                   : std::numeric_limits<double>::infinity();
}

const std::vector<double>& SdcMonitor::activation_maxima() {
  if (!act_max_on_gpu_) return act_max_;
  std::vector<float> gpu(act_max_gpu_.size());
  CopyOut(Device::kCuda, gpu.data(), act_max_gpu_.data(), gpu.size());
  act_max_gpu_.SetZero();
  act_max_on_gpu_ = false;
  if (act_max_.size() < gpu.size()) act_max_.resize(gpu.size(), 0.0);
  for (size_t l = 0; l < gpu.size(); ++l) act_max_[l] = std::max(act_max_[l], double(gpu[l]));
  return act_max_;
}

void SdcMonitor::ClearActivationMaxima() {
  std::fill(act_max_.begin(), act_max_.end(), 0.0);
  if (act_max_on_gpu_) act_max_gpu_.SetZero();
  act_max_on_gpu_ = false;
}

void SdcMonitor::OnGemm(FaultKind kind, int layer, int gemm, const float* c, const float* a,
                        const float* w, const float* bias, int rows, int inner, int cols) {
  if (!o_.checksums || a == nullptr || w == nullptr) return;
  const SdcTimer timer(&cost_.checksums);
  // mlp.c_proj's product is added to the residual stream next: keep its column sums.
  const bool keep = o_.residual && kind == FaultKind::kGemmForward && gemm == 3;
  const ChecksumMismatch mm =
      CheckGemmColumns(c, a, w, bias, rows, inner, cols, kind == FaultKind::kGemmBackward,
                       keep ? &proj_sums_ : nullptr);
  if (keep) proj_layer_ = layer;
  Mismatch(mm, layer, OpName(kind, gemm));
}

void SdcMonitor::OnResidual(int layer, const float* out, const float* x, int rows, int cols) {
  if (!o_.residual || x == nullptr || proj_layer_ != layer || proj_sums_.size() != size_t(cols))
    return;
  const SdcTimer timer(&cost_.checksums);
  proj_layer_ = -1;
  Mismatch(CheckResidualColumns(out, x, proj_sums_, rows, cols), layer,
           OpName(FaultKind::kActivation, -1));
}

void SdcMonitor::Mismatch(const ChecksumMismatch& mm, int layer, std::string op) {
  if (mm.column < 0) return;
  Failed(micro_, layer, std::move(op), fmt::format("column {}", mm.column), mm.got, mm.expected,
         mm.bound, 1);
}

void SdcMonitor::Failed(int64_t micro, int layer, std::string op, std::string what, double got,
                        double expected, double bound, int64_t count) {
  if ((checksum_.count += count) > count) return;  // the step's first failure names the place
  checksum_.site = site_;
  checksum_.rank = rank_;
  checksum_.detector = "checksum";
  checksum_.micro = micro;
  checksum_.layer = layer;
  checksum_.op = std::move(op);
  checksum_.what = std::move(what);
  checksum_.value = got;
  checksum_.median = expected;
  checksum_.deviations =
      bound > 0 ? std::abs(got - expected) / bound : std::numeric_limits<double>::infinity();
}

void SdcMonitor::OnReducedGradient(const GradChecksum::Mismatch& mm, double seconds) {
  cost_.checksums += seconds - grad_seconds_;
  grad_seconds_ = seconds;
  if (mm.count == 0) return;
  const ParamTensor* t = TensorAt(layout_, mm.begin);
  Failed(-1, t != nullptr ? t->layer : -1, "grad",
         t != nullptr ? ShortTensorName(t->name) : "shard", mm.got, mm.expected, mm.bound,
         mm.count);
}

Status SdcMonitor::CheckAtRest(const float* params, const float* m, const float* v,
                               const HostStateFn& state) {
  if (!o_.memory) return Status::Ok();
  const SdcTimer timer(&cost_.memory);
  const std::vector<std::string> changed = seal_.Verify(params, m, v);
  // Parameters are replicated; moments too, unless ZeRO shards them.
  auto replicated = [&](const std::string& what) {
    return !zero_ || what.rfind("params:", 0) == 0;
  };
  int source = -1;
  if (dp_ != nullptr && dp_->size() > 1) {
    const bool repairable = std::any_of(changed.begin(), changed.end(), replicated);
    ATOLL_ASSIGN_OR_RETURN(const int root, RepairFromReplica(*dp_, repairable, state, !zero_));
    if (root >= 0 && repairable)
      source = size_t(root) < replica_ranks_.size() ? replica_ranks_[size_t(root)] : root;
  }
  // What no replica could repair, another site may (sync: the sites hold one model).
  int source_site = -1;
  if (sites_repair_ != nullptr) {
    const bool left = std::any_of(changed.begin(), changed.end(), [&](const std::string& what) {
      return source < 0 || !replicated(what);
    });
    ATOLL_ASSIGN_OR_RETURN(const int root, sites_repair_(left, state));
    if (left) source_site = root;
  }
  for (const std::string& what : changed) {
    SdcEvent e;
    e.site = site_;
    e.rank = rank_;
    e.detector = "memory";
    e.what = what;
    const bool by_replica = source >= 0 && replicated(what);
    e.verdict = by_replica || source_site >= 0 ? "repaired" : "not repaired";
    e.source = by_replica ? source : -1;
    e.source_site = by_replica ? -1 : source_site;
    LogWarning(
        "silent data corruption: rank {} of site {}: {} changed at rest since the last "
        "step; {}",
        rank_, site_, what,
        by_replica         ? fmt::format("repaired from rank {}", source)
        : source_site >= 0 ? fmt::format("repaired from site {}", source_site)
                           : std::string("not repaired"));
    at_rest_.push_back(e);
  }
  return Status::Ok();
}

Status SdcMonitor::BeforeUpdate(int64_t s, const float* params) {
  update_sq_.clear();
  pending_.clear();
  if (zero_ && o_.fingerprints && replicas()) {
    const SdcTimer timer(&cost_.fingerprints);
    return Compare(s, {"params", TensorFingerprints(layout_, params, o_.params_on)}, &pending_);
  }
  return Status::Ok();
}

Status SdcMonitor::OnUpdate(const std::vector<double>& squares, const std::vector<size_t>& numel) {
  if (!o_.guard) return Status::Ok();
  const SdcTimer timer(&cost_.guard);
  update_sq_ = squares;
  update_numel_ = numel;
  if (!zero_ || !replicas()) return Status::Ok();
  std::vector<double> both = squares;
  for (size_t k : numel) both.push_back(double(k));
  ATOLL_RETURN_IF_ERROR(dp_->AllReduce(std::span<double>(both)));
  for (size_t t = 0; t < squares.size(); ++t) {
    update_sq_[t] = both[t];
    update_numel_[t] = size_t(both[squares.size() + t]);
  }
  return Status::Ok();
}

StatusOr<std::vector<SdcEvent>> SdcMonitor::AfterStep(int64_t s, double loss, double grad_norm,
                                                      double lr, const float* params,
                                                      const float* m, const float* v) {
  std::vector<SdcEvent> out;
  for (SdcEvent& e : at_rest_) {
    e.step = s + 1;
    out.push_back(std::move(e));
  }
  at_rest_.clear();
  if (o_.guard) {
    const SdcTimer timer(&cost_.guard);
    std::vector<StepGuard::Signal> signals = {{"loss", loss}, {"grad_norm", grad_norm}};
    if (!update_sq_.empty() && lr > 0) {  // lr 0 (min_lr = 0 at the end) moves nothing
      for (size_t t = 0; t < layout_.size() && t < update_sq_.size(); ++t)
        if (update_numel_[t] > 0)
          signals.push_back({"update_rms." + ShortTensorName(layout_[t].name),
                             std::sqrt(update_sq_[t] / double(update_numel_[t])) / lr});
    }
    const std::vector<double>& act_max = activation_maxima();
    for (size_t l = 0; l < act_max.size(); ++l)
      if (act_max[l] > 0) signals.push_back({fmt::format("act_max.{}", l), act_max[l]});
    flagged_.clear();
    for (const StepGuard::Outlier& o : guard_.Check(signals)) {
      flagged_.push_back({o.name, o.value});
      SdcEvent e;
      e.step = s + 1;
      e.site = site_;
      e.rank = (o.name == "loss" || o.name == "grad_norm") ? -1 : rank_;
      e.detector = "guard";
      e.what = o.name;
      e.value = o.value;
      e.median = o.median;
      e.deviations = o.deviations;
      out.push_back(e);
    }
    ClearActivationMaxima();
  }
  if (checksum_.count > 0) {
    checksum_.step = s + 1;
    out.push_back(checksum_);
    checksum_ = {};
  }
  const bool moments =
      m != nullptr && v != nullptr && o_.moments_every > 0 && (s + 1) % o_.moments_every == 0;
  if (o_.fingerprints && replicas() && zero_) {  // compared before the update
    out.insert(out.end(), pending_.begin(), pending_.end());
    pending_.clear();
  }
  // Each buffer is hashed once, for the replicas and the sites alike.
  const bool by_replicas = o_.fingerprints && replicas() && !zero_;
  const bool by_sites = o_.fingerprints && sites_ != nullptr;
  if (by_replicas || by_sites) {
    const SdcTimer timer(&cost_.fingerprints);
    std::vector<Hashed> buffers;
    buffers.emplace_back("params", TensorFingerprints(layout_, params, o_.params_on));
    if (moments && !zero_) {
      buffers.emplace_back("moment_m", TensorFingerprints(layout_, m, o_.moments_on));
      buffers.emplace_back("moment_v", TensorFingerprints(layout_, v, o_.moments_on));
    }
    if (by_replicas)
      for (const Hashed& b : buffers) ATOLL_RETURN_IF_ERROR(Compare(s, b, &out));
    if (by_sites) ATOLL_RETURN_IF_ERROR(CompareSites(s, buffers, &out));
  }
  return out;
}

StatusOr<std::vector<std::string>> ShareEvents(Communicator& group,
                                               const std::vector<std::string>& mine) {
  std::string blob;
  for (const std::string& e : mine) blob += e + "\n";
  const size_t ranks = size_t(group.size());
  int64_t len = int64_t(blob.size());
  std::vector<int64_t> lens(ranks);
  ATOLL_RETURN_IF_ERROR(group.AllGather(&len, lens.data(), 1, DType::kInt64));
  const size_t most = size_t(*std::max_element(lens.begin(), lens.end()));
  std::vector<std::string> out;
  if (most == 0) return out;
  blob.resize(most, '\0');
  std::string all(most * ranks, '\0');
  ATOLL_RETURN_IF_ERROR(group.AllGather(blob.data(), all.data(), most, DType::kByte));
  for (size_t r = 0; r < ranks; ++r) {
    const std::string part = all.substr(r * most, size_t(lens[r]));
    size_t begin = 0;
    for (size_t end; (end = part.find('\n', begin)) != std::string::npos; begin = end + 1) {
      std::string e = part.substr(begin, end - begin);
      if (std::find(out.begin(), out.end(), e) == out.end()) out.push_back(std::move(e));
    }
  }
  return out;
}

}  // namespace atl
