// CollectiveThread: runs a rank's non-blocking collectives, in the order they were started, on one
// background thread that issues the *blocking* backend calls.
//
// Why: OpenMPI's non-blocking collectives (libnbc) run a generic schedule that progresses only
// inside MPI calls, and reach 0.2-0.55 of MPI_Allreduce's bus bandwidth on shared memory
// (docs/PERFORMANCE.md). A thread that calls MPI_Allreduce gets the tuned algorithm and real
// progress while the caller computes (what Horovod and PyTorch's ProcessGroupMPI do). It needs
// MPI_THREAD_MULTIPLE and its own duplicated communicator, so that its collectives never
// interleave with the caller's blocking ones.
//
// Ordering: one FIFO queue, so every rank issues the queued collectives in its own start order,
// which (as for any collective) must be the same on all ranks.
//
// Thread-safety: Run() may be called from one thread at a time; handles waited on from any thread.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "comm/communicator.h"

namespace atl {

class CollectiveThread {
 public:
  CollectiveThread() = default;
  // Runs what is queued, then joins.
  ~CollectiveThread();
  CollectiveThread(const CollectiveThread&) = delete;
  CollectiveThread& operator=(const CollectiveThread&) = delete;

  // Queues `op`; the handle's Wait() returns its status, or after `timeout_s` (when > 0) an error
  // "<prefix>: not complete after T s ...". The thread starts on the first call.
  CommHandle Run(std::function<Status()> op, double timeout_s, std::string prefix);

 private:
  struct Task;
  class TaskWait;
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::shared_ptr<Task>> queue_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace atl
