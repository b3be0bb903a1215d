// NCCL backend: the ranks of one site, each driving its own GPU, exchanging DEVICE memory directly
// (NVLink, PCIe or the network, as NCCL finds them) instead of staging through host memory.
//
// Every buffer passed to it is device memory of the process's GPU (kernels/cuda/runtime.h); its
// operations are queued on the process's stream, in order with the kernels, so a buffer written
// by a kernel is read after that kernel, and a kernel issued after Wait() reads the result.
// device_memory() is true, which is how the layers above tell it from the host backends.
//
// Made from a bootstrap Communicator (MPI, say) of the same ranks: rank 0 draws NCCL's unique id,
// the bootstrap broadcasts it, and every rank joins. Split splits the bootstrap and makes a new
// NCCL communicator over each part.
//
// Differences from the Communicator contract, from NCCL:
//   - Send and Recv match by (source, destination) in order: NCCL has no tags, so a tag other
//     than 0, or a message to oneself, is refused (InvalidArgument). A send waits for its receive
//     on the stream, so a pair must be ordered (one sends while the other receives).
//   - Timeouts: Wait() polls the stream and, after `timeout_s`, aborts the NCCL communicator at
//     once (ncclCommAbort, which ends its kernels) and returns Unavailable naming the operation;
//     so does an asynchronous NCCL error. The communicator is unusable after that. Joining is on
//     a non-blocking communicator (config.blocking = 0), polled under the same timeout, so a
//     peer that never joins is an Unavailable, not a hang inside NCCL; the operations then run on
//     a blocking communicator split off it once every rank is there (a non-blocking one returns
//     ncclInProgress from every operation: each would wait for NCCL's own thread). Peers are
//     connected while joining (NCCL_RUNTIME_CONNECT=0 unless the user set it; NCCL would
//     otherwise connect them inside the first operation on each path, where a missing peer
//     blocks), so an operation's missing peer is a kernel that Wait() times out and aborts.
//     Joining may take up to twice the timeout (the join, then the split, each waited for).
//   - A rank that cannot set up (no libnccl.so.2, no GPU) makes every rank's call fail alike.
//   - libnccl.so.2 is loaded when the first communicator is made (dlopen), so programs that
//     never make one start without it.
//   - Sums are in NCCL's order (ring or tree, chosen by NCCL from the group's size and topology):
//     bitwise-repeatable on one machine with one NCCL version and the same NCCL_* settings, not
//     the MPI backend's bits.
//
// Built with the CUDA backend only (ATOLL_HAVE_CUDA); the emulated build (kernels/cuda/emu/)
// links an emulated NCCL, so several processes with emulated GPUs test it without a GPU.
//
// Thread-safety: as Communicator (one thread per process drives the GPU).
#pragma once

#include <memory>

#include "comm/communicator.h"
#include "core/status.h"

namespace atl {

// Collective over `bootstrap` (every rank of it calls, in the same order as its other
// collectives). The process's GPU must be selected (kernels::cuda::UseDevice) or selectable
// (DefaultOrdinal). Errors: Unavailable when NCCL cannot join (two ranks on one GPU, no GPU).
StatusOr<std::unique_ptr<Communicator>> MakeNcclCommunicator(Communicator& bootstrap,
                                                             double timeout_s = 300.0);

}  // namespace atl
