// LiveSites: collectives over some of the WAN's sites from direct sends (world/live_sites.h).
#include "world/live_sites.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <utility>

namespace atl {

Piece PieceOf(size_t n, size_t m, size_t k) {
  const size_t base = n / m, rem = n % m;
  return {k * base + std::min(k, rem), base + (k < rem ? 1 : 0)};
}

std::string SiteList(const std::vector<int>& sites) {
  std::string s;
  for (int x : sites) s += fmt::format("{}{}", s.empty() ? "" : ",", x);
  return s;
}

namespace {

// The header of an all-reduce's all-gather message: whether the owner could sum its piece.
constexpr uint64_t kSumOk = 0x4d55534556494c41ULL;  // "ALIVESUM"
constexpr uint64_t kGaveUp = 0;
constexpr size_t kHeader = sizeof(uint64_t);
constexpr int kPhases = 4;

// Waits for every handle; the first failure (the others still waited for).
Status WaitAll(std::vector<CommHandle>& handles) {
  Status first;
  for (CommHandle& h : handles) {
    Status s = h.Wait();
    if (!s.ok() && first.ok()) first = s;
  }
  return first;
}

// The reduce-scatter of LiveSites' reductions, over direct sends: rank k of `sites` gets every
// rank's piece k of data (piece(k): elements), and this rank (me) sums its own piece, in rank
// order, into sum (piece(me).size elements, zeroed). Returns the first failed receive (the
// pieces that arrived are still summed; sum then lacks a contribution); *sent the first failed
// send.
template <class PieceFn>
Status SumMyPiece(Communicator* wan, const std::vector<int>& sites, size_t me, const void* data,
                  DType dtype, int tag, PieceFn piece, uint8_t* sum, Status* sent) {
  const size_t m = sites.size(), es = DTypeSize(dtype);
  const auto* bytes = static_cast<const uint8_t*>(data);
  const Piece mine = piece(me);
  std::vector<std::vector<uint8_t>> in(m);
  std::vector<CommHandle> recvs(m), sends;
  for (size_t j = 0; j < m; ++j) {
    if (j == me) continue;
    in[j].resize(mine.size * es);
    recvs[j] = wan->IRecv(in[j].data(), in[j].size(), DType::kByte, sites[j], tag);
  }
  for (size_t step = 1; step < m; ++step) {
    const size_t k = (me + step) % m;
    const Piece p = piece(k);
    sends.push_back(wan->ISend(bytes + p.begin * es, p.size * es, DType::kByte, sites[k], tag));
  }
  Status missed;
  for (size_t j = 0; j < m; ++j) {
    const uint8_t* add = bytes + mine.begin * es;
    if (j != me) {
      Status s = recvs[j].Wait();
      if (!s.ok()) {
        if (missed.ok()) missed = s;
        continue;
      }
      add = in[j].data();
    }
    AddInto(dtype, sum, add, mine.size);
  }
  *sent = WaitAll(sends);
  return missed;
}

}  // namespace

LiveSites::LiveSites(Communicator* wan, std::vector<int> sites, uint32_t generation)
    : wan_(wan), sites_(std::move(sites)), generation_(generation) {
  if (wan_ == nullptr) return;
  const auto me = std::find(sites_.begin(), sites_.end(), wan_->rank());
  if (me != sites_.end()) rank_ = int(me - sites_.begin());
}

std::string LiveSites::label() const {
  return fmt::format("site {} (of live sites {})", wan_ != nullptr ? wan_->rank() : -1,
                     SiteList(sites_));
}

Status LiveSites::Valid() const {
  if (wan_ == nullptr) return Status::InvalidArgument("live sites: no WAN communicator");
  for (size_t i = 0; i < sites_.size(); ++i)
    if (sites_[i] < 0 || sites_[i] >= wan_->size() || (i > 0 && sites_[i] <= sites_[i - 1]))
      return Status::InvalidArgument(
          fmt::format("{}: the live sites must be distinct, sorted sites of the WAN (size {})",
                      label(), wan_->size()));
  if (rank_ < 0)
    return Status::InvalidArgument(fmt::format("{}: this site is not among them", label()));
  return Status::Ok();
}

int LiveSites::Tag(int phase) const {
  return kLiveSitesTagBase + int((generation_ & 0x3ffu) << 18) + int((op_ & 0xffffu) << 2) + phase;
}

CommHandle LiveSites::IAllReduce(void* data, size_t count, DType dtype) {
  return CommHandle::Done(AllReduce_(data, count, dtype));
}
CommHandle LiveSites::IReduceScatter(const void* send, void* recv, size_t count, DType dtype) {
  return CommHandle::Done(ReduceScatter_(send, recv, count, dtype));
}
CommHandle LiveSites::IAllGather(const void* send, void* recv, size_t count, DType dtype) {
  return CommHandle::Done(AllGather_(send, recv, count, dtype));
}
CommHandle LiveSites::IBroadcast(void* data, size_t count, DType dtype, int root) {
  return CommHandle::Done(Broadcast_(data, count, dtype, root));
}
CommHandle LiveSites::IBarrier() {
  int64_t one = 1;
  return CommHandle::Done(AllReduce_(&one, 1, DType::kInt64));
}

CommHandle LiveSites::ISend(const void* data, size_t count, DType dtype, int dest, int tag) {
  if (Status v = Valid(); !v.ok()) return CommHandle::Done(v);
  if (Status s = CheckArgs(CommOp::kSend, count, dtype, dest, tag); !s.ok())
    return CommHandle::Done(s);
  return wan_->ISend(data, count, dtype, sites_[size_t(dest)], tag + 2 * kLiveSitesTagBase);
}

CommHandle LiveSites::IRecv(void* data, size_t count, DType dtype, int source, int tag) {
  if (Status v = Valid(); !v.ok()) return CommHandle::Done(v);
  if (Status s = CheckArgs(CommOp::kRecv, count, dtype, source, tag); !s.ok())
    return CommHandle::Done(s);
  return wan_->IRecv(data, count, dtype, sites_[size_t(source)], tag + 2 * kLiveSitesTagBase);
}

StatusOr<std::unique_ptr<Communicator>> LiveSites::Split(int, int) {
  return Status::InvalidArgument(label() + ": split is not supported");
}

Status LiveSites::AllReduce_(void* data, size_t count, DType dtype) {
  ATOLL_RETURN_IF_ERROR(Valid());
  ATOLL_RETURN_IF_ERROR(CheckArgs(CommOp::kAllReduce, count, dtype));
  const int rs_tag = Tag(0), ag_tag = Tag(1);
  Next();
  const size_t m = sites_.size(), me = size_t(rank_), es = DTypeSize(dtype);
  if (m == 1 || count == 0) return Status::Ok();
  const Piece mine = PieceOf(count, m, me);
  const std::string what = ErrorPrefix(CommOp::kAllReduce, count, dtype);

  // Reduce-scatter: every rank's copy of my piece, summed in rank order.
  std::vector<uint8_t> sum(kHeader + mine.size * es, 0);
  Status sent;
  const Status missed = SumMyPiece(
      wan_, sites_, me, data, dtype, rs_tag, [&](size_t k) { return PieceOf(count, m, k); },
      sum.data() + kHeader, &sent);
  const uint64_t header = missed.ok() ? kSumOk : kGaveUp;
  std::memcpy(sum.data(), &header, kHeader);

  // All-gather: every owner's sum (or its give-up) to every rank.
  std::vector<std::vector<uint8_t>> got(m);
  std::vector<CommHandle> ag_recvs(m), ag_sends;
  for (size_t j = 0; j < m; ++j) {
    if (j == me) continue;
    got[j].resize(kHeader + PieceOf(count, m, j).size * es);
    ag_recvs[j] = wan_->IRecv(got[j].data(), got[j].size(), DType::kByte, sites_[j], ag_tag);
  }
  for (size_t step = 1; step < m; ++step)
    ag_sends.push_back(
        wan_->ISend(sum.data(), sum.size(), DType::kByte, sites_[(me + step) % m], ag_tag));
  Status first = missed;
  for (size_t j = 0; j < m; ++j) {
    if (j == me) continue;
    Status s = ag_recvs[j].Wait();
    uint64_t h = kGaveUp;
    if (s.ok()) std::memcpy(&h, got[j].data(), kHeader);
    if (s.ok() && h != kSumOk)
      s = Status::Unavailable(
          fmt::format("site {} could not sum its piece (it missed a contribution)", sites_[j]));
    if (!s.ok() && first.ok()) first = s;
  }
  Status ag_sent = WaitAll(ag_sends);
  if (first.ok()) first = sent.ok() ? ag_sent : sent;
  if (!first.ok()) return first.WithContext(what);
  auto* out = static_cast<uint8_t*>(data);
  for (size_t j = 0; j < m; ++j) {
    const Piece p = PieceOf(count, m, j);
    const uint8_t* from = j == me ? sum.data() : got[j].data();
    std::memcpy(out + p.begin * es, from + kHeader, p.size * es);
  }
  return Status::Ok();
}

Status LiveSites::ReduceScatter_(const void* send, void* recv, size_t count, DType dtype) {
  ATOLL_RETURN_IF_ERROR(Valid());
  ATOLL_RETURN_IF_ERROR(CheckArgs(CommOp::kReduceScatter, count, dtype));
  const int tag = Tag(0);
  Next();
  const size_t me = size_t(rank_), bytes = count * DTypeSize(dtype);
  std::vector<uint8_t> sum(bytes, 0);
  Status sent;
  Status first = SumMyPiece(
      wan_, sites_, me, send, dtype, tag,
      [&](size_t k) {
        return Piece{k * count, count};
      },
      sum.data(), &sent);
  if (first.ok()) first = sent;
  if (!first.ok()) return first.WithContext(ErrorPrefix(CommOp::kReduceScatter, count, dtype));
  std::memcpy(recv, sum.data(), bytes);
  return Status::Ok();
}

Status LiveSites::AllGather_(const void* send, void* recv, size_t count, DType dtype) {
  ATOLL_RETURN_IF_ERROR(Valid());
  ATOLL_RETURN_IF_ERROR(CheckArgs(CommOp::kAllGather, count, dtype));
  const int tag = Tag(0);
  Next();
  const size_t m = sites_.size(), me = size_t(rank_), bytes = count * DTypeSize(dtype);
  std::vector<uint8_t> all(m * bytes);
  std::memcpy(all.data() + me * bytes, send, bytes);
  std::vector<CommHandle> ops;
  for (size_t j = 0; j < m; ++j)
    if (j != me)
      ops.push_back(wan_->IRecv(all.data() + j * bytes, bytes, DType::kByte, sites_[j], tag));
  for (size_t step = 1; step < m; ++step)
    ops.push_back(wan_->ISend(send, bytes, DType::kByte, sites_[(me + step) % m], tag));
  if (Status s = WaitAll(ops); !s.ok())
    return s.WithContext(ErrorPrefix(CommOp::kAllGather, count, dtype));
  std::memcpy(recv, all.data(), all.size());
  return Status::Ok();
}

Status LiveSites::Broadcast_(void* data, size_t count, DType dtype, int root) {
  ATOLL_RETURN_IF_ERROR(Valid());
  ATOLL_RETURN_IF_ERROR(CheckArgs(CommOp::kBroadcast, count, dtype, root));
  const int tag = Tag(0);
  Next();
  const size_t bytes = count * DTypeSize(dtype);
  if (rank_ == root) {
    std::vector<CommHandle> sends;
    for (size_t j = 0; j < sites_.size(); ++j)
      if (int(j) != root) sends.push_back(wan_->ISend(data, bytes, DType::kByte, sites_[j], tag));
    Status s = WaitAll(sends);
    return s.ok() ? s : s.WithContext(ErrorPrefix(CommOp::kBroadcast, count, dtype, root));
  }
  std::vector<uint8_t> in(bytes);
  Status s = wan_->Recv(in.data(), bytes, DType::kByte, sites_[size_t(root)], tag);
  if (!s.ok()) return s.WithContext(ErrorPrefix(CommOp::kBroadcast, count, dtype, root));
  std::memcpy(data, in.data(), bytes);
  return Status::Ok();
}

}  // namespace atl
