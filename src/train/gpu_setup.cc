#include "train/gpu_setup.h"

#include <fmt/format.h>

#include <algorithm>
#include <exception>
#include <iterator>
#include <span>
#include <string>
#include <vector>

#include "core/log.h"
#include "kernels/attention_blocks.h"
#include "model/backend.h"

namespace atl {
namespace {

// train.attention_rows = auto: the times of this rank, summed with the site's (or none, and why).
std::vector<double> SiteTimes(const RunConfig& cfg, const Mesh& me, std::string* why_not,
                              Status* status) {
  const TrainConfig& tc = cfg.train;
  std::vector<double> seconds;
  try {
    seconds =
        TimeAttentionBlockRows(int(tc.micro_batch_size), cfg.model.seq_len,
                               cfg.model.n_embd / me.tp(), cfg.model.n_head / me.tp(), why_not);
  } catch (const std::exception& e) {  // out of memory, say: the run can go on with the default
    *why_not = fmt::format("the timing failed on rank {}: {}", me.rank(), e.what());
    LogWarning("train.attention_rows = auto: {}; the default block rows instead", *why_not);
    seconds.clear();
  }
  Communicator* site = me.world();
  if (site == nullptr || site->size() == 1) return seconds;
  // [the settings' sums, the ranks that have none]: every rank the same choice.
  const size_t n = std::size(kernels::kAttentionBlockRowsAll);
  std::vector<double> sums(n + 1, 0.0);
  if (seconds.size() == n)
    std::copy(seconds.begin(), seconds.end(), sums.begin());
  else
    sums[n] = 1;
  if (*status = site->AllReduce(std::span<double>(sums)); !status->ok()) return {};
  if (sums[n] > 0) {
    if (why_not->empty())
      *why_not =
          fmt::format("{} of the site's {} ranks could not time", int(sums[n]), site->size());
    return {};
  }
  for (size_t i = 0; i < n; ++i) seconds[i] = sums[i] / site->size();  // the mean
  return seconds;
}

}  // namespace

Status SetUpGpu(const RunConfig& cfg, const Mesh& me) {
  const TrainConfig& tc = cfg.train;
  SetBf16Matmul(tc.precision == "bf16");
  kernels::AttentionBlockRows rows;  // auto starts from the default
  bool automatic = false;
  kernels::AttentionBackwardKind kind{};
  ATOLL_RETURN_IF_ERROR(ParseAttentionSettings(tc, &rows, &automatic, &kind));
  SetAttentionBackwardKind(kind);
  SetAttentionBlockRows(rows);
  if (!automatic) return Status::Ok();
  std::string why_not;
  Status status;
  const std::vector<double> seconds = SiteTimes(cfg, me, &why_not, &status);
  ATOLL_RETURN_IF_ERROR(status);
  rows = kernels::ChooseAttentionBlockRows(seconds);
  SetAttentionBlockRows(rows);
  if (me.rank() != 0) return Status::Ok();
  if (seconds.empty()) {
    LogInfo("train.attention_rows = auto: {} (not timed: {})", ToString(rows), why_not);
  } else {
    const int ranks = me.world() != nullptr ? me.world()->size() : 1;
    LogInfo("train.attention_rows = auto: {} (forward + backward ms{}: {})", ToString(rows),
            ranks > 1 ? fmt::format(", the mean of {} ranks", ranks) : "",
            kernels::DescribeAttentionTimes(seconds));
  }
  return Status::Ok();
}

}  // namespace atl
