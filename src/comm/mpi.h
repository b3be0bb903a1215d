// MPI backend (OpenMPI): the ranks of one site as MPI processes, started by mpirun or srun.
//
// Each MpiCommunicator owns a duplicate of its MPI communicator (so our traffic never matches a
// library's), with the MPI_ERRORS_RETURN error handler: an MPI failure becomes a Status carrying
// MPI's error string, the rank and the operation, instead of MPI's default abort. Blocking calls
// go straight to the blocking MPI collective (MPI_Allreduce, ...), so the wrapper costs nothing
// measurable (bench/comm/allreduce_bench.cc); non-blocking ones use MPI_Iallreduce and friends.
//
// Timeouts: MPI has no timeouts of its own. Wait() on a non-blocking handle polls MPI_Test and
// gives up after `timeout_s` (when > 0) with an error naming the operation; the operation itself
// cannot be cancelled, so after such an error the only safe move is to report it and exit. Blocking
// calls rely on mpirun noticing a dead process (it then kills the job) rather than on a timeout.
//
// Thread level: MPI_Init_thread asks for MPI_THREAD_MULTIPLE and accepts MPI_THREAD_FUNNELED or
// better; with less than MULTIPLE, only the thread that created the world may call into MPI. With
// MULTIPLE, non-blocking collectives run as blocking calls on a background thread (MpiOptions).
//
// Thread-safety: as Communicator; see the thread level above.
#pragma once

#include <mpi.h>

#include <memory>

#include "comm/collective_thread.h"
#include "comm/communicator.h"

namespace atl {

struct MpiOptions {
  // Wait() on a non-blocking handle gives up after this many seconds; <= 0 waits forever.
  double timeout_s = 60.0;
  // With MPI_THREAD_MULTIPLE, run non-blocking collectives as blocking MPI calls on a background
  // thread (comm/collective_thread.h) instead of MPI_Iallreduce & co. (OpenMPI's libnbc, 2-5x
  // slower on shared memory). Without MULTIPLE, or when false, the MPI_I* calls are used.
  bool collective_thread = true;
};

class MpiCommunicator final : public Communicator {
 public:
  // The world (MPI_COMM_WORLD, duplicated). Initializes MPI when nobody has; the world that
  // initialized MPI finalizes it when destroyed.
  // REQUIRES: communicators obtained from Split() are destroyed before the world.
  static StatusOr<std::unique_ptr<MpiCommunicator>> CreateWorld(int* argc, char*** argv,
                                                                MpiOptions options = {});
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string label() const override { return label_; }
  // MPI_THREAD_FUNNELED, _SERIALIZED or _MULTIPLE, as MPI granted it.
  int thread_level() const { return thread_level_; }
  // The underlying (duplicated) communicator, for benchmarks and interop.
  MPI_Comm comm() const { return comm_; }
  // Whether non-blocking collectives run on the collective thread (see MpiOptions).
  bool uses_collective_thread() const { return worker_ != nullptr; }
  // Ends every process of the job (MPI_Abort on MPI_COMM_WORLD) with exit code `code`: after a
  // fatal error on one rank, the others may be blocked in a collective that rank will never join,
  // and a plain exit (MPI_Finalize) would wait for them forever.
  [[noreturn]] static void AbortJob(int code);

  using Communicator::AllGather;
  using Communicator::AllReduce;
  using Communicator::Broadcast;
  using Communicator::IAllGather;
  using Communicator::IAllReduce;
  using Communicator::IBroadcast;
  using Communicator::IRecv;
  using Communicator::IReduceScatter;
  using Communicator::ISend;
  using Communicator::Recv;
  using Communicator::ReduceScatter;
  using Communicator::Send;

  CommHandle IAllReduce(void* data, size_t count, DType dtype) override;
  CommHandle IReduceScatter(const void* send, void* recv, size_t count, DType dtype) override;
  CommHandle IAllGather(const void* send, void* recv, size_t count, DType dtype) override;
  CommHandle IBroadcast(void* data, size_t count, DType dtype, int root) override;
  CommHandle ISend(const void* data, size_t count, DType dtype, int dest, int tag) override;
  CommHandle IRecv(void* data, size_t count, DType dtype, int source, int tag) override;
  CommHandle IBarrier() override;

  Status AllReduce(void* data, size_t count, DType dtype) override;
  Status ReduceScatter(const void* send, void* recv, size_t count, DType dtype) override;
  Status AllGather(const void* send, void* recv, size_t count, DType dtype) override;
  Status Broadcast(void* data, size_t count, DType dtype, int root) override;
  Status Send(const void* data, size_t count, DType dtype, int dest, int tag) override;
  Status Recv(void* data, size_t count, DType dtype, int source, int tag) override;
  Status Barrier() override;

  StatusOr<std::unique_ptr<Communicator>> Split(int color, int key) override;

 private:
  MpiCommunicator(MPI_Comm comm, int thread_level, bool owns_mpi, MpiOptions options,
                  std::string label_suffix);
  // Arguments valid for this backend (CheckArgs, and counts that fit MPI's int).
  Status Check(CommOp op, size_t count, DType dtype, int peer = -1, int tag = 0) const;
  // ok, or the MPI error `rc` as "<label>: <op>: MPI error: <MPI's string>".
  Status FromMpi(int rc, CommOp op, size_t count, DType dtype, int peer = -1, int tag = 0) const;
  CommHandle Started(int rc, MPI_Request request, CommOp op, size_t count, DType dtype,
                     int peer = -1, int tag = 0);

  // Runs `op` (a blocking call on nb_comm_) on the collective thread.
  CommHandle OnThread(std::function<int()> op, CommOp kind, size_t count, DType dtype,
                      int peer = -1);

  MPI_Comm comm_;
  MPI_Comm nb_comm_ = MPI_COMM_NULL;  // the collective thread's duplicate of comm_
  std::unique_ptr<CollectiveThread> worker_;
  int rank_ = 0;
  int size_ = 1;
  int thread_level_;
  bool owns_mpi_;
  MpiOptions options_;
  std::string label_;
};

}  // namespace atl
