#include "train/strategies/async_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

#include "core/hash.h"
#include "core/log.h"
#include "train/strategies/state_bytes.h"

namespace atl {

namespace {
constexpr char kAsyncStateMagic[4] = {'A', 'T', 'L', 'A'};
constexpr uint32_t kAsyncStateVersion = 1;
constexpr size_t kAsyncStateHeader = 4 + 4 + 8 + 4 * 8;
}  // namespace

using state_bytes::Get;
using state_bytes::Put;

std::string EncodeAsyncSiteState(const AsyncSiteState& st) {
  const size_t n = st.residual.size();
  std::string out;
  out.reserve(kAsyncStateHeader + 3 * n * sizeof(float) + 8);
  out.append(kAsyncStateMagic, 4);
  Put<uint32_t>(&out, kAsyncStateVersion);
  Put<uint64_t>(&out, n);
  for (int64_t v : {st.completed, st.pushes, st.refused, st.adam_steps}) Put<int64_t>(&out, v);
  for (const auto* v : {&st.residual, &st.adam_m, &st.adam_v})
    out.append(reinterpret_cast<const char*>(v->data()), n * sizeof(float));
  Put<uint64_t>(&out, Hash64(out.data(), out.size()));
  return out;
}

StatusOr<AsyncSiteState> DecodeAsyncSiteState(std::string_view b, size_t n) {
  if (b.size() < kAsyncStateHeader + 8 || std::memcmp(b.data(), kAsyncStateMagic, 4) != 0)
    return Status::Corruption(
        fmt::format("async site state: {} bytes without the ATLA header", b.size()));
  if (const uint32_t version = Get<uint32_t>(b, 4); version != kAsyncStateVersion)
    return Status::Corruption(fmt::format("async site state: version {} (this build reads {})",
                                          version, kAsyncStateVersion));
  const uint64_t count = Get<uint64_t>(b, 8);
  if (count != n)
    return Status::InvalidArgument(fmt::format(
        "async site state: {} parameters, this model has {} (another model config?)", count, n));
  const size_t want = kAsyncStateHeader + 3 * n * sizeof(float) + 8;
  if (b.size() != want)
    return Status::Corruption(
        fmt::format("async site state: {} bytes, {} expected (cut short?)", b.size(), want));
  if (Hash64(b.data(), want - 8) != Get<uint64_t>(b, want - 8))
    return Status::Corruption("async site state: its checksum does not match (damaged)");
  AsyncSiteState st;
  st.completed = Get<int64_t>(b, 16);
  st.pushes = Get<int64_t>(b, 24);
  st.refused = Get<int64_t>(b, 32);
  st.adam_steps = Get<int64_t>(b, 40);
  size_t at = kAsyncStateHeader;
  for (auto* v : {&st.residual, &st.adam_m, &st.adam_v}) {
    v->resize(n);
    std::memcpy(v->data(), b.data() + at, n * sizeof(float));
    at += n * sizeof(float);
  }
  return st;
}

AsyncClient::AsyncClient(const Options& options, ParameterServer* ps, size_t n)
    : options_(options), ps_(ps), n_(n), base_(n), update_(n), residual_(n, 0.0f) {}

Status AsyncClient::Start(float* params, int64_t from) {
  StatusOr<int64_t> last = ps_->Init(std::span<const float>(params, n_), options_.max_staleness);
  if (!last.ok()) return last.status().WithContext("the parameter server's Init");
  start_step_ = last_push_step_ = std::max(*last, from);
  return Pull(params);
}

Status AsyncClient::Push(int64_t completed, const float* params) {
  for (size_t i = 0; i < n_; ++i) update_[i] = params[i] - base_[i];
  PsUpdate u;
  u.site = options_.site;
  u.base_version = version_;
  u.first_step = last_push_step_ + 1;
  u.last_step = completed;
  u.weight = 1.0f / float(options_.sites);
  saved_residual_ = residual_;  // a refused update gives back what it took from the residual
  Encode(options_.codec, update_, &u.encoded, residual_);
  bytes_sent_ += u.encoded.size();
  StatusOr<PsPushResult> pushed = ps_->Push(u);
  if (!pushed.ok()) residual_.swap(saved_residual_);  // not applied: nothing consumed
  ATOLL_ASSIGN_OR_RETURN(const PsPushResult r, std::move(pushed));
  ++pushes_;
  if (!r.accepted) {
    residual_.swap(saved_residual_);
    ++refused_;
    LogWarning(
        "site {}: the parameter server refused the update of steps {}..{} (base version {}, "
        "now {}: more than world.async.max_staleness = {} behind); pulling and going on",
        options_.site, u.first_step, u.last_step, u.base_version, r.current_version,
        options_.max_staleness);
  }
  last_push_step_ = completed;
  return Status::Ok();
}

Status AsyncClient::Pull(float* params) {
  ATOLL_ASSIGN_OR_RETURN(version_, ps_->Pull(std::span<float>(params, n_)));
  bytes_received_ += n_ * sizeof(float);
  std::copy(params, params + n_, base_.begin());
  return Status::Ok();
}

StatusOr<bool> AsyncClient::AfterStep(int64_t completed, float* params, const Barrier& barrier) {
  last_wait_s_ = 0;
  if (!PullsAt(completed)) return false;
  const double t0 = NowSeconds();
  ATOLL_RETURN_IF_ERROR(Push(completed, params));
  // A consistent cut (a checkpoint every site can resume from): every live site's push is in
  // before any pulls, and every pull is done before any site pushes again.
  if (barrier) ATOLL_RETURN_IF_ERROR(barrier(0));
  ATOLL_RETURN_IF_ERROR(Pull(params));
  if (barrier) ATOLL_RETURN_IF_ERROR(barrier(1));
  last_wait_s_ = NowSeconds() - t0;
  return true;
}

Status AsyncClient::Finish(int64_t completed, float* params,
                           const std::function<Status()>& barrier) {
  last_wait_s_ = 0;
  const double t0 = NowSeconds();
  // The steps since the last push.
  if (completed > last_push_step_) ATOLL_RETURN_IF_ERROR(Push(completed, params));
  if (barrier) ATOLL_RETURN_IF_ERROR(barrier());
  ATOLL_RETURN_IF_ERROR(Pull(params));
  last_wait_s_ = NowSeconds() - t0;
  return Status::Ok();
}

void AsyncClient::Restore(const AsyncSiteState& st) {
  residual_ = st.residual;
  pushes_ = st.pushes;
  refused_ = st.refused;
}

}  // namespace atl
