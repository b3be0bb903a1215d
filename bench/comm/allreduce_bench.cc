// All-reduce bus bandwidth: our MPI Communicator (blocking AllReduce, and IAllReduce + Wait)
// against raw MPI_Allreduce on the same ranks, float32 sums, 4 KiB .. 64 MiB.
//
//   mpirun -n 4 build/release/bench/comm/comm_allreduce_bench [--min-bytes B] [--max-bytes B]
//                                                             [--trials T]
//
// Bus bandwidth (as nccl-tests defines it) = bytes * 2(p-1)/p / time: the traffic each rank's link
// carries in a ring all-reduce, so numbers are comparable across rank counts. Time per all-reduce
// is the slowest rank's. Variants alternate trial by trial (so a noisy neighbour hits them alike)
// and each reports its best trial: on shared machines the minimum is the stable statistic.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/mpi.h"
#include "core/log.h"

namespace {

enum class Variant { kRawMpi, kBlocking, kNonBlocking };

// Seconds per all-reduce of `count` floats, the slowest rank's, over `iters` back-to-back calls.
double TimeOnce(atl::MpiCommunicator& comm, Variant v, std::vector<float>& buf, int iters) {
  MPI_Barrier(comm.comm());
  const double t0 = MPI_Wtime();
  for (int i = 0; i < iters; ++i) {
    switch (v) {
      case Variant::kRawMpi:
        MPI_Allreduce(MPI_IN_PLACE, buf.data(), static_cast<int>(buf.size()), MPI_FLOAT, MPI_SUM,
                      MPI_COMM_WORLD);
        break;
      case Variant::kBlocking:
        atl::ExitIfError(comm.AllReduce(std::span<float>(buf)));
        break;
      case Variant::kNonBlocking:
        atl::ExitIfError(comm.IAllReduce(std::span<float>(buf)).Wait());
        break;
    }
  }
  double dt = (MPI_Wtime() - t0) / iters;
  MPI_Allreduce(MPI_IN_PLACE, &dt, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return dt;
}

size_t ArgBytes(int argc, char** argv, const char* name, size_t def) {
  for (int i = 1; i + 1 < argc; ++i)
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  return def;
}

std::string HumanBytes(size_t b) {
  if (b >= (1u << 20)) return fmt::format("{} MiB", b >> 20);
  return fmt::format("{} KiB", b >> 10);
}

}  // namespace

int main(int argc, char** argv) {
  atl::MpiOptions options;
  options.timeout_s = 0;  // plain MPI_Wait: the comparison is about the wrapper, not the poll loop
  auto world_or = atl::MpiCommunicator::CreateWorld(&argc, &argv, options);
  atl::ExitIfError(world_or.status());
  auto& comm = **world_or;
  const size_t min_bytes = ArgBytes(argc, argv, "--min-bytes", 4 << 10);
  const size_t max_bytes = ArgBytes(argc, argv, "--max-bytes", 64 << 20);
  const int trials = static_cast<int>(ArgBytes(argc, argv, "--trials", 5));
  const int p = comm.size();
  const double bus_factor = 2.0 * (p - 1) / p;

  if (comm.rank() == 0) {
    std::printf(
        "all-reduce float32 sum, %d ranks, MPI thread level %d, best of %d trials; nb = "
        "IAllReduce+Wait via %s\n",
        p, comm.thread_level(), trials,
        comm.uses_collective_thread() ? "the collective thread" : "MPI_Iallreduce");
    std::printf("%9s %11s %11s %11s %11s %7s %11s %7s\n", "size", "raw us", "raw GB/s", "ours us",
                "ours GB/s", "ratio", "nb GB/s", "ratio");
  }
  for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 4) {
    // Zeros: sums stay finite and normal however often they repeat (denormals would be slow).
    std::vector<float> buf(bytes / sizeof(float), 0.0f);
    // About 64 MiB of traffic per trial: enough calls to time small messages, few for large.
    const int iters = static_cast<int>(std::clamp<size_t>((64u << 20) / bytes, 2, 500));
    const Variant variants[3] = {Variant::kRawMpi, Variant::kBlocking, Variant::kNonBlocking};
    double best[3] = {1e30, 1e30, 1e30};
    for (Variant v : variants) TimeOnce(comm, v, buf, 1);  // warm-up (connections, buffers)
    for (int t = 0; t < trials; ++t) {
      for (int k = 0; k < 3; ++k) {
        const int j = (t % 2) ? 2 - k : k;  // alternate the order trial by trial
        best[j] = std::min(best[j], TimeOnce(comm, variants[j], buf, iters));
      }
    }
    if (comm.rank() == 0) {
      auto bw = [&](double s) { return bytes * bus_factor / s / 1e9; };
      std::printf("%9s %11.1f %11.3f %11.1f %11.3f %7.3f %11.3f %7.3f\n", HumanBytes(bytes).c_str(),
                  best[0] * 1e6, bw(best[0]), best[1] * 1e6, bw(best[1]), best[0] / best[1],
                  bw(best[2]), best[0] / best[2]);
      std::fflush(stdout);
    }
  }
  world_or->reset();
  return 0;
}
