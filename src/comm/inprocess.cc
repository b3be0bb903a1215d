#include "comm/inprocess.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>

namespace atl {

namespace {

using Clock = std::chrono::steady_clock;

std::string RankList(const std::vector<int>& ranks) {
  if (ranks.empty()) return "none";
  return fmt::format("{}", fmt::join(ranks, ","));
}

// One collective call, as matched across the ranks of a group by its position in the call order.
struct Collective {
  enum class State { kPending, kRunning, kDone };

  CommOp op;
  size_t count;
  DType dtype;
  int root;
  int first_rank;  // the rank whose call created this entry (for mismatch messages)
  std::vector<const void*> send;
  std::vector<void*> recv;
  std::vector<int> color, key;
  std::vector<bool> arrived;
  int n_arrived = 0;
  State state = State::kPending;
  std::string failure;  // empty on success; else why, without the rank/op prefix
  std::vector<std::unique_ptr<Communicator>> split_out;

  Collective(CommOp o, size_t c, DType d, int r, int first, int n)
      : op(o),
        count(c),
        dtype(d),
        root(r),
        first_rank(first),
        send(n),
        recv(n),
        color(n),
        key(n),
        arrived(n, false),
        split_out(n) {}
  std::vector<int> Missing() const {
    std::vector<int> m;
    for (size_t r = 0; r < arrived.size(); ++r)
      if (!arrived[r]) m.push_back(static_cast<int>(r));
    return m;
  }
};

struct Message {
  std::vector<uint8_t> bytes;
  size_t count;
  DType dtype;
};

struct Group {
  Group(int n, InProcessOptions o) : size(n), options(o), next_seq(n, 0), left(n, false) {}
  const int size;
  const InProcessOptions options;
  std::mutex mu;
  std::condition_variable cv;
  std::map<uint64_t, std::shared_ptr<Collective>> collectives;  // by position in call order
  std::vector<uint64_t> next_seq;
  std::vector<bool> left;
  std::map<std::tuple<int, int, int>, std::deque<Message>> mailbox;  // (source, dest, tag)

  // REQUIRES: mu held.
  void Fail(const std::shared_ptr<Collective>& c, std::string why) {
    c->state = Collective::State::kDone;
    c->failure = std::move(why);
    cv.notify_all();
  }
  // REQUIRES: mu held. Fails `c` if a rank that has left has not joined it.
  void FailIfDeparted(const std::shared_ptr<Collective>& c) {
    if (c->state != Collective::State::kPending) return;
    for (int r = 0; r < size; ++r) {
      if (left[r] && !c->arrived[r]) {
        Fail(c, fmt::format("rank {} left the group before joining (arrived: {})", r, RankList([&] {
                              std::vector<int> a;
                              for (int q = 0; q < size; ++q)
                                if (c->arrived[q]) a.push_back(q);
                              return a;
                            }())));
        return;
      }
    }
  }
};

// ((x0 + x1) + x2) + ...: one fixed order, so the result does not depend on arrival order.
void Sum(DType dtype, const std::vector<const void*>& in, size_t count, void* out) {
  std::memcpy(out, in[0], count * DTypeSize(dtype));
  for (size_t r = 1; r < in.size(); ++r) AddInto(dtype, out, in[r], count);
}

class InProcessCommunicator;
void Execute(const std::shared_ptr<Group>& g, Collective& c, const std::string& parent_label);

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Group> g, int rank, std::string label)
      : g_(std::move(g)), rank_(rank), label_(std::move(label)) {}
  ~InProcessCommunicator() override {
    std::lock_guard<std::mutex> lk(g_->mu);
    g_->left[rank_] = true;
    for (auto& [seq, c] : g_->collectives) g_->FailIfDeparted(c);
    g_->cv.notify_all();
  }

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string label() const override { return label_; }

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override {
    return Post(CommOp::kAllReduce, count, dtype, -1, data, data);
  }
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Post(CommOp::kReduceScatter, count, dtype, -1, send, recv);
  }
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Post(CommOp::kAllGather, count, dtype, -1, send, recv);
  }
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override {
    return Post(CommOp::kBroadcast, count, dtype, root, data, data);
  }
  CommHandle IBarrier() override {
    return Post(CommOp::kBarrier, 0, DType::kByte, -1, nullptr, nullptr);
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override;
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override;
  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  class CollectiveWait;
  class RecvWait;

  CommHandle Post(CommOp op, size_t count, DType dtype, int root, const void* send, void* recv,
                  int color = 0, int key = 0, std::shared_ptr<Collective>* out = nullptr);

  std::shared_ptr<Group> g_;
  const int rank_;
  const std::string label_;
};

class InProcessCommunicator::CollectiveWait final : public CommHandle::Pending {
 public:
  CollectiveWait(std::shared_ptr<Group> g, std::shared_ptr<Collective> c, std::string prefix)
      : g_(std::move(g)), c_(std::move(c)), prefix_(std::move(prefix)) {}

  Status Wait() override {
    std::unique_lock<std::mutex> lk(g_->mu);
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(g_->options.timeout_s));
    auto done = [&] { return c_->state == Collective::State::kDone; };
    if (!g_->cv.wait_until(lk, deadline, done)) {
      if (c_->state == Collective::State::kPending) {
        g_->Fail(c_, fmt::format("timed out after {} s waiting for ranks {} (arrived: {})",
                                 g_->options.timeout_s, RankList(c_->Missing()), [&] {
                                   std::vector<int> a;
                                   for (int q = 0; q < g_->size; ++q)
                                     if (c_->arrived[q]) a.push_back(q);
                                   return RankList(a);
                                 }()));
      } else {
        g_->cv.wait(lk, done);  // all arrived: the reduction is running and will finish
      }
    }
    if (c_->failure.empty()) return Status::Ok();
    return Status::Unavailable(fmt::format("{}: {}", prefix_, c_->failure));
  }

 private:
  std::shared_ptr<Group> g_;
  std::shared_ptr<Collective> c_;
  std::string prefix_;
};

CommHandle InProcessCommunicator::Post(CommOp op, size_t count, DType dtype, int root,
                                       const void* send, void* recv, int color, int key,
                                       std::shared_ptr<Collective>* out) {
  Status s = CheckArgs(op, count, dtype, root);
  if (!s.ok()) return CommHandle::Done(s);
  const std::string prefix = ErrorPrefix(op, count, dtype, root);
  std::shared_ptr<Collective> c;
  bool run_here = false;
  {
    std::lock_guard<std::mutex> lk(g_->mu);
    const uint64_t seq = g_->next_seq[rank_]++;
    auto it = g_->collectives.find(seq);
    if (it == g_->collectives.end()) {
      c = std::make_shared<Collective>(op, count, dtype, root, rank_, g_->size);
      g_->collectives.emplace(seq, c);
    } else {
      c = it->second;
    }
    if (out) *out = c;
    c->arrived[rank_] = true;
    c->n_arrived++;
    c->send[rank_] = send;
    c->recv[rank_] = recv;
    c->color[rank_] = color;
    c->key[rank_] = key;
    if (c->n_arrived == g_->size) g_->collectives.erase(seq);
    if (c->state == Collective::State::kPending) {
      if (c->op != op || c->count != count || c->dtype != dtype || c->root != root) {
        g_->Fail(c,
                 fmt::format("mismatched collectives: rank {} called {}, rank {} called {} at the "
                             "same position (collectives must be called in the same order, "
                             "with the same sizes, on every rank)",
                             c->first_rank, DescribeOp(c->op, c->count, c->dtype, c->root), rank_,
                             DescribeOp(op, count, dtype, root)));
      } else if (c->n_arrived == g_->size) {
        c->state = Collective::State::kRunning;
        run_here = true;
      } else {
        g_->FailIfDeparted(c);
      }
    }
  }
  if (run_here) {
    // Every rank has posted its buffers and none may touch them until Wait() returns: the last
    // arrival computes for all, outside the lock.
    Execute(g_, *c, label_);
    std::lock_guard<std::mutex> lk(g_->mu);
    c->state = Collective::State::kDone;
    g_->cv.notify_all();
  }
  return CommHandle(std::make_unique<CollectiveWait>(g_, c, prefix));
}

void Execute(const std::shared_ptr<Group>& g, Collective& c, const std::string& parent_label) {
  const int n = g->size;
  const size_t bytes = c.count * DTypeSize(c.dtype);
  switch (c.op) {
    case CommOp::kAllReduce: {
      std::vector<uint8_t> acc(bytes);
      Sum(c.dtype, c.send, c.count, acc.data());
      for (int r = 0; r < n; ++r) std::memcpy(c.recv[r], acc.data(), bytes);
      break;
    }
    case CommOp::kReduceScatter: {
      std::vector<const void*> blocks(n);
      for (int r = 0; r < n; ++r) {
        for (int q = 0; q < n; ++q) blocks[q] = static_cast<const uint8_t*>(c.send[q]) + r * bytes;
        Sum(c.dtype, blocks, c.count, c.recv[r]);
      }
      break;
    }
    case CommOp::kAllGather:
      for (int r = 0; r < n; ++r)
        for (int q = 0; q < n; ++q)
          std::memcpy(static_cast<uint8_t*>(c.recv[r]) + q * bytes, c.send[q], bytes);
      break;
    case CommOp::kBroadcast:
      for (int r = 0; r < n; ++r)
        if (r != c.root) std::memcpy(c.recv[r], c.send[c.root], bytes);
      break;
    case CommOp::kSplit: {
      std::map<int, std::vector<int>> members;  // color -> parent ranks
      for (int r = 0; r < n; ++r)
        if (c.color[r] != Communicator::kNoGroup) members[c.color[r]].push_back(r);
      for (auto& [color, ranks] : members) {
        std::stable_sort(ranks.begin(), ranks.end(),
                         [&](int a, int b) { return c.key[a] < c.key[b]; });
        auto sub = std::make_shared<Group>(static_cast<int>(ranks.size()), g->options);
        for (size_t i = 0; i < ranks.size(); ++i) {
          c.split_out[ranks[i]] = std::make_unique<InProcessCommunicator>(
              sub, static_cast<int>(i),
              fmt::format("rank {} of group {} (parent rank {})", i, color, ranks[i]));
        }
      }
      break;
    }
    case CommOp::kBarrier:
    case CommOp::kSend:
    case CommOp::kRecv:
      break;
  }
  (void)parent_label;
}

StatusOr<std::unique_ptr<Communicator>> InProcessCommunicator::Split(int color, int key) {
  if (color < 0 && color != kNoGroup) {
    return Status::InvalidArgument(
        fmt::format("{}: split: color {} must be >= 0 or kNoGroup", label_, color));
  }
  std::shared_ptr<Collective> c;
  // Split is matched like any collective; its count is 0 so that only the op kind must agree.
  Status s = Post(CommOp::kSplit, 0, DType::kByte, -1, nullptr, nullptr, color, key, &c).Wait();
  if (!s.ok()) return s;
  std::lock_guard<std::mutex> lk(g_->mu);
  return std::move(c->split_out[rank_]);
}

CommHandle InProcessCommunicator::ISend(const void* data, size_t count, DType dtype, int dest,
                                        int tag) {
  Status s = CheckArgs(CommOp::kSend, count, dtype, dest, tag);
  if (!s.ok()) return CommHandle::Done(s);
  // Eager: the message is copied into the destination's mailbox, so a send completes at once.
  Message m{std::vector<uint8_t>(count * DTypeSize(dtype)), count, dtype};
  if (count) std::memcpy(m.bytes.data(), data, m.bytes.size());
  std::lock_guard<std::mutex> lk(g_->mu);
  if (g_->left[dest]) {
    return CommHandle::Done(Status::Unavailable(
        fmt::format("{}: rank {} has left the group",
                    ErrorPrefix(CommOp::kSend, count, dtype, dest, tag), dest)));
  }
  g_->mailbox[{rank_, dest, tag}].push_back(std::move(m));
  g_->cv.notify_all();
  return CommHandle();
}

class InProcessCommunicator::RecvWait final : public CommHandle::Pending {
 public:
  RecvWait(std::shared_ptr<Group> g, int rank, void* data, size_t count, DType dtype, int source,
           int tag, std::string prefix)
      : g_(std::move(g)),
        rank_(rank),
        data_(data),
        count_(count),
        dtype_(dtype),
        source_(source),
        tag_(tag),
        prefix_(std::move(prefix)) {}

  Status Wait() override {
    std::unique_lock<std::mutex> lk(g_->mu);
    auto& queue = g_->mailbox[{source_, rank_, tag_}];
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(g_->options.timeout_s));
    if (!g_->cv.wait_until(lk, deadline, [&] { return !queue.empty() || g_->left[source_]; })) {
      return Status::Unavailable(fmt::format("{}: timed out after {} s: no message from rank {}",
                                             prefix_, g_->options.timeout_s, source_));
    }
    if (queue.empty()) {
      return Status::Unavailable(
          fmt::format("{}: rank {} left the group without sending", prefix_, source_));
    }
    Message m = std::move(queue.front());
    queue.pop_front();
    if (m.count != count_ || m.dtype != dtype_) {
      return Status::InvalidArgument(
          fmt::format("{}: the message has {} {}", prefix_, m.count, DTypeName(m.dtype)));
    }
    if (!m.bytes.empty()) std::memcpy(data_, m.bytes.data(), m.bytes.size());
    return Status::Ok();
  }

 private:
  std::shared_ptr<Group> g_;
  int rank_;
  void* data_;
  size_t count_;
  DType dtype_;
  int source_, tag_;
  std::string prefix_;
};

CommHandle InProcessCommunicator::IRecv(void* data, size_t count, DType dtype, int source,
                                        int tag) {
  Status s = CheckArgs(CommOp::kRecv, count, dtype, source, tag);
  if (!s.ok()) return CommHandle::Done(s);
  return CommHandle(
      std::make_unique<RecvWait>(g_, rank_, data, count, dtype, source, tag,
                                 ErrorPrefix(CommOp::kRecv, count, dtype, source, tag)));
}

}  // namespace

std::vector<std::unique_ptr<Communicator>> CreateInProcessGroup(int size,
                                                                InProcessOptions options) {
  auto g = std::make_shared<Group>(size, options);
  std::vector<std::unique_ptr<Communicator>> comms;
  for (int r = 0; r < size; ++r)
    comms.push_back(std::make_unique<InProcessCommunicator>(g, r, fmt::format("rank {}", r)));
  return comms;
}

std::vector<Status> RunInProcessRanks(int size, const std::function<Status(Communicator&)>& fn,
                                      InProcessOptions options) {
  auto comms = CreateInProcessGroup(size, options);
  std::vector<Status> statuses(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      std::unique_ptr<Communicator> comm = std::move(comms[r]);
      statuses[r] = fn(*comm);
    });
  }
  for (auto& t : threads) t.join();
  return statuses;
}

}  // namespace atl
