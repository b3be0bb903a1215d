// A Communicator over the live sites of a world: what a sync run's sites use once one of them was
// lost (train/strategies/sync_strategy.cc), in place of the WAN Communicator's ring collectives,
// which need every site (world/wan.h: they fail while a site is absent, dead or reconnected).
//
// Built on the WAN Communicator's direct sends and receives only, which work with any site gone:
// rank i of a LiveSites is site sites[i] of the WAN. Every collective is direct, so a receive
// depends on its sender alone and a dead sender fails it at once (PeerLost, or its connection
// closing):
//   all_reduce       reduce-scatter then all-gather: the data is cut into size() pieces (piece k
//                    owned by rank k, the first count % size() pieces one element longer); each
//                    rank sends every owner its piece; the owner sums the pieces in rank order
//                    (0 + d_0 + d_1 + ...: floats in a fixed order, integers exactly) and sends
//                    the sum to every rank. An owner that missed a contribution sends a give-up
//                    in place of its sum (every message of that phase carries an 8-byte header),
//                    so nobody waits for it and nobody takes a sum that lacks one.
//   reduce_scatter   block k sent to rank k, summed there in rank order
//   all_gather       each rank's block to every other
//   broadcast        the root's data to every other rank
//   barrier          an all_reduce of one int64
//   send / recv      the WAN's, with the ranks mapped to sites
// Results are staged: the caller's buffers change only when every message arrived. Operations run
// to completion in the call (the non-blocking ones return a completed handle). Split is not
// supported (an error).
//
// Tags: each collective is numbered in call order; its messages use tags derived from
// (generation, number, phase) at and above kLiveSitesTagBase, and send / recv tags are moved above
// those, so a LiveSites shares the WAN Communicator with other users of tags below 2^28
// (world/exchange.h). Every site of `sites` must build its LiveSites with the same sites and
// generation and call the same collectives in the same order; a new generation (e.g. the
// coordinator round that decided the live sites) keeps messages of an older one apart.
//
// Thread-safety: as Communicator; nothing else may use the WAN Communicator's collectives
// meanwhile.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace atl {

inline constexpr int kLiveSitesTagBase = 1 << 28;

// Piece k of n elements cut into m: the first n % m pieces have one element more (how a
// reduce-scatter over m sites splits its data here and in world/exchange.h).
struct Piece {
  size_t begin = 0, size = 0;
};
Piece PieceOf(size_t n, size_t m, size_t k);

// "0,2,3": sites for messages.
std::string SiteList(const std::vector<int>& sites);

class LiveSites final : public Communicator {
 public:
  // wan: rank = site, not owned. sites: sorted, distinct, within wan's size, with wan->rank()
  // among them (checked: kInvalidArgument from every operation otherwise).
  LiveSites(Communicator* wan, std::vector<int> sites, uint32_t generation);

  int rank() const override { return rank_; }
  int size() const override { return int(sites_.size()); }
  std::string label() const override;
  const std::vector<int>& sites() const { return sites_; }

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override;
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override;
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override;
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override;
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override;
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override;
  CommHandle IBarrier() override;
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  Status AllReduce_(void* data, size_t count, DType dtype);
  Status ReduceScatter_(const void* send, void* recv, size_t count, DType dtype);
  Status AllGather_(const void* send, void* recv, size_t count, DType dtype);
  Status Broadcast_(void* data, size_t count, DType dtype, int root);
  // The tag of phase `phase` (0..3) of the next collective (Next() numbers it).
  int Tag(int phase) const;
  void Next() { ++op_; }
  Status Valid() const;

  Communicator* wan_;
  std::vector<int> sites_;
  uint32_t generation_;
  int rank_ = -1;
  uint32_t op_ = 0;
};

}  // namespace atl
