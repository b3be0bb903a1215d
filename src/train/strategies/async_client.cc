#include "train/strategies/async_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <utility>

#include "core/log.h"

namespace atl {

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
