// The NCCL backend of comm/nccl/nccl_comm.h. Compiled twice: against the CUDA toolkit's NCCL, and
// against the CUDA emulator's (kernels/cuda/emu/include/nccl.h).
#include "comm/nccl/nccl_comm.h"

#include <cuda_runtime.h>
#include <fmt/format.h>
#include <nccl.h>
#if !defined(ATOLL_CUDA_EMULATED)
#include <dlfcn.h>
#endif

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "kernels/cuda/runtime.h"

namespace atl {
namespace {

// NCCL's functions: the emulator's, or libnccl.so.2's, loaded on first use (dlopen), so that a
// program that never makes an NCCL communicator starts without the library.
struct Api {
  decltype(&ncclGetUniqueId) GetUniqueId;
  decltype(&ncclCommInitRankConfig) CommInitRankConfig;
  decltype(&ncclCommSplit) CommSplit;
  decltype(&ncclCommDestroy) CommDestroy;
  decltype(&ncclCommAbort) CommAbort;
  decltype(&ncclCommGetAsyncError) CommGetAsyncError;
  decltype(&ncclGetErrorString) GetErrorString;
  decltype(&ncclGetLastError) GetLastError;
  decltype(&ncclAllReduce) AllReduce;
  decltype(&ncclReduceScatter) ReduceScatter;
  decltype(&ncclAllGather) AllGather;
  decltype(&ncclBroadcast) Broadcast;
  decltype(&ncclSend) Send;
  decltype(&ncclRecv) Recv;
};

// The API, or null with *why saying what is missing.
const Api* LoadApi(std::string* why) {
  static std::string error;
  static const Api* api = []() -> const Api* {
    // NCCL (2.22 on) connects a communicator's peers inside its first operation on each path by
    // default: on the blocking communicator the operations use, a peer missing then would block
    // that call. Connected while joining instead, which is bounded (Join), unless the user chose.
    setenv("NCCL_RUNTIME_CONNECT", "0", /*overwrite=*/0);
    static Api a{};
#if defined(ATOLL_CUDA_EMULATED)
    a = Api{&ncclGetUniqueId,    &ncclCommInitRankConfig,
            &ncclCommSplit,      &ncclCommDestroy,
            &ncclCommAbort,      &ncclCommGetAsyncError,
            &ncclGetErrorString, &ncclGetLastError,
            &ncclAllReduce,      &ncclReduceScatter,
            &ncclAllGather,      &ncclBroadcast,
            &ncclSend,           &ncclRecv};
    return &a;
#else
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      error = fmt::format(
          "cannot load libnccl.so.2 ({}); put NCCL's lib folder on "
          "LD_LIBRARY_PATH",
          dlerror());
      return nullptr;
    }
    bool ok = true;
    auto get = [&](auto& f, const char* name) {
      f = reinterpret_cast<std::remove_reference_t<decltype(f)>>(dlsym(lib, name));
      if (f == nullptr) {
        ok = false;
        error = fmt::format("libnccl.so.2 has no {}", name);
      }
    };
    get(a.GetUniqueId, "ncclGetUniqueId");
    get(a.CommInitRankConfig, "ncclCommInitRankConfig");
    get(a.CommSplit, "ncclCommSplit");
    get(a.CommDestroy, "ncclCommDestroy");
    get(a.CommAbort, "ncclCommAbort");
    get(a.CommGetAsyncError, "ncclCommGetAsyncError");
    get(a.GetErrorString, "ncclGetErrorString");
    get(a.GetLastError, "ncclGetLastError");
    get(a.AllReduce, "ncclAllReduce");
    get(a.ReduceScatter, "ncclReduceScatter");
    get(a.AllGather, "ncclAllGather");
    get(a.Broadcast, "ncclBroadcast");
    get(a.Send, "ncclSend");
    get(a.Recv, "ncclRecv");
    return ok ? &a : nullptr;
#endif
  }();
  if (api == nullptr && why != nullptr) *why = error;
  return api;
}

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
  const Api* nccl = nullptr;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  double timeout_s = 300;
  bool broken = false;

  // Polls `ready` (StatusOr<bool>: done, not yet, or an error) until done, backing off from 1 us
  // to 1 ms. Fails, naming `what` and aborting the communicator (which ends its kernels, so nothing
  // waiting on the stream hangs), on an error from `ready`, on an asynchronous NCCL error, or
  // after timeout_s.
  template <class Ready>
  Status Poll(const std::string& what, Ready ready) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (auto pause = std::chrono::microseconds(1);; pause = std::min(pause * 2, kMaxPause)) {
      if (broken) return Status::Unavailable(what + ": the NCCL communicator was aborted");
      StatusOr<bool> done = ready();
      if (!done.ok()) {
        Abort();
        return Status::Internal(what + ": " + done.status().message());  // a CUDA error
      }
      if (*done) return Status::Ok();
      ncclResult_t async = ncclSuccess;
      nccl->CommGetAsyncError(comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        const std::string why = LastError();
        Abort();
        return Status::Unavailable(
            fmt::format("{}: NCCL: {} ({})", what, nccl->GetErrorString(async), why));
      }
      if (std::chrono::steady_clock::now() > deadline) {
        Abort();
        return Status::Unavailable(
            fmt::format("{}: not done within {} s (a peer never joined?); the NCCL communicator "
                        "is aborted",
                        what, timeout_s));
      }
      std::this_thread::sleep_for(pause);
    }
  }
  // A call that returned ncclInProgress (joining on the non-blocking communicator, Join) goes on
  // in the background, and nothing may be called or queued on the stream until the
  // communicator's state is ncclSuccess: waits for that.
  Status Settle(const std::string& what) {
    return Poll(what, [this]() -> StatusOr<bool> {
      ncclResult_t state = ncclInProgress;
      nccl->CommGetAsyncError(comm, &state);
      return state == ncclSuccess;  // an error: Poll's check
    });
  }
  static constexpr std::chrono::microseconds kMaxPause{1000};

  // NCCL's last error message (before an abort, which ends the communicator).
  std::string LastError() const { return comm != nullptr ? nccl->GetLastError(comm) : ""; }
  // Ends the communicator now: its kernels stop, so nothing waiting on the stream hangs.
  void Abort() {
    broken = true;
    if (comm != nullptr) nccl->CommAbort(comm);
    comm = nullptr;
  }
  // A communicator in an error state, or with work still on the stream (a kernel waiting for a
  // peer that is gone would never end), is aborted: destroying it waits for that work.
  ~State() {
    if (comm == nullptr) return;
    ncclResult_t state = ncclSuccess;
    nccl->CommGetAsyncError(comm, &state);
    if (state == ncclSuccess && cudaStreamQuery(stream) == cudaSuccess)
      nccl->CommDestroy(comm);
    else
      nccl->CommAbort(comm);
  }
};

// One queued operation: done when the stream has passed it.
class StreamWait final : public CommHandle::Pending {
 public:
  StreamWait(std::shared_ptr<State> state, std::string what)
      : state_(std::move(state)), what_(std::move(what)) {}
  Status Wait() override {
    return state_->Poll(what_, [this]() -> StatusOr<bool> {
      const cudaError_t e = cudaStreamQuery(state_->stream);
      if (e == cudaSuccess) return true;
      if (e == cudaErrorNotReady) return false;
      return Status::Internal(fmt::format("CUDA: {}", cudaGetErrorString(e)));
    });
  }

 private:
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
      return state_->nccl->AllReduce(data, data, count, NcclType(dtype), ncclSum, state_->comm,
                                     state_->stream);
    });
  }
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override {
    return Issue(CommOp::kReduceScatter, count, dtype, -1, 0, [&] {
      return state_->nccl->ReduceScatter(send, recv, count, NcclType(dtype), ncclSum, state_->comm,
                                         state_->stream);
    });
  }
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override {
    return Issue(CommOp::kAllGather, count, dtype, -1, 0, [&] {
      return state_->nccl->AllGather(send, recv, count, NcclType(dtype), state_->comm,
                                     state_->stream);
    });
  }
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override {
    return Issue(CommOp::kBroadcast, count, dtype, root, 0, [&] {
      return state_->nccl->Broadcast(data, data, count, NcclType(dtype), root, state_->comm,
                                     state_->stream);
    });
  }
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override {
    if (Status s = CheckPeer(CommOp::kSend, count, dtype, dest, tag); !s.ok())
      return CommHandle::Done(s);
    return Issue(CommOp::kSend, count, dtype, dest, tag, [&] {
      return state_->nccl->Send(data, count, NcclType(dtype), dest, state_->comm, state_->stream);
    });
  }
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override {
    if (Status s = CheckPeer(CommOp::kRecv, count, dtype, source, tag); !s.ok())
      return CommHandle::Done(s);
    return Issue(CommOp::kRecv, count, dtype, source, tag, [&] {
      return state_->nccl->Recv(data, count, NcclType(dtype), source, state_->comm, state_->stream);
    });
  }
  // NCCL has no barrier: an all-reduce of one int on the GPU is one.
  CommHandle IBarrier() override {
    if (!token_) {
      token_ = std::make_unique<kernels::cuda::DeviceArray<int32_t>>(1);
      token_->SetZero();
    }
    return Issue(CommOp::kBarrier, 0, DType::kByte, -1, 0, [&] {
      return state_->nccl->AllReduce(token_->data(), token_->data(), 1, ncclInt32, ncclSum,
                                     state_->comm, state_->stream);
    });
  }

  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override {
    ATOLL_ASSIGN_OR_RETURN(std::unique_ptr<Communicator> part, bootstrap_.Split(color, key));
    if (part == nullptr) return std::unique_ptr<Communicator>();
    Communicator& boot = *part;
    return Make(boot, std::move(part), state_->timeout_s);
  }

  // Every rank says whether its part so far went well; all fail alike if one did not (so none
  // waits for a rank that gave up).
  static Status Agree(Communicator& bootstrap, const std::string& where, const Status& mine) {
    int32_t failed = mine.ok() ? 0 : 1;
    ATOLL_RETURN_IF_ERROR(bootstrap.AllReduce(&failed, 1, DType::kInt32));
    if (!mine.ok()) return mine;
    if (failed > 0)
      return Status::Unavailable(
          fmt::format("{}: {} other rank(s) could not set up NCCL", where, failed));
    return Status::Ok();
  }

  // Joins NCCL: first on a non-blocking communicator, so that a rank that never joins is a timeout
  // here (Settle) and not a hang inside NCCL; then, every rank being there, the communicator the
  // operations use is split off it as a blocking one (on a non-blocking communicator NCCL returns
  // ncclInProgress from every operation, launched from a thread of its own: each would cost a
  // wait), and the first one is destroyed.
  static Status Join(State& state, const ncclUniqueId& id, int n, int rank,
                     const std::string& where) {
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclResult_t r = state.nccl->CommInitRankConfig(&state.comm, n, id, rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
      state.Abort();
      return Status::Unavailable(
          fmt::format("{}: ncclCommInitRankConfig: {} (every rank needs a GPU of its own)", where,
                      state.nccl->GetErrorString(r)));
    }
    ATOLL_RETURN_IF_ERROR(state.Settle(where + ": ncclCommInitRankConfig"));
    ncclConfig_t blocking = NCCL_CONFIG_INITIALIZER;
    blocking.blocking = 1;
    ncclComm_t ops = nullptr;
    r = state.nccl->CommSplit(state.comm, /*color=*/0, /*key=*/rank, &ops, &blocking);
    if (r == ncclInProgress) {  // the first communicator's split goes on in the background
      if (Status s = state.Settle(where + ": ncclCommSplit"); !s.ok()) {
        if (ops != nullptr) state.nccl->CommAbort(ops);
        return s;
      }
      r = ncclSuccess;
    }
    if (r != ncclSuccess || ops == nullptr) {
      if (ops != nullptr) state.nccl->CommAbort(ops);
      const std::string why = state.LastError();
      state.Abort();
      return Status::Unavailable(
          fmt::format("{}: ncclCommSplit: {} ({})", where, state.nccl->GetErrorString(r), why));
    }
    state.nccl->CommDestroy(state.comm);
    state.comm = ops;
    return state.Settle(where + ": ncclCommSplit");
  }

  static StatusOr<std::unique_ptr<Communicator>> Make(Communicator& bootstrap,
                                                      std::unique_ptr<Communicator> owned,
                                                      double timeout_s) {
    const std::string where = bootstrap.label() + ": nccl";
    auto state = std::make_shared<State>();
    state->timeout_s = timeout_s;
    ncclUniqueId id{};
    Status setup;
    if (std::string why; (state->nccl = LoadApi(&why)) == nullptr) {
      setup = Status::Unavailable(fmt::format("{}: {}", where, why));
    } else {
      try {
        // The process's GPU (chosen on first use) and stream; NCCL runs on this thread's device.
        state->stream = static_cast<cudaStream_t>(kernels::cuda::StreamHandle());
      } catch (const std::exception& e) {
        setup = Status::Unavailable(fmt::format("{}: no GPU: {}", where, e.what()));
      }
    }
    if (setup.ok() && bootstrap.rank() == 0) {
      if (const ncclResult_t r = state->nccl->GetUniqueId(&id); r != ncclSuccess)
        setup = Status::Unavailable(
            fmt::format("{}: ncclGetUniqueId: {}", where, state->nccl->GetErrorString(r)));
    }
    ATOLL_RETURN_IF_ERROR(Agree(bootstrap, where, setup));
    ATOLL_RETURN_IF_ERROR(bootstrap.Broadcast(&id, sizeof(id), DType::kByte, 0));
    setup = Join(*state, id, bootstrap.size(), bootstrap.rank(), where);
    if (Status agreed = Agree(bootstrap, where, setup); !agreed.ok()) {
      state->Abort();
      return agreed;
    }
    return std::unique_ptr<Communicator>(
        new NcclCommunicator(std::move(state), bootstrap, std::move(owned)));
  }

 private:
  // NCCL matches sends and receives by pair, in order: no tags, no messages to oneself.
  Status CheckPeer(CommOp op, size_t count, DType dtype, int peer, int tag) const {
    if (tag != 0)
      return Status::InvalidArgument(ErrorPrefix(op, count, dtype, peer, tag) +
                                     ": NCCL has no tags (messages match in order); use tag 0");
    if (peer == rank())
      return Status::InvalidArgument(ErrorPrefix(op, count, dtype, peer, tag) +
                                     ": NCCL cannot send to the same rank");
    return Status::Ok();
  }

  template <class Call>
  CommHandle Issue(CommOp op, size_t count, DType dtype, int peer, int tag, Call call) {
    if (Status s = CheckArgs(op, count, dtype, peer, tag); !s.ok()) return CommHandle::Done(s);
    const std::string what = ErrorPrefix(op, count, dtype, peer, tag);
    if (state_->broken)
      return CommHandle::Done(Status::Unavailable(what + ": the NCCL communicator was aborted"));
    const ncclResult_t r = call();
    if (r == ncclInProgress) {  // (not from a blocking communicator) settled before anything else
      if (Status s = state_->Settle(what); !s.ok()) return CommHandle::Done(s);
    } else if (r != ncclSuccess) {
      // A bad argument leaves the communicator as it was; anything else (a peer gone, a
      // system error) leaves it unusable.
      const std::string why = state_->LastError();
      if (r != ncclInvalidArgument && r != ncclInvalidUsage) state_->Abort();
      return CommHandle::Done(Status::Unavailable(
          fmt::format("{}: NCCL: {} ({})", what, state_->nccl->GetErrorString(r), why)));
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
