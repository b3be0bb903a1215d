// The CUDA emulator's stand-in for NCCL's nccl.h: the part of the API comm/nccl.cc calls, for
// ranks that are separate processes each with its own emulated GPU (emu/nccl.cc). Only the
// emulated build sees this file.
//
// How it works: a communicator is a directory named by its unique id (under $TMPDIR, else /tmp);
// a rank's part of a collective is a file there, written whole (a temporary name, then a rename),
// and the rank waits until every rank's file of that collective is there, then combines them in
// rank order (so sums are in one order on every rank). A send is a file the receiver waits for,
// reads and removes. Everything runs when called (the emulator has no asynchrony), so a group
// (ncclGroupStart/End) needs no queue: a send never blocks. A rank that never arrives makes the
// others' call fail after ATOLL_EMU_NCCL_TIMEOUT_S seconds (default 60) with ncclRemoteError and
// ncclGetLastError saying who; buffers must be device memory (a host pointer fails with
// ncclInvalidArgument, as it would fail NCCL's kernels on a GPU).
//
// Joining: every rank's ncclCommInitRank[Config] posts a hello, and the communicator is ready when
// every rank's is there. Blocking (the default): the call waits for that (failing after the
// timeout as above). Non-blocking (config.blocking = 0, as NCCL): the call returns ncclInProgress
// and ncclCommGetAsyncError says ncclInProgress until the communicator is ready (then ncclSuccess;
// ncclRemoteError after the timeout). Fault injection: ATOLL_EMU_NCCL_STUCK_INIT_RANK=r makes rank
// r's joining never complete (it posts no hello), as a rank whose GPU hangs in ncclCommInitRank;
// ATOLL_EMU_NCCL_STUCK_SPLIT_RANK=r (r: the rank in the communicator split) the same for the
// communicators ncclCommSplit makes.
#pragma once

#include <cstddef>

#include "cuda_runtime.h"

#define NCCL_MAJOR 2
#define NCCL_MINOR 28
#define NCCL_PATCH 0

enum ncclResult_t {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};
enum ncclDataType_t {
  ncclInt8 = 0,
  ncclUint8 = 1,
  ncclInt32 = 2,
  ncclUint32 = 3,
  ncclInt64 = 4,
  ncclUint64 = 5,
  ncclFloat16 = 6,
  ncclFloat32 = 7,
  ncclFloat64 = 8,
  ncclFloat = ncclFloat32,
  ncclDouble = ncclFloat64,
};
enum ncclRedOp_t { ncclSum = 0 };

constexpr int NCCL_UNIQUE_ID_BYTES = 128;
struct ncclUniqueId {
  char internal[NCCL_UNIQUE_ID_BYTES];
};
struct ncclComm;
using ncclComm_t = ncclComm*;

// The fields comm/nccl/ sets, then NCCL's own (unused here), in NCCL's order.
struct ncclConfig_t {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
};
#define NCCL_CONFIG_UNDEF_INT (-2147483647 - 1)
#define NCCL_CONFIG_INITIALIZER \
  { sizeof(ncclConfig_t), 0xcafebeef, 22800, NCCL_CONFIG_UNDEF_INT }

ncclResult_t ncclGetUniqueId(ncclUniqueId* id);
ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank);
ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config);
#define NCCL_SPLIT_NOCOLOR (-1)
// Collective over comm (joined): the ranks of one color make a new communicator, ranked by key
// (then by their rank in comm), which joins as ncclCommInitRankConfig does (config null: comm's
// blocking); NCCL_SPLIT_NOCOLOR gives null.
ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config);
ncclResult_t ncclCommDestroy(ncclComm_t comm);
ncclResult_t ncclCommAbort(ncclComm_t comm);
ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error);
const char* ncclGetErrorString(ncclResult_t result);
const char* ncclGetLastError(ncclComm_t comm);

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream);
ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream);
ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream);
ncclResult_t ncclGroupStart();
ncclResult_t ncclGroupEnd();
