#!/usr/bin/env bash
# Builds atoll (installing what is missing) and runs every test: unit tests, end-to-end CLI tests
# the PyTorch comparison, then every fuzz target briefly from its seed corpus (scripts/fuzz.sh
# --smoke). Usage: scripts/test.sh [extra ctest arguments]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# OpenBLAS's AVX2 (Haswell) kernels run SGEMM at about half speed on AVX-512 CPUs; machines here
# may even preset OPENBLAS_CORETYPE=Haswell. Use the AVX-512 kernels whenever the CPU has them.
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
# Idle OpenMP threads that spin steal the other core on a shared machine (measured: 2 threads ~2x
# slower under load with libgomp's default waits).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# The end-to-end tests train on the prepared corpus.
[[ -f .cache/data/sotu/train.bin ]] || build/release/atoll data prepare --out .cache/data/sotu
ctest --test-dir build/release --output-on-failure --timeout 900 -j2 "$@"
scripts/fuzz.sh --smoke
