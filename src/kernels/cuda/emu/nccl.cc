// The emulated NCCL of emu/include/nccl.h: collectives among processes through files (the
// header says how).
#include "nccl.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/emu/memory.h"

struct ncclComm {
  std::string dir;
  int nranks = 0, rank = 0;
  bool ready = false;  // every rank's hello seen (ncclCommInitRank[Config], ncclCommSplit)
  bool blocking = true;
  std::chrono::steady_clock::time_point joining;  // when this rank began to join
  // A split of this (non-blocking) communicator going on, as NCCL runs it: the new communicator
  // is the caller's (*split_out) once this one's state says the split is done.
  ncclComm* split_child = nullptr;
  ncclComm** split_out = nullptr;
  uint64_t seq = 0;                   // collectives so far
  std::map<int, uint64_t> sent, got;  // messages so far, per peer
  std::string last_error;
};

namespace {

namespace fs = std::filesystem;

size_t SizeOf(ncclDataType_t t) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
  }
  return 0;
}

template <class T>
void AddTyped(void* acc, const void* add, size_t n) {
  T* a = static_cast<T*>(acc);
  const T* b = static_cast<const T*>(add);
  for (size_t i = 0; i < n; ++i) a[i] += b[i];
}

// acc[i] += add[i] over n elements of t (the callers refuse float16 first).
void Add(ncclDataType_t t, void* acc, const void* add, size_t n) {
  switch (t) {
    case ncclInt8:
      return AddTyped<int8_t>(acc, add, n);
    case ncclUint8:
      return AddTyped<uint8_t>(acc, add, n);
    case ncclInt32:
      return AddTyped<int32_t>(acc, add, n);
    case ncclUint32:
      return AddTyped<uint32_t>(acc, add, n);
    case ncclInt64:
      return AddTyped<int64_t>(acc, add, n);
    case ncclUint64:
      return AddTyped<uint64_t>(acc, add, n);
    case ncclFloat32:
      return AddTyped<float>(acc, add, n);
    case ncclFloat64:
      return AddTyped<double>(acc, add, n);
    case ncclFloat16:
      return;
  }
}

double TimeoutSeconds() {
  const char* s = std::getenv("ATOLL_EMU_NCCL_TIMEOUT_S");
  return s != nullptr && std::atof(s) > 0 ? std::atof(s) : 60.0;
}

ncclResult_t Fail(ncclComm* c, ncclResult_t r, const std::string& why) {
  c->last_error = "emulated NCCL rank " + std::to_string(c->rank) + ": " + why;
  return r;
}

// Writes bytes to path whole: a temporary name, then a rename.
bool Post(const std::string& path, const void* data, size_t bytes) {
  const std::string tmp = path + ".tmp";
  std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), std::streamsize(bytes));
  f.close();
  return f.good() && std::rename(tmp.c_str(), path.c_str()) == 0;
}

// Waits for path (until the timeout), then reads it whole.
bool Take(const std::string& path, std::vector<char>* out) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(TimeoutSeconds());
  while (!fs::exists(path)) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  std::ifstream f(path, std::ios::binary);
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

std::string Part(const ncclComm* c, uint64_t seq, int rank) {
  return c->dir + "/c" + std::to_string(seq) + "." + std::to_string(rank);
}

// One collective: posts `mine`, gathers every rank's part in rank order into *parts. Then this
// rank's part of the collective before is no longer needed by anyone (every rank posting this one
// has finished that one), so it goes.
ncclResult_t Exchange(ncclComm* c, const void* mine, size_t bytes,
                      std::vector<std::vector<char>>* parts) {
  const uint64_t seq = c->seq++;
  if (!Post(Part(c, seq, c->rank), mine, bytes))
    return Fail(c, ncclSystemError, "cannot write " + Part(c, seq, c->rank));
  parts->assign(size_t(c->nranks), {});
  for (int r = 0; r < c->nranks; ++r)
    if (!Take(Part(c, seq, r), &(*parts)[size_t(r)]))
      return Fail(c, ncclRemoteError,
                  "rank " + std::to_string(r) + " did not join collective " + std::to_string(seq) +
                      " within " + std::to_string(TimeoutSeconds()) + " s");
  if (seq > 0) fs::remove(Part(c, seq - 1, c->rank));
  return ncclSuccess;
}

// NCCL's rule for a non-blocking communicator: no call before it has joined (its state
// ncclSuccess): a caller that does not wait is caught.
ncclResult_t CheckJoined(ncclComm* c) {
  if (c == nullptr) return ncclInvalidArgument;
  if (!c->ready)
    return Fail(c, ncclInvalidUsage, "called before the communicator finished joining");
  if (c->split_child != nullptr)
    return Fail(c, ncclInvalidUsage, "called before the communicator's split finished");
  return ncclSuccess;
}

ncclResult_t CheckDevice(ncclComm* c, const void* p, size_t bytes, const char* what) {
  if (bytes == 0 || atl::cuda_emu::IsDevice(p, bytes)) return ncclSuccess;
  return Fail(c, ncclInvalidArgument,
              std::string(what) + " is not device memory (" + std::to_string(bytes) + " bytes)");
}

#define EMU_NCCL_TRY(call)            \
  do {                                \
    const ncclResult_t r_ = (call);   \
    if (r_ != ncclSuccess) return r_; \
  } while (0)

}  // namespace

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  std::random_device rd;
  const uint64_t a = (uint64_t(rd()) << 32) | rd(), b = (uint64_t(rd()) << 32) | rd();
  std::memset(id->internal, 0, sizeof(id->internal));
  std::snprintf(id->internal, sizeof(id->internal), "atoll-emu-nccl-%d-%016llx%016llx",
                int(getpid()), static_cast<unsigned long long>(a),
                static_cast<unsigned long long>(b));
  return ncclSuccess;
}

namespace {

// Whether every rank has joined c (posted its hello): ncclSuccess, ncclInProgress, or
// ncclRemoteError after the timeout since this rank began to join.
ncclResult_t Joined(ncclComm* c);

// A split going on from c: done when its new communicator has joined, which the caller then gets.
ncclResult_t SplitDone(ncclComm* c) {
  ncclComm* child = c->split_child;
  const ncclResult_t r = Joined(child);
  if (r == ncclInProgress) return r;
  *c->split_out = child;  // also a failed one: the caller aborts it
  c->split_child = nullptr;
  c->split_out = nullptr;
  return r == ncclSuccess ? r : Fail(c, r, "the split's communicator: " + child->last_error);
}

ncclResult_t Joined(ncclComm* c) {
  if (c->ready) return c->split_child != nullptr ? SplitDone(c) : ncclSuccess;
  int here = 0;
  for (int r = 0; r < c->nranks; ++r) here += fs::exists(c->dir + "/hello." + std::to_string(r));
  if (here == c->nranks) {
    c->ready = true;
    return ncclSuccess;
  }
  if (std::chrono::steady_clock::now() - c->joining >
      std::chrono::duration<double>(TimeoutSeconds()))
    return Fail(c, ncclRemoteError,
                std::to_string(c->nranks - here) + " rank(s) did not join within " +
                    std::to_string(TimeoutSeconds()) + " s");
  return ncclInProgress;
}

// The fault injection: whether `rank` never completes joining (variable: which rank).
bool Stuck(const char* variable, int rank) {
  const char* s = std::getenv(variable);
  return s != nullptr && *s != 0 && std::atoi(s) == rank;
}

}  // namespace

namespace {

// A new communicator over `dir` that starts to join: posts its hello (unless stuck by the fault).
// Null when the directory cannot be written.
ncclComm* NewComm(const std::string& dir, int nranks, int rank, bool blocking, bool stuck) {
  auto* c = new ncclComm;
  c->dir = dir;
  c->nranks = nranks;
  c->rank = rank;
  c->blocking = blocking;
  c->joining = std::chrono::steady_clock::now();
  std::error_code ec;
  fs::create_directories(c->dir, ec);
  if (ec || (!stuck && !Post(c->dir + "/hello." + std::to_string(rank), "", 0))) {
    delete c;
    return nullptr;
  }
  return c;
}

// Waits until c has joined (or failed to).
ncclResult_t AwaitJoined(ncclComm* c) {
  for (;;) {
    const ncclResult_t r = Joined(c);
    if (r != ncclInProgress) return r;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// A config's blocking: unset, NCCL's default (1); no config, `inherited`.
bool Blocking(const ncclConfig_t* config, bool inherited) {
  if (config == nullptr) return inherited;
  return config->blocking == NCCL_CONFIG_UNDEF_INT || config->blocking != 0;
}

}  // namespace

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  if (nranks < 1 || rank < 0 || rank >= nranks) return ncclInvalidArgument;
  if (config != nullptr && config->magic != 0xcafebeef) return ncclInvalidArgument;
  id.internal[NCCL_UNIQUE_ID_BYTES - 1] = 0;
  if (std::strncmp(id.internal, "atoll-emu-nccl-", 15) != 0) return ncclInvalidArgument;
  const char* tmp = std::getenv("TMPDIR");
  ncclComm* c =
      NewComm(std::string(tmp != nullptr && *tmp ? tmp : "/tmp") + "/" + id.internal, nranks, rank,
              Blocking(config, true), Stuck("ATOLL_EMU_NCCL_STUCK_INIT_RANK", rank));
  if (c == nullptr) return ncclSystemError;
  *comm = c;
  if (!c->blocking) return Joined(c) == ncclSuccess ? ncclSuccess : ncclInProgress;
  return AwaitJoined(c);
}

ncclResult_t ncclCommSplit(ncclComm_t c, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  EMU_NCCL_TRY(CheckJoined(c));
  if (config != nullptr && config->magic != 0xcafebeef) return ncclInvalidArgument;
  if (color < 0 && color != NCCL_SPLIT_NOCOLOR) return Fail(c, ncclInvalidArgument, "color < 0");
  const int32_t mine[2] = {color, key};
  std::vector<std::vector<char>> parts;
  EMU_NCCL_TRY(Exchange(c, mine, sizeof(mine), &parts));
  const uint64_t seq = c->seq - 1;  // the exchange's: names the new communicators
  *newcomm = nullptr;
  if (color == NCCL_SPLIT_NOCOLOR) return ncclSuccess;
  std::vector<std::pair<int32_t, int>> members;  // (key, rank in c) of the ranks of my color
  for (int r = 0; r < c->nranks; ++r) {
    int32_t theirs[2];
    if (parts[size_t(r)].size() != sizeof(theirs)) return Fail(c, ncclInvalidUsage, "split");
    std::memcpy(theirs, parts[size_t(r)].data(), sizeof(theirs));
    if (theirs[0] == color) members.emplace_back(theirs[1], r);
  }
  std::sort(members.begin(), members.end());
  const int rank = int(std::find(members.begin(), members.end(), std::make_pair(key, c->rank)) -
                       members.begin());
  // Beside c's directory, not in it: c may be destroyed first.
  ncclComm* child = NewComm(c->dir + ".split" + std::to_string(seq) + "." + std::to_string(color),
                            int(members.size()), rank, Blocking(config, c->blocking),
                            Stuck("ATOLL_EMU_NCCL_STUCK_SPLIT_RANK", c->rank));
  if (child == nullptr) return Fail(c, ncclSystemError, "cannot write the split's directory");
  if (c->blocking) {  // as NCCL: the split is the parent's job, blocking or not as it is
    *newcomm = child;
    return AwaitJoined(child);
  }
  c->split_child = child;  // *newcomm is set when c's state says the split is done
  c->split_out = newcomm;
  return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

// Says goodbye; the last rank to leave removes the directory (every rank has finished every
// collective by then, reads included).
ncclResult_t ncclCommDestroy(ncclComm_t c) {
  if (c == nullptr) return ncclSuccess;
  if (c->split_child != nullptr) *c->split_out = c->split_child;  // as NCCL: the caller's now
  const std::string bye = c->dir + "/bye." + std::to_string(c->rank);
  Post(bye, "", 0);
  int gone = 0;
  for (int r = 0; r < c->nranks; ++r) gone += fs::exists(c->dir + "/bye." + std::to_string(r));
  if (gone == c->nranks) {
    std::error_code ec;
    fs::remove_all(c->dir, ec);
  }
  delete c;
  return ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t c) { return ncclCommDestroy(c); }

// Joining (non-blocking communicators) is the one asynchronous thing: everything else runs when
// called.
ncclResult_t ncclCommGetAsyncError(ncclComm_t c, ncclResult_t* async_error) {
  if (c == nullptr) return ncclInvalidArgument;
  *async_error = Joined(c);
  return ncclSuccess;
}

const char* ncclGetErrorString(ncclResult_t r) {
  switch (r) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error";
    case ncclSystemError:
      return "unhandled system error";
    case ncclInternalError:
      return "internal error";
    case ncclInvalidArgument:
      return "invalid argument";
    case ncclInvalidUsage:
      return "invalid usage";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
  }
  return "unknown result code";
}

const char* ncclGetLastError(ncclComm_t c) { return c != nullptr ? c->last_error.c_str() : ""; }

ncclResult_t ncclAllReduce(const void* send, void* recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t bytes = count * SizeOf(t);
  if (op != ncclSum || t == ncclFloat16) return Fail(c, ncclInvalidArgument, "only sums");
  EMU_NCCL_TRY(CheckDevice(c, send, bytes, "sendbuff"));
  EMU_NCCL_TRY(CheckDevice(c, recv, bytes, "recvbuff"));
  atl::cuda_emu::DeviceAccess open{send, recv};
  std::vector<std::vector<char>> parts;
  EMU_NCCL_TRY(Exchange(c, send, bytes, &parts));
  for (const auto& p : parts)
    if (p.size() != bytes) return Fail(c, ncclInvalidUsage, "count mismatch");
  std::vector<char> sum = parts[0];
  for (int r = 1; r < c->nranks; ++r) Add(t, sum.data(), parts[size_t(r)].data(), count);
  if (bytes > 0) std::memcpy(recv, sum.data(), bytes);
  return ncclSuccess;
}

ncclResult_t ncclReduceScatter(const void* send, void* recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t c, cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t block = recvcount * SizeOf(t), bytes = block * size_t(c->nranks);
  if (op != ncclSum || t == ncclFloat16) return Fail(c, ncclInvalidArgument, "only sums");
  EMU_NCCL_TRY(CheckDevice(c, send, bytes, "sendbuff"));
  EMU_NCCL_TRY(CheckDevice(c, recv, block, "recvbuff"));
  atl::cuda_emu::DeviceAccess open{send, recv};
  std::vector<std::vector<char>> parts;
  EMU_NCCL_TRY(Exchange(c, send, bytes, &parts));
  for (const auto& p : parts)
    if (p.size() != bytes) return Fail(c, ncclInvalidUsage, "count mismatch");
  std::vector<char> sum(parts[0].begin() + std::ptrdiff_t(block) * c->rank,
                        parts[0].begin() + std::ptrdiff_t(block) * (c->rank + 1));
  for (int r = 1; r < c->nranks; ++r)
    Add(t, sum.data(), parts[size_t(r)].data() + block * size_t(c->rank), recvcount);
  if (block > 0) std::memcpy(recv, sum.data(), block);
  return ncclSuccess;
}

ncclResult_t ncclAllGather(const void* send, void* recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t c, cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t block = sendcount * SizeOf(t);
  EMU_NCCL_TRY(CheckDevice(c, send, block, "sendbuff"));
  EMU_NCCL_TRY(CheckDevice(c, recv, block * size_t(c->nranks), "recvbuff"));
  atl::cuda_emu::DeviceAccess open{send, recv};
  std::vector<std::vector<char>> parts;
  EMU_NCCL_TRY(Exchange(c, send, block, &parts));
  for (int r = 0; r < c->nranks; ++r) {
    if (parts[size_t(r)].size() != block) return Fail(c, ncclInvalidUsage, "count mismatch");
    if (block > 0)
      std::memcpy(static_cast<char*>(recv) + block * size_t(r), parts[size_t(r)].data(), block);
  }
  return ncclSuccess;
}

ncclResult_t ncclBroadcast(const void* send, void* recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t c, cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t bytes = count * SizeOf(t);
  if (root < 0 || root >= c->nranks) return Fail(c, ncclInvalidArgument, "root out of range");
  if (c->rank == root) EMU_NCCL_TRY(CheckDevice(c, send, bytes, "sendbuff"));
  EMU_NCCL_TRY(CheckDevice(c, recv, bytes, "recvbuff"));
  atl::cuda_emu::DeviceAccess open{send, recv};
  std::vector<std::vector<char>> parts;
  EMU_NCCL_TRY(Exchange(c, c->rank == root ? send : nullptr, c->rank == root ? bytes : 0, &parts));
  if (parts[size_t(root)].size() != bytes) return Fail(c, ncclInvalidUsage, "count mismatch");
  if (bytes > 0) std::memcpy(recv, parts[size_t(root)].data(), bytes);
  return ncclSuccess;
}

ncclResult_t ncclSend(const void* send, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t bytes = count * SizeOf(t);
  if (peer < 0 || peer >= c->nranks) return Fail(c, ncclInvalidArgument, "peer out of range");
  EMU_NCCL_TRY(CheckDevice(c, send, bytes, "sendbuff"));
  atl::cuda_emu::DeviceAccess open{send};
  const std::string path = c->dir + "/p" + std::to_string(c->rank) + "-" + std::to_string(peer) +
                           "." + std::to_string(c->sent[peer]++);
  if (!Post(path, send, bytes)) return Fail(c, ncclSystemError, "cannot write " + path);
  return ncclSuccess;
}

ncclResult_t ncclRecv(void* recv, size_t count, ncclDataType_t t, int peer, ncclComm_t c,
                      cudaStream_t) {
  EMU_NCCL_TRY(CheckJoined(c));
  const size_t bytes = count * SizeOf(t);
  if (peer < 0 || peer >= c->nranks) return Fail(c, ncclInvalidArgument, "peer out of range");
  EMU_NCCL_TRY(CheckDevice(c, recv, bytes, "recvbuff"));
  atl::cuda_emu::DeviceAccess open{recv};
  const std::string path = c->dir + "/p" + std::to_string(peer) + "-" + std::to_string(c->rank) +
                           "." + std::to_string(c->got[peer]++);
  std::vector<char> msg;
  if (!Take(path, &msg))
    return Fail(c, ncclRemoteError,
                "rank " + std::to_string(peer) + " sent nothing within " +
                    std::to_string(TimeoutSeconds()) + " s");
  fs::remove(path);
  if (msg.size() != bytes)
    return Fail(
        c, ncclInvalidUsage,
        "received " + std::to_string(msg.size()) + " bytes, expected " + std::to_string(bytes));
  if (bytes > 0) std::memcpy(recv, msg.data(), bytes);
  return ncclSuccess;
}

ncclResult_t ncclGroupStart() { return ncclSuccess; }
ncclResult_t ncclGroupEnd() { return ncclSuccess; }
