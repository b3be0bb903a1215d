#!/usr/bin/env bash
# The kernel benchmarks in one go: SGEMM rates with OpenBLAS's AVX2 (Haswell) and AVX-512
# (SkylakeX) kernels, then GPT Forward+Backward tokens/s and MFU for the presets.
#
#   bench/kernels/run.sh [BUILD_DIR] [PRESET|all]      (defaults: build/release, small)
#
# Environment: THREADS=1,2  STEPS=5  WARMUP=2
# Every figure is a best-of-N on a machine other jobs share: run it when the load average is low
# (printed first) and treat differences under ~5% as noise.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build/release}
PRESET=${2:-small}
THREADS=${THREADS:-1,2}
STEPS=${STEPS:-5}
WARMUP=${WARMUP:-2}
for b in sgemm_rate kernels_model_step; do
  [[ -x "$BUILD/bench/$b" ]] || { echo "run.sh: no $BUILD/bench/$b (cmake --build $BUILD --target $b)" >&2; exit 2; }
done
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for core in Haswell SkylakeX; do
  echo "== sgemm_rate, OPENBLAS_CORETYPE=$core"
  OPENBLAS_CORETYPE=$core "$BUILD/bench/sgemm_rate" --threads "$THREADS"
done
echo "== kernels_model_step, OPENBLAS_CORETYPE=SkylakeX"
OPENBLAS_CORETYPE=SkylakeX "$BUILD/bench/kernels_model_step" --preset "$PRESET" --threads "$THREADS" \
  --steps "$STEPS" --warmup "$WARMUP" --profile
