#!/usr/bin/env bash
# Data-parallel step time: normal vs reproducible (int64 fixed-point) gradient reduction.
# Usage: bench/dp_bench.sh [config] ; env: STEPS (default 12), DPS (default "1 2"),
#        MICRO (train.micro_batch_size, default 4), BUCKET_MB (parallel.bucket_mb, default 4),
#        REPEAT (default 3: each mode runs REPEAT times, interleaved; the lowest median is kept,
#        since other load on the machine only ever adds time), ATOLL (default build/release/atoll).
# One OpenMP thread per rank. Prints a markdown table: median step time over steps 3..STEPS, the
# reproducible mode's cost relative to the normal mode at the same dp, and the time per step the
# ranks waited for all-reduces after backward (communication not hidden).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/small.toml}
STEPS=${STEPS:-12}
DPS=${DPS:-1 2}
MICRO=${MICRO:-4}
BUCKET_MB=${BUCKET_MB:-4}
REPEAT=${REPEAT:-3}
ATOLL=${ATOLL:-build/release/atoll}
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
T=$(mktemp -d "${TMPDIR:-/tmp}/dp_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

# median step_ms of steps 3..STEPS
median_ms() {
  sed -E 's/.*"step_ms":([^,}]*).*/\1/' "$1" | tail -n +3 | sort -g |
    awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}

run() {  # run DP MODE -> prints "ms wait_ms"
  local dp=$1 mode=$2 out="$T/$1_$2"
  local -a cmd=("$ATOLL" train --config "$CONFIG" --set train.steps="$STEPS" --set train.threads=1
    --set train.eval_batches=0 --set train.micro_batch_size="$MICRO" --set parallel.dp="$dp"
    --set parallel.bucket_mb="$BUCKET_MB"
    --set parallel.reproducible="$([[ $mode == reproducible ]] && echo true || echo false)"
    -q --out "$out")
  if [[ $dp == 1 ]]; then "${cmd[@]}" >/dev/null 2>"$out.err"; else
    mpirun -n "$dp" "${cmd[@]}" >/dev/null 2>"$out.err"; fi
  local wait
  wait=$(sed -nE 's/.*data parallel: ([0-9.]+) ms per step waiting.*/\1/p' "$out.err")
  echo "$(median_ms "$out/metrics.jsonl") ${wait:--}"
}

echo "config $CONFIG, $STEPS steps, micro_batch_size $MICRO, bucket_mb $BUCKET_MB, best of $REPEAT, 1 thread per rank, $(getconf _NPROCESSORS_ONLN) cores"
echo
echo "| dp | normal ms/step | reproducible ms/step | reproducible cost | all-reduce wait ms/step (normal / repro) |"
echo "|---:|---:|---:|---:|---:|"
for dp in $DPS; do
  n=1e99 r=1e99
  for ((i = 0; i < REPEAT; i++)); do
    read -r a aw < <(run "$dp" normal)
    read -r b bw < <(run "$dp" reproducible)
    if awk -v a="$a" -v n="$n" 'BEGIN { exit !(a < n) }'; then n=$a nw=$aw; fi
    if awk -v b="$b" -v r="$r" 'BEGIN { exit !(b < r) }'; then r=$b rw=$bw; fi
  done
  cost=$(awk -v n="$n" -v r="$r" 'BEGIN { printf "%+.1f%%", (r / n - 1) * 100 }')
  echo "| $dp | $n | $r | $cost | $nw / $rw |"
done
