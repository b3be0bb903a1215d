// The mesh of one site: dp x tp x pp ranks and their communication sub-groups.
//
// World rank r = (pp_rank * dp + dp_rank) * tp + tp_rank: tensor-parallel ranks are neighbours
// (they exchange the most, every layer), then data-parallel replicas, then pipeline stages
// (Megatron's order). Groups:
//   tp_group:    the tp ranks with the same (pp_rank, dp_rank), ranked by tp_rank;
//   dp_group:    the dp ranks with the same (pp_rank, tp_rank), ranked by dp_rank;
//   pp_group:    the pp ranks with the same (dp_rank, tp_rank), ranked by pp_rank (its rank is the
//                stage);
//   embed_group: with pp > 1, the first and last stage of the same (dp_rank, tp_rank) (they both
//                hold the tied wte: its gradients are summed between them), ranked first stage
//                then last; null on the other stages and when pp == 1.
// A group of one rank is null (nothing to communicate): callers test the pointer.
//
// Thread-safety: a Mesh is used by its rank's thread only, like its Communicators.
#pragma once

#include <memory>
#include <string>

#include "comm/communicator.h"
#include "core/status.h"

namespace atl {

class Mesh {
 public:
  // A single process: dp = tp = pp = 1, every group null.
  Mesh() = default;
  Mesh(Mesh&&) noexcept = default;
  Mesh& operator=(Mesh&&) noexcept = default;

  // Collective over `world` (every rank must call it). world may be null when dp*tp*pp == 1.
  // Errors (InvalidArgument): degrees < 1, or dp*tp*pp != world size.
  static StatusOr<Mesh> Make(Communicator* world, int dp, int tp, int pp);

  int dp() const { return dp_; }
  int tp() const { return tp_; }
  int pp() const { return pp_; }
  int rank() const { return rank_; }  // in the world
  int size() const { return dp_ * tp_ * pp_; }
  int dp_rank() const { return dp_rank_; }
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }  // the stage
  bool first_stage() const { return pp_rank_ == 0; }
  bool last_stage() const { return pp_rank_ == pp_ - 1; }
  int RankOf(int dp_rank, int tp_rank, int pp_rank) const {
    return (pp_rank * dp_ + dp_rank) * tp_ + tp_rank;
  }
  // "dp 1/2 tp 0/2 pp 1/2 (rank 6)".
  std::string Describe() const;

  Communicator* world() const { return world_; }
  Communicator* dp_group() const { return dp_group_.get(); }
  Communicator* tp_group() const { return tp_group_.get(); }
  Communicator* pp_group() const { return pp_group_.get(); }
  Communicator* embed_group() const { return embed_group_.get(); }

 private:
  Communicator* world_ = nullptr;
  int dp_ = 1, tp_ = 1, pp_ = 1;
  int rank_ = 0, dp_rank_ = 0, tp_rank_ = 0, pp_rank_ = 0;
  std::unique_ptr<Communicator> dp_group_, tp_group_, pp_group_, embed_group_;
};

}  // namespace atl
