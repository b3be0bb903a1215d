#!/usr/bin/env bash
# The main job: prepare the bundled corpus (State of the Union addresses, public domain), then train
# one GPT across three emulated datacenters joined by slow WAN links (configs/world-demo.toml: 100
# Mbit/s, 40-80 ms) with `atoll launch` — a coordinator, one site per mpirun, mutual TLS between
# them, Streaming DiLoCo with 4-bit exchanges overlapped with training (--set world.strategy=sync
# for an all-reduce every step) — showing one live view for a few minutes;
# then evaluate the final checkpoint, print a text sample, the checkpoint's path and the run report
# (runs/world-demo/report.html: charts, events, config; one file that opens offline).
# Usage: scripts/demo.sh [--set section.key=value ...]   (e.g. --set train.steps=50)
# The single-site engine: atoll train --config configs/small.toml --out runs/s1 (docs/USER_GUIDE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# OpenBLAS's AVX2 (Haswell) kernels run SGEMM at about half speed on AVX-512 CPUs; machines here
# may even preset OPENBLAS_CORETYPE=Haswell. Use the AVX-512 kernels whenever the CPU has them.
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
# Idle OpenMP threads that spin steal the other core on a shared machine (measured: 2 threads ~2x
# slower under load with libgomp's default waits).
export OMP_WAIT_POLICY="${OMP_WAIT_POLICY:-passive}"
ATOLL=build/release/atoll
OUT=runs/world-demo
[[ -f .cache/data/sotu/train.bin ]] || $ATOLL data prepare --out .cache/data/sotu
$ATOLL launch --config configs/world-demo.toml --out "$OUT" "$@"
echo
echo "== per site: $OUT/site-N/metrics.jsonl; the coordinator's log: $OUT/coordinator.log =="
echo "== validation loss of the final checkpoint =="
$ATOLL eval --checkpoint "$OUT/checkpoint" --tokens .cache/data/sotu/val.bin --max-windows 64
echo
echo "== sample =="
$ATOLL sample --checkpoint "$OUT/checkpoint" --prompt "Fellow-Citizens of the Senate and House of Representatives:" --tokens 40 --seed 1
echo
echo "checkpoint: $OUT/checkpoint"
echo "report:     $OUT/report.html (charts, events, config: open it in a browser)"
