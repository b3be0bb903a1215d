#!/usr/bin/env bash
# All-reduce bus bandwidth of our MPI Communicator vs raw MPI_Allreduce, 4 KiB .. 64 MiB, on 2 and
# 4 ranks of this machine (shared memory).
#   bench/comm_bench.sh [BUILD_DIR] [extra benchmark args, e.g. --max-bytes 4194304 --trials 3]
# BUILD_DIR defaults to build/release. Ranks may outnumber cores (oversubscribed); then absolute
# numbers measure the scheduler as much as the copy engine, but the ratio column stays meaningful.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/release}
[[ -f "$BUILD/build.ninja" ]] || cmake --preset release >/dev/null
cmake --build "$BUILD" -j2 --target comm_allreduce_bench >/dev/null
BIN="$BUILD/bench/comm/comm_allreduce_bench"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 OMPI_MCA_btl=self,vader
# Busy-polling ranks starve each other when oversubscribed; yield when there are fewer cores.
for n in 2 4; do
  if ((n > $(nproc))); then export OMPI_MCA_mpi_yield_when_idle=1; fi
  echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')), mpirun -n $n"
  mpirun -n "$n" "$BIN" "${@:2}"
  echo
done
