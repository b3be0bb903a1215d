// Communicator: the collectives and point-to-point messages that ranks of one site exchange.
//
// A Communicator is one rank's view of a group of `size()` ranks. Backends (MPI in mpi.h, threads
// in one process in inprocess.h, later NCCL) implement the non-blocking operations; the blocking
// ones default to "start, then Wait()" and a backend may override them with a faster path (the MPI
// backend calls MPI_Allreduce directly). Algorithms above this layer (data parallel buckets, tensor
// parallel all-reduces, pipeline sends) see only this interface.
//
// Semantics, as in MPI:
//   - Collectives are matched by call order: every rank of the group must call the same sequence of
//     collectives with the same count, dtype and root. A mismatch is an error, never a silent
//     mix-up.
//   - Reductions are sums. Buffers passed to a non-blocking call belong to the operation until its
//     handle's Wait() returns; do not read or write them before.
//   - Send/Recv match by (source, destination, tag), in order.
//
// Errors: every failure is a Status whose message names the rank, the operation and what went
// wrong, e.g. "rank 1: all_reduce of 4096 float32: rank 0 left the group before joining". A peer
// that never arrives gives an error after the backend's timeout, not a hang without a message.
//
// Thread-safety: a Communicator is used by one thread at a time (the thread that owns the rank).
// CommHandles may be waited on from that thread only. Different Communicators (one per rank in the
// in-process backend) may be used concurrently from different threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/status.h"

namespace atl {

enum class DType { kFloat32, kFloat64, kInt32, kInt64, kByte };

size_t DTypeSize(DType t);
// "float32", "float64", "int32", "int64", "byte".
const char* DTypeName(DType t);
// Sums are defined for every dtype except kByte.
bool DTypeIsReducible(DType t);
// acc[i] += add[i] for count elements of dtype (a reducible one; kByte does nothing): the one
// element-wise sum every backend's reductions are made of.
void AddInto(DType dtype, void* acc, const void* add, size_t count);

template <class T>
constexpr DType DTypeOf();
template <>
constexpr DType DTypeOf<float>() {
  return DType::kFloat32;
}
template <>
constexpr DType DTypeOf<double>() {
  return DType::kFloat64;
}
template <>
constexpr DType DTypeOf<int32_t>() {
  return DType::kInt32;
}
template <>
constexpr DType DTypeOf<int64_t>() {
  return DType::kInt64;
}
template <>
constexpr DType DTypeOf<uint8_t>() {
  return DType::kByte;
}

// The kinds of operation, for error messages and for matching collectives across ranks.
enum class CommOp {
  kAllReduce,
  kReduceScatter,
  kAllGather,
  kBroadcast,
  kSend,
  kRecv,
  kBarrier,
  kSplit
};
// "all_reduce", "reduce_scatter", ...
const char* CommOpName(CommOp op);
// "all_reduce of 4096 float32", "broadcast of 10 float64 from rank 2", "send of 8 byte to rank 1
// (tag 3)", "barrier". `peer` is the root, destination or source; -1 when none.
std::string DescribeOp(CommOp op, size_t count, DType dtype, int peer = -1, int tag = 0);

// The completion of a non-blocking operation. Move-only. Wait() blocks until the operation has
// finished (or failed, or timed out) and returns its status; a second Wait() returns the same
// status. A handle destroyed without Wait() waits in its destructor (and drops the status), so
// that no operation outlives the buffers its caller passed.
class CommHandle {
 public:
  // What a backend implements: one in-flight operation.
  class Pending {
   public:
    virtual ~Pending() = default;
    virtual Status Wait() = 0;
  };

  CommHandle() = default;  // an already completed, ok operation
  explicit CommHandle(std::unique_ptr<Pending> pending) : pending_(std::move(pending)) {}
  static CommHandle Done(Status s);

  CommHandle(CommHandle&&) noexcept = default;
  CommHandle& operator=(CommHandle&& other) noexcept;
  CommHandle(const CommHandle&) = delete;
  CommHandle& operator=(const CommHandle&) = delete;
  ~CommHandle();

  Status Wait();

 private:
  std::unique_ptr<Pending> pending_;
  Status status_;
};

class Communicator {
 public:
  // Pass as Split's color to take no part in any sub-group (Split then gives nullptr).
  static constexpr int kNoGroup = -1;

  virtual ~Communicator() = default;
  Communicator() = default;
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "rank 1", or for a sub-group "rank 1 of group 0 (world rank 3)": prefixes error messages.
  virtual std::string label() const = 0;
  // Whether the buffers passed are device memory of the process's GPU (NCCL, comm/nccl/nccl_comm.h) rather
  // than host memory (every other backend).
  virtual bool device_memory() const { return false; }

  // ---- Non-blocking operations (type-erased; the typed wrappers below are the usual entry). ----

  // data[i] = sum over ranks of data[i], in place. `count` elements of `dtype`.
  virtual CommHandle IAllReduce(void* data, size_t count, DType dtype) = 0;
  // send holds size() blocks of `count` elements; recv gets the sum over ranks of block rank().
  // REQUIRES: send and recv do not overlap.
  virtual CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) = 0;
  // send holds `count` elements; recv (size() * count elements) gets every rank's block in rank
  // order. REQUIRES: send and recv do not overlap.
  virtual CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) = 0;
  // data on every rank becomes root's data.
  virtual CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) = 0;
  virtual CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) = 0;
  // Receives exactly `count` elements; a message of another size is an error.
  virtual CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) = 0;
  virtual CommHandle IBarrier() = 0;

  // ---- Blocking operations: default "start, Wait()"; backends may override. ----
  virtual Status AllReduce(void* data, size_t count, DType dtype) {
    return IAllReduce(data, count, dtype).Wait();
  }
  virtual Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype) {
    return IReduceScatter(send, recv, count, dtype).Wait();
  }
  virtual Status AllGather(const void* send, void* recv, size_t count, DType dtype) {
    return IAllGather(send, recv, count, dtype).Wait();
  }
  virtual Status Broadcast(void* data, size_t count, DType dtype, int root) {
    return IBroadcast(data, count, dtype, root).Wait();
  }
  virtual Status Send(const void* data, size_t count, DType dtype, int dest, int tag) {
    return ISend(data, count, dtype, dest, tag).Wait();
  }
  virtual Status Recv(void* data, size_t count, DType dtype, int source, int tag) {
    return IRecv(data, count, dtype, source, tag).Wait();
  }
  virtual Status Barrier() { return IBarrier().Wait(); }

  // Collective: ranks passing the same color form a new group, ranked by (key, rank()). A rank
  // passing kNoGroup gets nullptr. Used for the mesh's dp / tp / pp groups.
  virtual StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) = 0;

  // ---- Typed wrappers. ----
  template <class T>
  Status AllReduce(std::span<T> data) {
    return AllReduce(data.data(), data.size(), DTypeOf<T>());
  }
  template <class T>
  CommHandle IAllReduce(std::span<T> data) {
    return IAllReduce(data.data(), data.size(), DTypeOf<T>());
  }
  // REQUIRES: send.size() == size() * recv.size()
  template <class T>
  Status ReduceScatter(std::span<const T> send, std::span<T> recv) {
    ATOLL_RETURN_IF_ERROR(
        CheckBlocks(CommOp::kReduceScatter, send.size(), recv.size(), DTypeOf<T>()));
    return ReduceScatter(send.data(), recv.data(), recv.size(), DTypeOf<T>());
  }
  template <class T>
  CommHandle IReduceScatter(std::span<const T> send, std::span<T> recv) {
    Status s = CheckBlocks(CommOp::kReduceScatter, send.size(), recv.size(), DTypeOf<T>());
    if (!s.ok()) return CommHandle::Done(s);
    return IReduceScatter(send.data(), recv.data(), recv.size(), DTypeOf<T>());
  }
  // REQUIRES: recv.size() == size() * send.size()
  template <class T>
  Status AllGather(std::span<const T> send, std::span<T> recv) {
    ATOLL_RETURN_IF_ERROR(CheckBlocks(CommOp::kAllGather, recv.size(), send.size(), DTypeOf<T>()));
    return AllGather(send.data(), recv.data(), send.size(), DTypeOf<T>());
  }
  template <class T>
  CommHandle IAllGather(std::span<const T> send, std::span<T> recv) {
    Status s = CheckBlocks(CommOp::kAllGather, recv.size(), send.size(), DTypeOf<T>());
    if (!s.ok()) return CommHandle::Done(s);
    return IAllGather(send.data(), recv.data(), send.size(), DTypeOf<T>());
  }
  template <class T>
  Status Broadcast(std::span<T> data, int root) {
    return Broadcast(data.data(), data.size(), DTypeOf<T>(), root);
  }
  template <class T>
  CommHandle IBroadcast(std::span<T> data, int root) {
    return IBroadcast(data.data(), data.size(), DTypeOf<T>(), root);
  }
  template <class T>
  Status Send(std::span<const T> data, int dest, int tag = 0) {
    return Send(data.data(), data.size(), DTypeOf<T>(), dest, tag);
  }
  template <class T>
  CommHandle ISend(std::span<const T> data, int dest, int tag = 0) {
    return ISend(data.data(), data.size(), DTypeOf<T>(), dest, tag);
  }
  template <class T>
  Status Recv(std::span<T> data, int source, int tag = 0) {
    return Recv(data.data(), data.size(), DTypeOf<T>(), source, tag);
  }
  template <class T>
  CommHandle IRecv(std::span<T> data, int source, int tag = 0) {
    return IRecv(data.data(), data.size(), DTypeOf<T>(), source, tag);
  }

 protected:
  // "<label>: <op description>: <what>" as the message of an error of `code`-like kind.
  std::string ErrorPrefix(CommOp op, size_t count, DType dtype, int peer = -1, int tag = 0) const;
  // Checks arguments every backend must reject the same way: root/peer in range, reducible dtype.
  Status CheckArgs(CommOp op, size_t count, DType dtype, int peer = -1, int tag = 0) const;

 private:
  // big == size() * small, for reduce-scatter (send vs recv) and all-gather (recv vs send).
  Status CheckBlocks(CommOp op, size_t big, size_t small, DType dtype) const;
};

}  // namespace atl
