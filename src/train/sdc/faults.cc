#include "train/sdc/faults.h"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "core/hash.h"
#include "core/log.h"
#include "core/rng.h"

namespace atl {

namespace {

struct KindName {
  FaultKind kind;
  const char* name;
};
constexpr KindName kKinds[] = {
    {FaultKind::kGemmForward, "gemm_fwd"},  {FaultKind::kGemmBackward, "gemm_bwd"},
    {FaultKind::kActivation, "activation"}, {FaultKind::kGrad, "grad"},
    {FaultKind::kParam, "param"},           {FaultKind::kMoment, "moment"},
    {FaultKind::kBadCore, "bad_core"},      {FaultKind::kWan, "wan"},
};

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t' || s.front() == '\n'))
    s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\n'))
    s.remove_suffix(1);
  return s;
}

template <class I>
bool ParseInt(std::string_view v, I* out) {
  const char* end = v.data() + v.size();
  auto [p, ec] = std::from_chars(v.data(), end, *out);
  return ec == std::errc() && p == end;
}

Status ParseOne(std::string_view text, FaultSpec* f) {
  auto err = [&](const std::string& why) {
    return Status::InvalidArgument(fmt::format("faults.inject: '{}': {}", text, why));
  };
  const size_t colon = text.find(':');
  const std::string_view kind = Trim(text.substr(0, colon));
  bool known = false;
  for (const auto& k : kKinds)
    if (kind == k.name) {
      f->kind = k.kind;
      known = true;
    }
  if (!known)
    return err(fmt::format(
        "unknown kind '{}' (gemm_fwd, gemm_bwd, activation, grad, param, moment, bad_core, wan)",
        kind));
  bool has_step = false, has_moment = false, has_stuck = false;
  std::string_view rest = colon == std::string_view::npos ? "" : text.substr(colon + 1);
  while (!Trim(rest).empty()) {
    const size_t comma = rest.find(',');
    const std::string_view kv = Trim(rest.substr(0, comma));
    rest = comma == std::string_view::npos ? "" : rest.substr(comma + 1);
    const size_t eq = kv.find('=');
    if (eq == std::string_view::npos) return err(fmt::format("'{}': expected key=value", kv));
    const std::string_view key = Trim(kv.substr(0, eq)), v = Trim(kv.substr(eq + 1));
    auto integer = [&](auto* out, int64_t lo, int64_t hi) -> Status {
      int64_t x = 0;
      if (!ParseInt(v, &x)) return err(fmt::format("{}: expected an integer, got '{}'", key, v));
      if (x < lo || x > hi)
        return err(fmt::format("{}: {} is out of range [{}, {}]", key, x, lo, hi));
      *out = static_cast<std::remove_pointer_t<decltype(out)>>(x);
      return Status::Ok();
    };
    constexpr int64_t kBig = int64_t(1) << 62;
    if (key == "step") {
      ATOLL_RETURN_IF_ERROR(integer(&f->step, 1, kBig));
      has_step = true;
    } else if (key == "site") {
      ATOLL_RETURN_IF_ERROR(integer(&f->site, 0, 1 << 20));
    } else if (key == "rank") {
      ATOLL_RETURN_IF_ERROR(integer(&f->rank, 0, 1 << 20));
    } else if (key == "layer") {
      ATOLL_RETURN_IF_ERROR(integer(&f->layer, 0, 1 << 20));
    } else if (key == "gemm") {
      ATOLL_RETURN_IF_ERROR(integer(&f->gemm, 0, 3));
    } else if (key == "micro") {
      ATOLL_RETURN_IF_ERROR(integer(&f->micro, 0, kBig));
    } else if (key == "elem") {
      ATOLL_RETURN_IF_ERROR(integer(&f->elem, 0, kBig));
    } else if (key == "bit") {
      ATOLL_RETURN_IF_ERROR(integer(&f->bit, 0, 31));
    } else if (key == "moment") {
      if (v != "m" && v != "v") return err(fmt::format("moment: expected m or v, got '{}'", v));
      f->moment = v[0];
      has_moment = true;
    } else if (key == "stuck") {
      int stuck = 0;
      ATOLL_RETURN_IF_ERROR(integer(&stuck, 0, 1));
      f->stuck = stuck == 1;
      has_stuck = true;
    } else if (key == "chunk") {
      ATOLL_RETURN_IF_ERROR(integer(&f->chunk, 0, kBig));
    } else if (key == "p") {
      std::string s(v);
      char* end = nullptr;
      const double p = std::strtod(s.c_str(), &end);
      if (s.empty() || end != s.c_str() + s.size() || !(p > 0 && p <= 1))
        return err(fmt::format("p: expected a probability in (0, 1], got '{}'", v));
      f->p = p;
    } else {
      return err(fmt::format(
          "unknown key '{}' (step, site, rank, layer, gemm, micro, elem, bit, moment, p, stuck, "
          "chunk)",
          key));
    }
  }
  const bool op = f->kind == FaultKind::kGemmForward || f->kind == FaultKind::kGemmBackward ||
                  f->kind == FaultKind::kActivation || f->kind == FaultKind::kBadCore;
  if (f->kind == FaultKind::kBadCore) {
    if (f->p == 0) return err("bad_core needs p (the probability per GEMM call)");
    if (!has_step) f->step = 1;
  } else {
    if (!has_step) return err("step is required (the 1-based step to corrupt)");
    if (f->p != 0) return err("p applies to bad_core only");
    if (has_stuck) return err("stuck applies to bad_core only");
  }
  if (!op && (f->layer >= 0 || f->gemm >= 0 || f->micro >= 0))
    return err("layer, gemm and micro apply to gemm_fwd, gemm_bwd, activation and bad_core");
  if (f->kind == FaultKind::kActivation && f->gemm >= 0)
    return err("gemm does not apply to activation");
  if (has_moment && f->kind != FaultKind::kMoment) return err("moment applies to moment only");
  if (f->chunk >= 0 && f->kind != FaultKind::kWan) return err("chunk applies to wan only");
  if (f->kind == FaultKind::kWan && f->rank != 0)
    return err("a wan fault strikes the site's leader: rank must be 0");
  return Status::Ok();
}

// Draw slots.
enum Slot : uint64_t { kLayer = 1, kGemm = 2, kBit = 3, kElem = 4, kCoin = 5, kChunk = 6 };

std::string Number(float x) {
  return std::isfinite(x) ? fmt::format("{:.9g}", x) : fmt::format("\"{}\"", x);
}

}  // namespace

const char* FaultKindName(FaultKind k) {
  for (const auto& n : kKinds)
    if (n.kind == k) return n.name;
  return "?";
}

StatusOr<std::vector<FaultSpec>> ParseFaults(std::string_view text) {
  std::vector<FaultSpec> out;
  while (!Trim(text).empty()) {
    const size_t semi = text.find(';');
    const std::string_view one = Trim(text.substr(0, semi));
    text = semi == std::string_view::npos ? "" : text.substr(semi + 1);
    if (one.empty()) continue;
    FaultSpec f;
    ATOLL_RETURN_IF_ERROR(ParseOne(one, &f));
    out.push_back(f);
  }
  return out;
}

float FlipBit(float* x, int bit) {
  const float old = *x;
  *x = std::bit_cast<float>(std::bit_cast<uint32_t>(old) ^ (uint32_t(1) << bit));
  return old;
}

std::string OpName(FaultKind k, int gemm) {
  return k == FaultKind::kActivation ? std::string("activation")
                                     : fmt::format("{} {}", FaultKindName(k), gemm);
}

std::string FormatSpec(const FaultSpec& f) {
  std::string s = fmt::format("{}:", FaultKindName(f.kind));
  if (f.kind != FaultKind::kBadCore || f.step != 1) s += fmt::format("step={},", f.step);
  s += fmt::format("site={},rank={}", f.site, f.rank);
  if (f.layer >= 0) s += fmt::format(",layer={}", f.layer);
  if (f.gemm >= 0) s += fmt::format(",gemm={}", f.gemm);
  if (f.micro >= 0) s += fmt::format(",micro={}", f.micro);
  if (f.elem >= 0) s += fmt::format(",elem={}", f.elem);
  if (f.bit >= 0) s += fmt::format(",bit={}", f.bit);
  if (f.kind == FaultKind::kMoment) s += fmt::format(",moment={}", f.moment);
  if (f.kind == FaultKind::kBadCore) s += fmt::format(",p={}", f.p);
  if (f.stuck) s += ",stuck=1";
  if (f.chunk >= 0) s += fmt::format(",chunk={}", f.chunk);
  return s;
}

FaultInjector::FaultInjector(const std::vector<FaultSpec>& specs, uint64_t seed, int site, int rank,
                             int layer_begin, int layer_end, std::string log_path)
    : seed_(seed),
      site_(site),
      rank_(rank),
      layer_begin_(layer_begin),
      layer_end_(layer_end),
      log_path_(std::move(log_path)) {
  for (size_t i = 0; i < specs.size(); ++i)
    if (specs[i].site == site && specs[i].rank == rank) {
      specs_.push_back(specs[i]);
      index_.push_back(i);
    }
  done_.assign(specs_.size(), 0);
}

FaultInjector::~FaultInjector() {
  if (log_ != nullptr) std::fclose(log_);
}

uint64_t FaultInjector::Draw(size_t i, uint64_t slot, uint64_t call, uint64_t n) const {
  const uint64_t key[5] = {uint64_t(index_[i]), uint64_t(site_), uint64_t(rank_), slot, call};
  return RandomBelow(seed_, uint64_t(step_), RngPurpose::kFault, Hash64(key, sizeof(key)), n);
}

double FaultInjector::Coin(size_t i, uint64_t call) const {
  const uint64_t key[5] = {uint64_t(index_[i]), uint64_t(site_), uint64_t(rank_), kCoin, call};
  const uint64_t bits =
      RandomBits(seed_, uint64_t(step_), RngPurpose::kFault, Hash64(key, sizeof(key)));
  return double(bits >> 11) * 0x1.0p-53;  // uniform in [0, 1), 53 bits
}

void FaultInjector::Fire(size_t i, uint64_t call, float* data, size_t n, int layer, int gemm,
                         int64_t chunk, int to_site) {
  const FaultSpec& f = specs_[i];
  if (n == 0) return;
  const size_t elem = f.elem >= 0 ? size_t(uint64_t(f.elem) % n) : size_t(Draw(i, kElem, call, n));
  const int bit = f.bit >= 0 ? f.bit : int(Draw(i, kBit, call, 32));
  const std::lock_guard<std::mutex> lk(mu_);
  FaultRecord r{f.kind, step_ + 1, site_, rank_, micro_, layer, gemm, int64_t(elem), bit, 0, 0};
  r.chunk = chunk;
  r.to_site = to_site;
  r.before = FlipBit(data + elem, bit);
  r.after = data[elem];
  fired_.push_back(r);
  LogWarning("fault injected: {} at step {} (site {}, rank {}{}{}{}), element {} bit {}: {} -> {}",
             FaultKindName(f.kind), r.step, site_, rank_,
             layer >= 0 ? fmt::format(", layer {}", layer) : "",
             gemm >= 0 ? fmt::format(", gemm {}", gemm) : "",
             chunk >= 0 ? fmt::format(", chunk {} to site {}", chunk, to_site) : "", elem, bit,
             r.before, r.after);
  if (log_path_.empty()) return;
  if (log_ == nullptr) {
    log_ = std::fopen(log_path_.c_str(), "a");
    if (log_ == nullptr) {
      LogWarning("cannot write {}: {}", log_path_, std::strerror(errno));
      log_path_.clear();
      return;
    }
  }
  const std::string line = fmt::format(
      "{{\"kind\":\"{}\",\"step\":{},\"site\":{},\"rank\":{},\"micro\":{},\"layer\":{},"
      "\"gemm\":{},\"elem\":{},\"bit\":{},\"before\":{},\"after\":{},"
      "\"bits_before\":\"{:08x}\",\"bits_after\":\"{:08x}\"{}}}\n",
      FaultKindName(f.kind), r.step, site_, rank_, r.micro, layer, gemm, r.elem, bit,
      Number(r.before), Number(r.after), std::bit_cast<uint32_t>(r.before),
      std::bit_cast<uint32_t>(r.after),
      chunk >= 0 ? fmt::format(",\"chunk\":{},\"to_site\":{}", chunk, to_site) : "");
  std::fputs(line.c_str(), log_);
  std::fflush(log_);
}

void FaultInjector::At(int64_t s, int64_t micro) {
  if (s != step_) op_calls_ = 0;
  step_ = s;
  micro_ = micro;
}

void FaultInjector::OnOp(FaultKind kind, int layer, int gemm, float* out, size_t n) {
  const int layers = std::max(1, layer_end_ - layer_begin_);
  const bool is_gemm = kind != FaultKind::kActivation;
  if (is_gemm) ++op_calls_;
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if ((f.layer >= 0 && f.layer != layer) || (f.gemm >= 0 && f.gemm != gemm) ||
        (f.micro >= 0 && f.micro != micro_))
      continue;
    if (f.kind == FaultKind::kBadCore) {
      if (!is_gemm || step_ + 1 < f.step) continue;
      // A stuck core's draws are keyed by what it computes, a flaky one's by its call count.
      uint64_t call = op_calls_;
      if (f.stuck) {
        const uint64_t what[4] = {uint64_t(micro_.load()), uint64_t(kind), uint64_t(layer),
                                  uint64_t(gemm)};
        call = Hash64(what, sizeof(what)) | (uint64_t(1) << 63);
      }
      if (Coin(i, call) < f.p) Fire(i, call, out, n, layer, gemm);
      continue;
    }
    if (f.kind != kind || done_[i] || step_ + 1 != f.step) continue;
    const int l = f.layer >= 0 ? f.layer : layer_begin_ + int(Draw(i, kLayer, 0, uint64_t(layers)));
    const int g = !is_gemm ? -1 : f.gemm >= 0 ? f.gemm : int(Draw(i, kGemm, 0, 4));
    if (layer != l || gemm != g) continue;
    done_[i] = true;
    Fire(i, 0, out, n, layer, gemm);
  }
}

void FaultInjector::OnBuffer(FaultKind kind, int64_t s, float* data, size_t n, char moment) {
  At(s, -1);
  for (size_t i = 0; i < specs_.size(); ++i) {
    const FaultSpec& f = specs_[i];
    if (f.kind != kind || done_[i] || s + 1 != f.step) continue;
    if (kind == FaultKind::kMoment && f.moment != moment) continue;
    if (n == 0) continue;  // nothing here (an empty ZeRO shard): reported by Unfired
    done_[i] = true;
    Fire(i, 0, data, n, -1, -1);
  }
}

void FaultInjector::AtWan(int64_t s) {
  const std::lock_guard<std::mutex> lk(mu_);
  wan_step_ = s;
  wan_chunks_ = 0;
}

void FaultInjector::OnWanPayload(int to_site, std::string* payload) {
  const size_t words = payload->size() / sizeof(float);
  if (words == 0) return;  // an empty chunk (a barrier's token) is not a payload
  std::vector<size_t> strike;
  int64_t chunk;
  {
    const std::lock_guard<std::mutex> lk(mu_);
    const int64_t s = wan_step_;
    chunk = wan_chunks_++;
    for (size_t i = 0; i < specs_.size(); ++i) {
      const FaultSpec& f = specs_[i];
      if (f.kind != FaultKind::kWan || done_[i] || s + 1 != f.step) continue;
      const uint64_t per_step = uint64_t(wan_chunks_per_step_);
      if (chunk != (f.chunk >= 0 ? f.chunk : int64_t(Draw(i, kChunk, 0, per_step)))) continue;
      done_[i] = 1;
      strike.push_back(i);
    }
  }
  for (size_t i : strike) {
    // The payload's bytes need not be aligned for a float: flip a copy.
    std::vector<float> w(words);
    std::memcpy(w.data(), payload->data(), words * sizeof(float));
    Fire(i, 0, w.data(), words, -1, -1, chunk, to_site);
    std::memcpy(payload->data(), w.data(), words * sizeof(float));
  }
}

bool FaultInjector::has_wan() const {
  return std::any_of(specs_.begin(), specs_.end(),
                     [](const FaultSpec& f) { return f.kind == FaultKind::kWan; });
}

std::vector<std::string> FaultInjector::Unfired(int64_t first_step) const {
  std::vector<std::string> out;
  for (size_t i = 0; i < specs_.size(); ++i)
    if (specs_[i].kind != FaultKind::kBadCore && !done_[i] && specs_[i].step > first_step)
      out.push_back(FormatSpec(specs_[i]));
  return out;
}

}  // namespace atl
