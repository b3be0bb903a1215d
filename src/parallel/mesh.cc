#include "parallel/mesh.h"

#include <fmt/format.h>

#include <cstdint>

namespace atl {

namespace {

// One collective Split of `world` into the group named `what`. A one-rank result is dropped:
// callers test the pointer, and a group of one has nothing to communicate.
Status SplitGroup(Communicator* world, int color, int key, const char* what,
                  std::unique_ptr<Communicator>* out) {
  auto g = world->Split(color, key);
  if (!g.ok()) return g.status().WithContext(fmt::format("mesh: splitting the {} group", what));
  *out = std::move(g).value();
  if (*out != nullptr && (*out)->size() == 1) out->reset();
  return Status::Ok();
}

}  // namespace

StatusOr<Mesh> Mesh::Make(Communicator* world, int dp, int tp, int pp) {
  if (dp < 1 || tp < 1 || pp < 1) {
    return Status::InvalidArgument(
        fmt::format("mesh: degrees must be >= 1, got dp {} tp {} pp {}", dp, tp, pp));
  }
  // In 64 bits: a product of large degrees must be reported, not wrap around to a match.
  const int64_t n = int64_t{dp} * tp * pp;
  const int64_t world_size = world != nullptr ? world->size() : 1;
  if (n != world_size) {
    return Status::InvalidArgument(
        fmt::format("mesh: dp {} x tp {} x pp {} = {} ranks, but the world has {}{}", dp, tp, pp, n,
                    world_size, world == nullptr ? " (no world communicator)" : ""));
  }

  Mesh m;
  m.world_ = world;
  m.dp_ = dp;
  m.tp_ = tp;
  m.pp_ = pp;
  m.rank_ = world != nullptr ? world->rank() : 0;
  m.tp_rank_ = m.rank_ % tp;
  m.dp_rank_ = (m.rank_ / tp) % dp;
  m.pp_rank_ = m.rank_ / (tp * dp);

  // Every rank takes the same branches (they depend on the degrees only), so the Splits are
  // called the same number of times in the same order everywhere, as a collective must be. A
  // degree of 1 makes one-rank groups on every rank: no Split at all.
  if (tp > 1) {
    ATOLL_RETURN_IF_ERROR(
        SplitGroup(world, m.pp_rank_ * dp + m.dp_rank_, m.tp_rank_, "tp", &m.tp_group_));
  }
  if (dp > 1) {
    ATOLL_RETURN_IF_ERROR(
        SplitGroup(world, m.pp_rank_ * tp + m.tp_rank_, m.dp_rank_, "dp", &m.dp_group_));
  }
  const int column = m.dp_rank_ * tp + m.tp_rank_;  // the same (dp_rank, tp_rank)
  if (pp > 1) {
    ATOLL_RETURN_IF_ERROR(SplitGroup(world, column, m.pp_rank_, "pp", &m.pp_group_));
    // Keyed by stage: the first stage is rank 0 of the embedding group, the last rank 1.
    const bool ends = m.first_stage() || m.last_stage();
    ATOLL_RETURN_IF_ERROR(SplitGroup(world, ends ? column : Communicator::kNoGroup, m.pp_rank_,
                                     "embedding", &m.embed_group_));
  }
  return m;
}

std::string Mesh::Describe() const {
  return fmt::format("dp {}/{} tp {}/{} pp {}/{} (rank {})", dp_rank_, dp_, tp_rank_, tp_, pp_rank_,
                     pp_, rank_);
}

}  // namespace atl
