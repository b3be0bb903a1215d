// The NCCL backend of comm/nccl/nccl_comm.h. Compiled twice: against the CUDA toolkit's NCCL, and against
// the CUDA emulator's (kernels/cuda/emu/include/nccl.h).
#include "comm/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>

#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "kernels/cuda/runtime.h"

namespace atl {
namespace {

ncclDataType_t NcclType(DType t) {
  switch (t) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kInt32:
      return ncclInt32;
    case DType::kInt64:
      return ncclInt64;
    case DType::kByte:
      return ncclUint8;
  }
  return ncclUint8;
}

// The NCCL communicator and what every operation shares: the stream, the deadline, whether an
// abort has ended it. Shared with the pending operations, so a handle outliving a failed
// communicator still reads a valid state.
struct State {
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  double timeout_s = 300;
  bool broken = false;

  ~State() {
    if (comm != nullptr) (void)(broken ? ncclCommAbort(comm) : ncclCommDestroy(comm));
  }
};

class NcclCommunicator;

// One queued operation: done when the stream has passed it.
class StreamWait final : public CommHandle::Pending {
 public:
  StreamWait(std::shared_ptr<State> state, std::string what)
      : state_(std::move(state)), what_(std::move(what)) {}
  Status Wait() override {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(state_->timeout_s);
    for (auto pause = std::chrono::microseconds(1);; pause = std::min(pause * 2, kMaxPause)) {
      if (state_->broken) return Status::Unavailable(what_ + ": the NCCL communicator was aborted");
      const cudaError_t e = cudaStreamQuery(state_->stream);
      if (e == cudaSuccess) return Status::Ok();
      if (e != cudaErrorNotReady)
        return Status::Internal(fmt::format("{}: CUDA: {}", what_, cudaGetErrorString(e)));
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(state_->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        state_->broken = true;
        return Status::Unavailable(fmt::format("{}: NCCL: {} ({})", what_,
                                               ncclGetErrorString(async),
                                               ncclGetLastError(state_->comm)));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        state_->broken = true;  // the destructor aborts, ending the stuck kernels
        return Status::Unavailable(
            fmt::format("{}: not done within {} s (a peer never joined?); the NCCL communicator "
                        "is aborted",
                        what_, state_->timeout_s));
      }
      std::this_thread::sleep_for(pause);
    }
  }

 private:
  static constexpr std::chrono::microseconds kMaxPause{1000};
  std::shared_ptr<State> state_;
  std::string what_;
};

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(std::shared_ptr<State> state, Communicator& bootstrap,
                   std::unique_ptr<Communicator> owned)
      : state_(std::move(state)), bootstrap_(bootstrap), owned_(std::move(owned)) {}

  int rank() const override { return bootstrap_.rank(); }
  int size() const override { return bootstrap_.size(); }
  std::string label() const override { return bootstrap_.label() + " (nccl)"; }
  bool device_memory() const override { return true; }

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override {
    return Issue(CommOp::kAllReduce, count, dtype, -1, 0, [&] {
      return ncclAllReduce(data, data, count, NcclType(dtype), ncclSum, state_->comm,
                           state_->stream);
    });
  }
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Issue(CommOp::kReduceScatter, count, dtype, -1, 0, [&] {
      return ncclReduceScatter(send, recv, count, NcclType(dtype), ncclSum, state_->comm,
                               state_->stream);
    });
  }
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Issue(CommOp::kAllGather, count, dtype, -1, 0, [&] {
      return ncclAllGather(send, recv, count, NcclType(dtype), state_->comm, state_->stream);
    });
  }
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override {
    return Issue(CommOp::kBroadcast, count, dtype, root, 0, [&] {
      return ncclBroadcast(data, data, count, NcclType(dtype), root, state_->comm,
                           state_->stream);
    });
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override {
    return Issue(CommOp::kSend, count, dtype, dest, tag, [&] {
      return ncclSend(data, count, NcclType(dtype), dest, state_->comm, state_->stream);
    });
  }
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    return Issue(CommOp::kRecv, count, dtype, source, tag, [&] {
      return ncclRecv(data, count, NcclType(dtype), source, state_->comm, state_->stream);
    });
  }
  // NCCL has no barrier: an all-reduce of one int on the GPU is one.
  CommHandle IBarrier() override {
    if (!token_) token_ = std::make_unique<kernels::cuda::DeviceArray<int32_t>>(1);
    return Issue(CommOp::kBarrier, 0, DType::kByte, -1, 0, [&] {
      return ncclAllReduce(token_->data(), token_->data(), 1, ncclInt32, ncclSum, state_->comm,
                           state_->stream);
    });
  }

  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part, bootstrap_.Split(color, key));
    if (part == nullptr) return std::unique_ptr<Communicator>();
    Communicator& boot = *part;
    return Make(boot, std::move(part), state_->timeout_s);
  }

  static StatusOr<std::unique_ptr<Communicator>> Make(Communicator& bootstrap,
                                                      std::unique_ptr<Communicator> owned,
                                                      double timeout_s) {
    const std::string where = bootstrap.label() + ": nccl";
    auto state = std::make_shared<State>();
    state->timeout_s = timeout_s;
    try {
      kernels::cuda::UseDevice(kernels::cuda::DefaultOrdinal());  // nothing when already chosen
      state->stream = static_cast<cudaStream_t>(kernels::cuda::StreamHandle());
    } catch (const std::exception& e) {
      return Status::Unavailable(fmt::format("{}: no GPU: {}", where, e.what()));
    }
    ncclUniqueId id{};
    if (bootstrap.rank() == 0) {
      const ncclResult_t r = ncclGetUniqueId(&id);
      if (r != ncclSuccess)
        return Status::Unavailable(fmt::format("{}: ncclGetUniqueId: {}", where,
                                               ncclGetErrorString(r)));
    }
    ATOLL_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id), DType::kByte, 0));
    const ncclResult_t r = ncclCommInitRank(&state->comm, bootstrap.size(), id, bootstrap.rank());
    if (r != ncclSuccess) {
      state->comm = nullptr;
      return Status::Unavailable(
          fmt::format("{}: ncclCommInitRank: {} (every rank needs a GPU of its own)", where,
                      ncclGetErrorString(r)));
    }
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::move(state), bootstrap, std::move(owned)));
  }

 private:
  template <class Call>
  CommHandle Issue(CommOp op, size_t count, DType dtype, int peer, int tag, Call call) {
    if (Status s = CheckArgs(op, count, dtype, peer, tag); !s.ok()) return CommHandle::Done(s);
    const std::string what = ErrorPrefix(op, count, dtype, peer, tag);
    if (state_->broken)
      return CommHandle::Done(Status::Unavailable(what + ": the NCCL communicator was aborted"));
    const ncclResult_t r = call();
    if (r != ncclSuccess && r != ncclInProgress) {
      // A bad argument leaves the communicator as it was; anything else (a peer gone, a
      // system error) leaves it unusable.
      if (r != ncclInvalidArgument && r != ncclInvalidUsage) state_->broken = true;
      return CommHandle::Done(Status::Unavailable(fmt::format(
          "{}: NCCL: {} ({})", what, ncclGetErrorString(r), ncclGetLastError(state_->comm))));
    }
    return CommHandle(std::make_unique<StreamWait>(state_, what));
  }

  std::shared_ptr<State> state_;
  Communicator& bootstrap_;
  std::unique_ptr<Communicator> owned_;  // the bootstrap, when Split made it
  std::unique_ptr<kernels::cuda::DeviceArray<int32_t>> token_;
};

}  // namespace

StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                             double timeout_s) {
  return NcclCommunicator::Make(bootstrap, nullptr, timeout_s);
}

}  // namespace atl
