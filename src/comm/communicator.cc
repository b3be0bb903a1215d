#include "comm/communicator.h"

namespace atl {

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32:
      return 4;
    case DType::kFloat64:
      return 8;
    case DType::kInt32:
      return 4;
    case DType::kInt64:
      return 8;
    case DType::kByte:
      return 1;
  }
  return 1;
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32:
      return "float32";
    case DType::kFloat64:
      return "float64";
    case DType::kInt32:
      return "int32";
    case DType::kInt64:
      return "int64";
    case DType::kByte:
      return "byte";
  }
  return "?";
}

bool DTypeIsReducible(DType t) { return t != DType::kByte; }

namespace {
template <class T>
void AddAs(void* acc, const void* add, size_t count) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(add);
  for (size_t i = 0; i < count; ++i) a[i] += b[i];
}
}  // namespace

void AddInto(DType dtype, void* acc, const void* add, size_t count) {
  switch (dtype) {
    case DType::kFloat32:
      return AddAs<float>(acc, add, count);
    case DType::kFloat64:
      return AddAs<double>(acc, add, count);
    case DType::kInt32:
      return AddAs<int32_t>(acc, add, count);
    case DType::kInt64:
      return AddAs<int64_t>(acc, add, count);
    case DType::kByte:
      return;  // not reducible: rejected by CheckArgs
  }
}

const char* CommOpName(CommOp op) {
  switch (op) {
    case CommOp::kAllReduce:
      return "all_reduce";
    case CommOp::kReduceScatter:
      return "reduce_scatter";
    case CommOp::kAllGather:
      return "all_gather";
    case CommOp::kBroadcast:
      return "broadcast";
    case CommOp::kSend:
      return "send";
    case CommOp::kRecv:
      return "recv";
    case CommOp::kBarrier:
      return "barrier";
    case CommOp::kSplit:
      return "split";
  }
  return "?";
}

std::string DescribeOp(CommOp op, size_t count, DType dtype, int peer, int tag) {
  std::string s = CommOpName(op);
  if (op == CommOp::kBarrier || op == CommOp::kSplit) return s;
  s += fmt::format(" of {} {}", count, DTypeName(dtype));
  switch (op) {
    case CommOp::kBroadcast:
      s += fmt::format(" from rank {}", peer);
      break;
    case CommOp::kSend:
      s += fmt::format(" to rank {} (tag {})", peer, tag);
      break;
    case CommOp::kRecv:
      s += fmt::format(" from rank {} (tag {})", peer, tag);
      break;
    default:
      break;
  }
  return s;
}

CommHandle CommHandle::Done(Status s) {
  CommHandle h;
  h.status_ = std::move(s);
  return h;
}

CommHandle& CommHandle::operator=(CommHandle&& other) noexcept {
  if (this != &other) {
    if (pending_) (void)pending_->Wait();
    pending_ = std::move(other.pending_);
    status_ = std::move(other.status_);
  }
  return *this;
}

CommHandle::~CommHandle() {
  if (pending_) (void)pending_->Wait();
}

Status CommHandle::Wait() {
  if (pending_) {
    status_ = pending_->Wait();
    pending_.reset();
  }
  return status_;
}

std::string Communicator::ErrorPrefix(CommOp op, size_t count, DType dtype, int peer,
                                      int tag) const {
  return fmt::format("{}: {}", label(), DescribeOp(op, count, dtype, peer, tag));
}

Status Communicator::CheckArgs(CommOp op, size_t count, DType dtype, int peer, int tag) const {
  const bool has_peer = op == CommOp::kBroadcast || op == CommOp::kSend || op == CommOp::kRecv;
  if (has_peer && (peer < 0 || peer >= size())) {
    return Status::InvalidArgument(fmt::format(
        "{}: {} {} is not a rank of this group (size {})", ErrorPrefix(op, count, dtype, peer, tag),
        op == CommOp::kBroadcast ? "root" : "peer", peer, size()));
  }
  if ((op == CommOp::kSend || op == CommOp::kRecv) && tag < 0) {
    return Status::InvalidArgument(
        fmt::format("{}: tag must be >= 0", ErrorPrefix(op, count, dtype, peer, tag)));
  }
  const bool reduces = op == CommOp::kAllReduce || op == CommOp::kReduceScatter;
  if (reduces && !DTypeIsReducible(dtype)) {
    return Status::InvalidArgument(fmt::format("{}: sum is not defined for {}",
                                               ErrorPrefix(op, count, dtype), DTypeName(dtype)));
  }
  return Status::Ok();
}

Status Communicator::CheckBlocks(CommOp op, size_t big, size_t small, DType dtype) const {
  if (big != small * static_cast<size_t>(size())) {
    return Status::InvalidArgument(fmt::format(
        "{}: the full buffer has {} elements, expected {} ranks x {} = {}",
        ErrorPrefix(op, small, dtype), big, size(), small, small * static_cast<size_t>(size())));
  }
  return Status::Ok();
}

}  // namespace atl
