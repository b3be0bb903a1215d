// The Communicator of an endpoint (world/wan.h): collectives on the ring, sends and receives.
#include <fmt/format.h>

#include <cstring>

#include "comm/collective_thread.h"
#include "core/hash.h"
#include "world/transport/chunk.h"
#include "world/transport/core.h"

namespace atl::transport {

// Wraps a handle so that the caller's blocking time counts in the stats.
class TimedWait final : public CommHandle::Pending {
 public:
  TimedWait(std::shared_ptr<WanCore> core, CommHandle inner)
      : core_(std::move(core)), inner_(std::move(inner)) {}
  Status Wait() override {
    const double t0 = NowSeconds();
    Status s = inner_.Wait();
    core_->AddSeconds(NowSeconds() - t0);
    return s;
  }

 private:
  std::shared_ptr<WanCore> core_;
  CommHandle inner_;
};

class SendWait final : public CommHandle::Pending {
 public:
  SendWait(std::shared_ptr<WanCore> core, std::shared_ptr<OpTracker> tracker, int dest,
           std::string prefix)
      : core_(std::move(core)),
        tracker_(std::move(tracker)),
        dest_(dest),
        prefix_(std::move(prefix)) {}
  Status Wait() override {
    Status s = core_->WaitSent(*tracker_, dest_);
    if (!s.ok()) {
      core_->Cancel(tracker_);  // the caller may free its buffer when this returns
      return s.WithContext(prefix_);
    }
    return s;
  }

 private:
  std::shared_ptr<WanCore> core_;
  std::shared_ptr<OpTracker> tracker_;
  int dest_;
  std::string prefix_;
};

class RecvWait final : public CommHandle::Pending {
 public:
  RecvWait(std::shared_ptr<WanCore> core, void* data, size_t count, DType dtype, int source,
           int tag, uint64_t seq, std::string prefix)
      : stage_(core->options().stage_receives),
        core_(std::move(core)),
        data_(static_cast<char*>(data)),
        count_(count),
        dtype_(dtype),
        source_(source),
        tag_(tag),
        seq_(seq),
        generation_(core_->InboxGeneration(source)),
        prefix_(std::move(prefix)) {}
  Status Wait() override {
    Status s = Receive();
    core_->EraseMessage(source_, static_cast<uint32_t>(tag_), seq_, !s.ok(), generation_);
    return s.ok() ? s : s.WithContext(prefix_);
  }

 private:
  Status Receive() {
    const size_t es = DTypeSize(dtype_);
    // Verified chunks are kept (stage_) and the caller's buffer written when all have arrived,
    // or each is written as soon as it is verified.
    std::vector<Received> parts;
    size_t got = 0;
    do {
      ATOLL_ASSIGN_OR_RETURN(Received r, core_->PopMessage(source_, uint32_t(tag_), seq_));
      const pb::Chunk& c = *r.chunk;
      ChunkExpectation e;
      e.kind = "message";
      e.op_seq = seq_;
      e.dtype = uint32_t(dtype_);
      e.total = count_;
      e.offset = got;
      e.count = count_ - got;
      e.exact_count = false;
      e.element_bytes = es;
      if (std::string bad = CheckChunk(c, r.hash, e); !bad.empty())
        return Status::Corruption(
            fmt::format("bad chunk from {}: {}", core_->PeerName(source_), bad));
      got += c.count();
      core_->CountReceived(c.payload().size());
      if (!stage_ && !c.payload().empty()) {
        std::memcpy(data_ + c.offset() * es, c.payload().data(), c.payload().size());
        continue;
      }
      parts.push_back(std::move(r));
    } while (got < count_);
    for (const Received& r : parts)
      if (!r.chunk->payload().empty())
        std::memcpy(data_ + r.chunk->offset() * es, r.chunk->payload().data(),
                    r.chunk->payload().size());
    return Status::Ok();
  }

  const bool stage_;
  std::shared_ptr<WanCore> core_;
  char* data_;
  size_t count_;
  DType dtype_;
  int source_, tag_;
  uint64_t seq_;
  uint64_t generation_;  // of the source's inbox when the receive began
  std::string prefix_;
};

// The outgoing chunks of one collective. Declared after (so destroyed before) every buffer its
// chunks point into: when the collective fails, the chunks still queued are cancelled and dropped,
// so none is read from memory freed after the collective returns.
class Outgoing {
 public:
  explicit Outgoing(WanCore* core) : core_(core), tracker_(std::make_shared<OpTracker>()) {}
  ~Outgoing() { core_->Cancel(tracker_); }
  Outgoing(const Outgoing&) = delete;
  Outgoing& operator=(const Outgoing&) = delete;
  const std::shared_ptr<OpTracker>& tracker() const { return tracker_; }
  OpTracker& operator*() const { return *tracker_; }

 private:
  WanCore* core_;
  std::shared_ptr<OpTracker> tracker_;
};

class WanCommunicator final : public Communicator {
 public:
  WanCommunicator(std::shared_ptr<WanCore> core, std::vector<int> ring)
      : core_(std::move(core)), rank_(core_->site()), n_(core_->sites()), ring_(std::move(ring)) {
    for (int i = 0; i < n_; ++i)
      if (ring_[i] == rank_) pos_ = i;
    next_ = ring_[(pos_ + 1) % n_];
    prev_ = ring_[(pos_ + n_ - 1) % n_];
    chunk_bytes_ = core_->options().chunk_bytes;
  }
  ~WanCommunicator() override { worker_.reset(); }

  int rank() const override { return rank_; }
  int size() const override { return n_; }
  std::string label() const override { return fmt::format("site {}", rank_); }

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override {
    return Start(CommOp::kAllReduce, count, dtype, -1, count,
                 [=, this](const OpInfo& o) { return RunAllReduce(o, data); });
  }
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Start(CommOp::kReduceScatter, count, dtype, -1, count * n_,
                 [=, this](const OpInfo& o) { return RunReduceScatter(o, send, recv, count); });
  }
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Start(CommOp::kAllGather, count, dtype, -1, count * n_,
                 [=, this](const OpInfo& o) { return RunAllGather(o, send, recv, count); });
  }
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override {
    return Start(CommOp::kBroadcast, count, dtype, root, count,
                 [=, this](const OpInfo& o) { return RunBroadcast(o, data); });
  }
  CommHandle IBarrier() override {
    return Start(CommOp::kBarrier, 0, DType::kByte, -1, 0,
                 [this](const OpInfo& o) { return RunBarrier(o); });
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override;
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override;
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    return Status::InvalidArgument(
        fmt::format("{}: split: the WAN transport has no sub-groups", label()));
  }

 private:
  CommHandle Start(CommOp op, size_t count, DType dtype, int root, size_t total,
                   std::function<Status(const OpInfo&)> run) {
    Status s = CheckArgs(op, count, dtype, root);
    if (!s.ok()) return CommHandle::Done(s);
    if (n_ > 1) {
      // With a site absent, or after a Reconnect, the ring cannot run: fail now, not hang.
      s = core_->CollectivesAllowed();
      if (!s.ok()) return CommHandle::Done(s.WithContext(ErrorPrefix(op, count, dtype, root)));
    }
    core_->CountOp();
    OpInfo o{op, next_seq_++, dtype, total, root, ErrorPrefix(op, count, dtype, root)};
    if (!worker_) worker_ = std::make_unique<CollectiveThread>();
    CommHandle h = worker_->Run(
        [this, o, run = std::move(run)] {
          Status st = run(o);
          if (st.ok()) return st;
          core_->FailOp(o.seq, st.message());
          return st.WithContext(o.prefix);
        },
        0, o.prefix);
    return CommHandle(std::make_unique<TimedWait>(core_, std::move(h)));
  }

  // After a Reconnect with `peer`, point-to-point numbering with it starts again at 1 (as on the
  // other side, whose inbox for this site is fresh).
  void SyncEpoch(int peer) {
    if (peer == rank_) return;
    const uint64_t e = core_->PeerEpoch(peer);
    if (e == epochs_[peer]) return;
    epochs_[peer] = e;
    std::erase_if(send_seq_, [&](const auto& kv) { return kv.first.first == peer; });
    std::erase_if(recv_seq_, [&](const auto& kv) { return kv.first.first == peer; });
  }

  uint8_t* Staging(size_t bytes) {
    if (bytes > staging_cap_) {
      staging_.reset(new uint8_t[bytes]);
      staging_cap_ = bytes;
    }
    return staging_.get();
  }
  size_t ChunkElems(DType t) const { return std::max<size_t>(1, chunk_bytes_ / DTypeSize(t)); }
  // Block b of a buffer of `total` elements split into n_ nearly equal blocks.
  size_t BlockBegin(size_t total, int b) const {
    return size_t(b) * (total / n_) + std::min<size_t>(size_t(b), total % n_);
  }

  // Queues elements off..off+cnt of the operation, read from `src` when written: src must stay
  // unchanged until the tracker's chunks are all written.
  Status SendChunk(const OpInfo& o, int peer, uint32_t step, const uint8_t* src, size_t off,
                   size_t cnt, const std::shared_ptr<OpTracker>& tracker,
                   std::optional<uint64_t> hash = std::nullopt) {
    const size_t bytes = cnt * DTypeSize(o.dtype);
    auto c = NewChunk({.from_site = rank_,
                       .op = uint32_t(o.op),
                       .op_seq = o.seq,
                       .tag = step,
                       .dtype = uint32_t(o.dtype),
                       .offset = off,
                       .count = cnt,
                       .total = o.total,
                       .root = o.root < 0 ? 0 : uint32_t(o.root)});
    c->set_checksum(hash ? *hash : Hash64(src, bytes));
    OutItem item;
    item.chunk = std::move(c);
    item.src = reinterpret_cast<const char*>(src);
    item.src_bytes = bytes;
    item.tracker = tracker;
    item.data = true;
    std::string err = core_->Enqueue(peer, std::move(item));
    if (!err.empty()) return Status::Unavailable(err);
    return Status::Ok();
  }

  // The next chunk of `o` from `peer`, checked against what this site expects.
  StatusOr<Received> Expect(const OpInfo& o, int peer, uint32_t step, size_t off, size_t cnt) {
    ATOLL_ASSIGN_OR_RETURN(Received r, core_->PopCollective(peer, o.seq, [&] {
      return fmt::format("ring step {}, elements {}..{}", step, off, off + cnt);
    }));
    const pb::Chunk& c = *r.chunk;
    ChunkExpectation e;
    e.op_seq = o.seq;
    e.op = uint32_t(o.op);
    e.dtype = uint32_t(o.dtype);
    e.total = o.total;
    e.root = o.root < 0 ? 0 : uint32_t(o.root);
    e.step = step;
    e.offset = off;
    e.count = cnt;
    e.element_bytes = DTypeSize(o.dtype);
    if (std::string bad = CheckChunk(c, r.hash, e); !bad.empty())
      return Status::Corruption(fmt::format("bad chunk from {}: {}", core_->PeerName(peer), bad));
    core_->CountReceived(c.payload().size());
    return r;
  }

  // The ring: reduce-scatter steps (rs), then all-gather steps (ag), chunk by chunk, on `buf`
  // in place. Ring position j holds block ring_[j - 1] of the buffer, so that after the
  // reduce-scatter every site holds its own block (rank order), as all-gather starts from.
  Status Ring(const OpInfo& o, uint8_t* buf, bool rs, bool ag,
              const std::shared_ptr<OpTracker>& tracker) {
    const size_t es = DTypeSize(o.dtype), ce = ChunkElems(o.dtype);
    auto segment = [&](int j) {
      const int b = ring_[(((j - 1) % n_) + n_) % n_];
      return std::pair<size_t, size_t>(BlockBegin(o.total, b), BlockBegin(o.total, b + 1));
    };
    const int rs_steps = rs ? n_ - 1 : 0, steps = rs_steps + (ag ? n_ - 1 : 0);
    {
      auto [lo, hi] = segment(rs ? pos_ : pos_ + 1);
      for (size_t off = lo; off < hi; off += ce)
        ATOLL_RETURN_IF_ERROR(
            SendChunk(o, next_, 0, buf + off * es, off, std::min(ce, hi - off), tracker));
    }
    for (int s = 0; s < steps; ++s) {
      const bool reduce = s < rs_steps;
      const int k = reduce ? s : s - rs_steps;
      auto [lo, hi] = segment(reduce ? pos_ - k - 1 : pos_ - k);
      for (size_t off = lo; off < hi; off += ce) {
        const size_t cnt = std::min(ce, hi - off);
        ATOLL_ASSIGN_OR_RETURN(Received r, Expect(o, prev_, uint32_t(s), off, cnt));
        const std::string& p = r.chunk->payload();
        if (reduce)
          AddInto(o.dtype, buf + off * es, p.data(), cnt);
        else
          std::memcpy(buf + off * es, p.data(), p.size());
        if (s + 1 < steps)
          ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, uint32_t(s + 1), buf + off * es, off, cnt,
                                          tracker,
                                          reduce ? std::nullopt : std::optional<uint64_t>(r.hash)));
      }
    }
    return Status::Ok();
  }

  Status RunAllReduce(const OpInfo& o, void* data) {
    if (n_ == 1 || o.total == 0) return Status::Ok();
    const size_t bytes = o.total * DTypeSize(o.dtype);
    uint8_t* buf = Staging(bytes);
    std::memcpy(buf, data, bytes);
    Outgoing out(core_.get());
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, true, true, out.tracker()));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*out, next_));
    std::memcpy(data, buf, bytes);
    return Status::Ok();
  }

  Status RunReduceScatter(const OpInfo& o, const void* send, void* recv, size_t count) {
    const size_t es = DTypeSize(o.dtype);
    if (n_ == 1 || count == 0) {
      if (count) std::memcpy(recv, send, count * es);
      return Status::Ok();
    }
    uint8_t* buf = Staging(o.total * es);
    std::memcpy(buf, send, o.total * es);
    Outgoing out(core_.get());
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, true, false, out.tracker()));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*out, next_));
    std::memcpy(recv, buf + BlockBegin(o.total, rank_) * es, count * es);
    return Status::Ok();
  }

  Status RunAllGather(const OpInfo& o, const void* send, void* recv, size_t count) {
    const size_t es = DTypeSize(o.dtype);
    if (n_ == 1 || count == 0) {
      if (count) std::memcpy(recv, send, count * es);
      return Status::Ok();
    }
    uint8_t* buf = Staging(o.total * es);
    std::memcpy(buf + BlockBegin(o.total, rank_) * es, send, count * es);
    Outgoing out(core_.get());
    ATOLL_RETURN_IF_ERROR(Ring(o, buf, false, true, out.tracker()));
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*out, next_));
    std::memcpy(recv, buf, o.total * es);
    return Status::Ok();
  }

  // Pipelined along the ring from the root: each chunk is forwarded as soon as it arrives.
  Status RunBroadcast(const OpInfo& o, void* data) {
    if (n_ == 1 || o.total == 0) return Status::Ok();
    const size_t es = DTypeSize(o.dtype), ce = ChunkElems(o.dtype);
    int root_pos = 0;
    for (int i = 0; i < n_; ++i)
      if (ring_[i] == o.root) root_pos = i;
    const int d = (pos_ - root_pos + n_) % n_;
    auto* bytes = static_cast<uint8_t*>(data);
    std::vector<Received> parts;  // forwarded from: outlives `out`
    Outgoing out(core_.get());
    if (d == 0) {
      for (size_t off = 0; off < o.total; off += ce)
        ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, 0, bytes + off * es, off,
                                        std::min(ce, o.total - off), out.tracker()));
      return core_->WaitSent(*out, next_);
    }
    for (size_t off = 0; off < o.total; off += ce) {
      const size_t cnt = std::min(ce, o.total - off);
      ATOLL_ASSIGN_OR_RETURN(Received r, Expect(o, prev_, 0, off, cnt));
      if (d < n_ - 1) {  // forwards the received payload itself (kept in parts)
        const std::string& p = r.chunk->payload();
        ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, 0, reinterpret_cast<const uint8_t*>(p.data()),
                                        off, cnt, out.tracker(), r.hash));
      }
      parts.push_back(std::move(r));
    }
    ATOLL_RETURN_IF_ERROR(core_->WaitSent(*out, next_));  // parts are read until now
    for (const Received& r : parts)
      std::memcpy(bytes + r.chunk->offset() * es, r.chunk->payload().data(),
                  r.chunk->payload().size());
    return Status::Ok();
  }

  // A token around the ring n - 1 times: when a site has seen n - 1 tokens, every site entered.
  Status RunBarrier(const OpInfo& o) {
    if (n_ == 1) return Status::Ok();
    Outgoing out(core_.get());
    ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, 0, nullptr, 0, 0, out.tracker()));
    for (int k = 0; k < n_ - 1; ++k) {
      ATOLL_RETURN_IF_ERROR(Expect(o, prev_, uint32_t(k), 0, 0).status());
      if (k + 1 < n_ - 1)
        ATOLL_RETURN_IF_ERROR(SendChunk(o, next_, uint32_t(k + 1), nullptr, 0, 0, out.tracker()));
    }
    return core_->WaitSent(*out, next_);
  }

  std::shared_ptr<WanCore> core_;
  const int rank_, n_;
  const std::vector<int> ring_;
  int pos_ = 0, next_ = 0, prev_ = 0;
  size_t chunk_bytes_ = 1 << 20;
  uint64_t next_seq_ = 1;
  std::map<std::pair<int, int>, uint64_t> send_seq_, recv_seq_;  // (peer, tag) -> last message
  std::vector<uint64_t> epochs_ = std::vector<uint64_t>(n_, 0);  // by peer: PeerEpoch seen
  std::unique_ptr<uint8_t[]> staging_;                           // the worker's
  size_t staging_cap_ = 0;
  std::unique_ptr<CollectiveThread> worker_;  // last: joined first
};

CommHandle WanCommunicator::ISend(const void* data, size_t count, DType dtype, int dest, int tag) {
  Status s = CheckArgs(CommOp::kSend, count, dtype, dest, tag);
  if (!s.ok()) return CommHandle::Done(s);
  core_->CountOp();
  const std::string prefix = ErrorPrefix(CommOp::kSend, count, dtype, dest, tag);
  SyncEpoch(dest);
  const uint64_t seq = ++send_seq_[{dest, tag}];
  const size_t es = DTypeSize(dtype), ce = ChunkElems(dtype);
  const char* src = static_cast<const char*>(data);
  auto tracker = std::make_shared<OpTracker>();
  size_t off = 0;
  do {
    const size_t cnt = std::min(ce, count - off);
    auto c = NewChunk({.from_site = rank_,
                       .op = uint32_t(CommOp::kSend),
                       .op_seq = seq,
                       .tag = uint32_t(tag),
                       .dtype = uint32_t(dtype),
                       .offset = off,
                       .count = cnt,
                       .total = count});
    if (dest == rank_) {  // to ourselves: straight into the inbox
      c->set_payload(src + off * es, cnt * es);
      c->set_checksum(Hash64(src + off * es, cnt * es));
      core_->Dispatch(rank_, PooledChunk(c.release(), ChunkReturn{}), NowSeconds());
    } else {
      OutItem item;
      item.chunk = std::move(c);
      if (cnt > 0) {
        item.src = src + off * es;  // read when written, until the send completes
        item.src_bytes = cnt * es;
        item.hash_at_write = true;
      } else {
        item.chunk->set_checksum(Hash64("", 0));
      }
      item.tracker = tracker;
      item.data = true;
      if (std::string err = core_->Enqueue(dest, std::move(item)); !err.empty()) {
        core_->Cancel(tracker);  // no chunk of a part-sent message goes out after this
        tracker->Fail(err);
        break;
      }
    }
    off += cnt;
  } while (off < count);
  return CommHandle(std::make_unique<TimedWait>(
      core_, CommHandle(std::make_unique<SendWait>(core_, tracker, dest, prefix))));
}

CommHandle WanCommunicator::IRecv(void* data, size_t count, DType dtype, int source, int tag) {
  Status s = CheckArgs(CommOp::kRecv, count, dtype, source, tag);
  if (!s.ok()) return CommHandle::Done(s);
  core_->CountOp();
  SyncEpoch(source);
  const uint64_t seq = ++recv_seq_[{source, tag}];
  return CommHandle(std::make_unique<TimedWait>(
      core_, CommHandle(std::make_unique<RecvWait>(
                 core_, data, count, dtype, source, tag, seq,
                 ErrorPrefix(CommOp::kRecv, count, dtype, source, tag)))));
}

StatusOr<std::unique_ptr<Communicator>> MakeCommunicator(std::shared_ptr<WanCore> core,
                                                         std::vector<int> ring) {
  return std::unique_ptr<Communicator>(new WanCommunicator(std::move(core), std::move(ring)));
}

}  // namespace atl::transport
