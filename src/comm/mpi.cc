#include "comm/mpi.h"

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "core/log.h"

namespace atl {

namespace {

MPI_Datatype ToMpi(DType t) {
  switch (t) {
    case DType::kFloat32:
      return MPI_FLOAT;
    case DType::kFloat64:
      return MPI_DOUBLE;
    case DType::kInt32:
      return MPI_INT32_T;
    case DType::kInt64:
      return MPI_INT64_T;
    case DType::kByte:
      return MPI_BYTE;
  }
  return MPI_BYTE;
}

std::string MpiErrorString(int rc) {
  char buf[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(rc, buf, &len) != MPI_SUCCESS) return fmt::format("MPI error code {}", rc);
  return std::string(buf, len);
}

bool MpiFinalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// One in-flight MPI request (the analyzer's MPI checker cannot follow requests into a handle;
// hence its NOLINTs). Wait() polls MPI_Test so that it can give up after the timeout;
// it yields the core between polls (ranks are often oversubscribed on shared machines).
class RequestWait final : public CommHandle::Pending {
 public:
  RequestWait(MPI_Request request, double timeout_s, std::string prefix, size_t expect_count,
              MPI_Datatype type)
      : request_(request),
        timeout_s_(timeout_s),
        prefix_(std::move(prefix)),
        expect_count_(expect_count),
        type_(type) {}

  Status Wait() override {
    MPI_Status st;
    int rc;
    if (timeout_s_ <= 0) {
      rc = MPI_Wait(&request_, &st);  // NOLINT(clang-analyzer-optin.mpi.MPI-Checker)
    } else {
      const double deadline = NowSeconds() + timeout_s_;
      int done = 0;
      for (uint64_t polls = 0;; ++polls) {
        rc = MPI_Test(&request_, &done, &st);
        if (rc != MPI_SUCCESS || done) break;
        if ((polls & 63) == 63) {
          if (NowSeconds() > deadline) {
            return Status::Unavailable(fmt::format(
                "{}: not complete after {} s (a peer is dead, stuck, or did not call it)", prefix_,
                timeout_s_));
          }
          std::this_thread::yield();
        }
      }
    }
    if (rc != MPI_SUCCESS) {
      return Status::Unavailable(fmt::format("{}: MPI error: {}", prefix_, MpiErrorString(rc)));
    }
    if (expect_count_ != SIZE_MAX) {  // a receive: the message must have the size asked for
      int got = 0;
      MPI_Get_count(&st, type_, &got);
      if (got < 0 || static_cast<size_t>(got) != expect_count_) {
        return Status::InvalidArgument(
            fmt::format("{}: the message has {} elements", prefix_, got));
      }
    }
    return Status::Ok();
  }

 private:
  MPI_Request request_;
  double timeout_s_;
  std::string prefix_;
  size_t expect_count_;
  MPI_Datatype type_;
};

}  // namespace

StatusOr<std::unique_ptr<MpiCommunicator>> MpiCommunicator::CreateWorld(int* argc, char*** argv,
                                                                        MpiOptions options) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  int provided = MPI_THREAD_SINGLE;
  bool owns = false;
  if (!initialized) {
    int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided);
    if (rc != MPI_SUCCESS) {
      return Status::Unavailable(fmt::format("MPI_Init_thread failed: {}", MpiErrorString(rc)));
    }
    owns = true;
  } else {
    MPI_Query_thread(&provided);
  }
  if (provided < MPI_THREAD_FUNNELED) {
    return Status::Unavailable(fmt::format(
        "MPI provides thread level {}; atoll needs at least MPI_THREAD_FUNNELED", provided));
  }
  MPI_Comm dup;
  // Errors of the duplication itself would be fatal under the default handler; return them.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  int rc = MPI_Comm_dup(MPI_COMM_WORLD, &dup);
  if (rc != MPI_SUCCESS) {
    return Status::Unavailable(
        fmt::format("MPI_Comm_dup(MPI_COMM_WORLD) failed: {}", MpiErrorString(rc)));
  }
  return std::unique_ptr<MpiCommunicator>(new MpiCommunicator(dup, provided, owns, options, ""));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, int thread_level, bool owns_mpi, MpiOptions options,
                                 std::string label_suffix)
    : comm_(comm), thread_level_(thread_level), owns_mpi_(owns_mpi), options_(options) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  label_ = fmt::format("rank {}{}", rank_, label_suffix);
  // Every rank constructs its communicators in the same order with the same options, so this
  // collective duplication matches across ranks.
  if (options_.collective_thread && thread_level_ == MPI_THREAD_MULTIPLE &&
      MPI_Comm_dup(comm_, &nb_comm_) == MPI_SUCCESS) {
    MPI_Comm_set_errhandler(nb_comm_, MPI_ERRORS_RETURN);
    worker_ = std::make_unique<CollectiveThread>();
  }
}

void MpiCommunicator::AbortJob(int code) {
  std::fflush(stdout);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; in case an implementation does
}

MpiCommunicator::~MpiCommunicator() {
  worker_.reset();  // finishes the queued collectives, joins
  if (MpiFinalized()) return;
  if (nb_comm_ != MPI_COMM_NULL) MPI_Comm_free(&nb_comm_);
  MPI_Comm_free(&comm_);
  if (owns_mpi_) MPI_Finalize();
}

Status MpiCommunicator::Check(CommOp op, size_t count, DType dtype, int peer, int tag) const {
  ATOLL_RETURN_IF_ERROR(CheckArgs(op, count, dtype, peer, tag));
  if (count > static_cast<size_t>(INT_MAX)) {
    return Status::InvalidArgument(fmt::format("{}: MPI counts are limited to {} elements",
                                               ErrorPrefix(op, count, dtype, peer, tag), INT_MAX));
  }
  return Status::Ok();
}

Status MpiCommunicator::FromMpi(int rc, CommOp op, size_t count, DType dtype, int peer,
                                int tag) const {
  if (rc == MPI_SUCCESS) return Status::Ok();
  int cls = 0;
  MPI_Error_class(rc, &cls);
  std::string msg = fmt::format("{}: MPI error: {}", ErrorPrefix(op, count, dtype, peer, tag),
                                MpiErrorString(rc));
  switch (cls) {
    case MPI_ERR_COUNT:
    case MPI_ERR_TYPE:
    case MPI_ERR_ROOT:
    case MPI_ERR_RANK:
    case MPI_ERR_TAG:
    case MPI_ERR_ARG:
    case MPI_ERR_BUFFER:
    case MPI_ERR_TRUNCATE:
      return Status::InvalidArgument(std::move(msg));
    default:
      return Status::Unavailable(std::move(msg));
  }
}

CommHandle MpiCommunicator::Started(int rc, MPI_Request request, CommOp op, size_t count,
                                    DType dtype, int peer, int tag) {
  if (rc != MPI_SUCCESS) return CommHandle::Done(FromMpi(rc, op, count, dtype, peer, tag));
  const size_t expect = op == CommOp::kRecv ? count : SIZE_MAX;
  return CommHandle(std::make_unique<RequestWait>(
      request, options_.timeout_s, ErrorPrefix(op, count, dtype, peer, tag), expect, ToMpi(dtype)));
}

CommHandle MpiCommunicator::OnThread(std::function<int()> op, CommOp kind, size_t count,
                                     DType dtype, int peer) {
  return worker_->Run([this, op = std::move(op), kind, count, dtype,
                       peer] { return FromMpi(op(), kind, count, dtype, peer); },
                      options_.timeout_s, ErrorPrefix(kind, count, dtype, peer));
}

// Backend-independent argument checks first: MPI's own messages for these are less specific.
#define ATOLL_MPI_CHECK(op, count, dtype, peer, tag) \
  do {                                               \
    Status _s = Check(op, count, dtype, peer, tag);  \
    if (!_s.ok()) return _s;                         \
  } while (0)

CommHandle MpiCommunicator::IAllReduce(void* data, size_t count, DType dtype) {
  Status s = Check(CommOp::kAllReduce, count, dtype);
  if (!s.ok()) return CommHandle::Done(s);
  if (worker_) {
    return OnThread(
        [=, this] {
          return MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), ToMpi(dtype), MPI_SUM,
                               nb_comm_);
        },
        CommOp::kAllReduce, count, dtype);
  }
  MPI_Request req;
  int rc = MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count), ToMpi(dtype), MPI_SUM, comm_,
                          &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kAllReduce, count, dtype);
}

CommHandle MpiCommunicator::IReduceScatter(const void* send, void* recv, size_t count,
                                           DType dtype) {
  Status s = Check(CommOp::kReduceScatter, count, dtype);
  if (!s.ok()) return CommHandle::Done(s);
  if (worker_) {
    return OnThread(
        [=, this] {
          return MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), ToMpi(dtype),
                                          MPI_SUM, nb_comm_);
        },
        CommOp::kReduceScatter, count, dtype);
  }
  MPI_Request req;
  int rc = MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), ToMpi(dtype), MPI_SUM,
                                     comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kReduceScatter, count, dtype);
}

CommHandle MpiCommunicator::IAllGather(const void* send, void* recv, size_t count, DType dtype) {
  Status s = Check(CommOp::kAllGather, count, dtype);
  if (!s.ok()) return CommHandle::Done(s);
  if (worker_) {
    return OnThread(
        [=, this] {
          return MPI_Allgather(send, static_cast<int>(count), ToMpi(dtype), recv,
                               static_cast<int>(count), ToMpi(dtype), nb_comm_);
        },
        CommOp::kAllGather, count, dtype);
  }
  MPI_Request req;
  int rc = MPI_Iallgather(send, static_cast<int>(count), ToMpi(dtype), recv,
                          static_cast<int>(count), ToMpi(dtype), comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kAllGather, count, dtype);
}

CommHandle MpiCommunicator::IBroadcast(void* data, size_t count, DType dtype, int root) {
  Status s = Check(CommOp::kBroadcast, count, dtype, root);
  if (!s.ok()) return CommHandle::Done(s);
  if (worker_) {
    return OnThread(
        [=, this] {
          return MPI_Bcast(data, static_cast<int>(count), ToMpi(dtype), root, nb_comm_);
        },
        CommOp::kBroadcast, count, dtype, root);
  }
  MPI_Request req;
  int rc = MPI_Ibcast(data, static_cast<int>(count), ToMpi(dtype), root, comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kBroadcast, count, dtype, root);
}

CommHandle MpiCommunicator::ISend(const void* data, size_t count, DType dtype, int dest, int tag) {
  Status s = Check(CommOp::kSend, count, dtype, dest, tag);
  if (!s.ok()) return CommHandle::Done(s);
  MPI_Request req;
  int rc = MPI_Isend(data, static_cast<int>(count), ToMpi(dtype), dest, tag, comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kSend, count, dtype, dest, tag);
}

CommHandle MpiCommunicator::IRecv(void* data, size_t count, DType dtype, int source, int tag) {
  Status s = Check(CommOp::kRecv, count, dtype, source, tag);
  if (!s.ok()) return CommHandle::Done(s);
  MPI_Request req;
  int rc = MPI_Irecv(data, static_cast<int>(count), ToMpi(dtype), source, tag, comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kRecv, count, dtype, source, tag);
}

CommHandle MpiCommunicator::IBarrier() {
  if (worker_) {
    return OnThread([this] { return MPI_Barrier(nb_comm_); }, CommOp::kBarrier, 0, DType::kByte);
  }
  MPI_Request req;
  int rc = MPI_Ibarrier(comm_, &req);
  // NOLINTNEXTLINE(clang-analyzer-optin.mpi.MPI-Checker)
  return Started(rc, req, CommOp::kBarrier, 0, DType::kByte);
}

Status MpiCommunicator::AllReduce(void* data, size_t count, DType dtype) {
  ATOLL_MPI_CHECK(CommOp::kAllReduce, count, dtype, -1, 0);
  return FromMpi(
      MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(count), ToMpi(dtype), MPI_SUM, comm_),
      CommOp::kAllReduce, count, dtype);
}

Status MpiCommunicator::ReduceScatter(const void* send, void* recv, size_t count, DType dtype) {
  ATOLL_MPI_CHECK(CommOp::kReduceScatter, count, dtype, -1, 0);
  return FromMpi(
      MPI_Reduce_scatter_block(send, recv, static_cast<int>(count), ToMpi(dtype), MPI_SUM, comm_),
      CommOp::kReduceScatter, count, dtype);
}

Status MpiCommunicator::AllGather(const void* send, void* recv, size_t count, DType dtype) {
  ATOLL_MPI_CHECK(CommOp::kAllGather, count, dtype, -1, 0);
  return FromMpi(MPI_Allgather(send, static_cast<int>(count), ToMpi(dtype), recv,
                               static_cast<int>(count), ToMpi(dtype), comm_),
                 CommOp::kAllGather, count, dtype);
}

Status MpiCommunicator::Broadcast(void* data, size_t count, DType dtype, int root) {
  ATOLL_MPI_CHECK(CommOp::kBroadcast, count, dtype, root, 0);
  return FromMpi(MPI_Bcast(data, static_cast<int>(count), ToMpi(dtype), root, comm_),
                 CommOp::kBroadcast, count, dtype, root);
}

Status MpiCommunicator::Send(const void* data, size_t count, DType dtype, int dest, int tag) {
  ATOLL_MPI_CHECK(CommOp::kSend, count, dtype, dest, tag);
  return FromMpi(MPI_Send(data, static_cast<int>(count), ToMpi(dtype), dest, tag, comm_),
                 CommOp::kSend, count, dtype, dest, tag);
}

Status MpiCommunicator::Recv(void* data, size_t count, DType dtype, int source, int tag) {
  ATOLL_MPI_CHECK(CommOp::kRecv, count, dtype, source, tag);
  MPI_Status st;
  int rc = MPI_Recv(data, static_cast<int>(count), ToMpi(dtype), source, tag, comm_, &st);
  ATOLL_RETURN_IF_ERROR(FromMpi(rc, CommOp::kRecv, count, dtype, source, tag));
  int got = 0;
  MPI_Get_count(&st, ToMpi(dtype), &got);
  if (got < 0 || static_cast<size_t>(got) != count) {
    return Status::InvalidArgument(
        fmt::format("{}: the message has {} elements",
                    ErrorPrefix(CommOp::kRecv, count, dtype, source, tag), got));
  }
  return Status::Ok();
}

Status MpiCommunicator::Barrier() {
  return FromMpi(MPI_Barrier(comm_), CommOp::kBarrier, 0, DType::kByte);
}

StatusOr<std::unique_ptr<Communicator>> MpiCommunicator::Split(int color, int key) {
  if (color < 0 && color != kNoGroup) {
    return Status::InvalidArgument(
        fmt::format("{}: split: color {} must be >= 0 or kNoGroup", label_, color));
  }
  MPI_Comm sub;
  int rc = MPI_Comm_split(comm_, color == kNoGroup ? MPI_UNDEFINED : color, key, &sub);
  if (rc != MPI_SUCCESS) {
    return Status::Unavailable(fmt::format("{}: split: MPI error: {}", label_, MpiErrorString(rc)));
  }
  if (sub == MPI_COMM_NULL) return std::unique_ptr<Communicator>();
  return std::unique_ptr<Communicator>(new MpiCommunicator(
      sub, thread_level_, false, options_, fmt::format(" of group {} (parent {})", color, label_)));
}

}  // namespace atl
