#!/usr/bin/env bash
# Synchronous training across sites: step time versus the WAN link's bandwidth and latency, and
# the share of the step spent in the WAN all-reduce.
# Usage: bench/world_bench.sh ; env: STEPS (default 8), SITES (default 3), ATOLL
#        (default build/release/atoll), BANDWIDTHS (Mbit/s at 20 ms, default "50 100 400 1000"),
#        LATENCIES (ms at 400 Mbit/s, default "5 20 40 80").
# The model is configs/world-demo.toml's (3.3M parameters: 13 MB of float gradients per step) with
# one rank per site (every link the same: the demo's slower 0-2 pair is overridden), run with
# `atoll launch --insecure`. Prints a markdown table: median step time
# and WAN time over steps 3..STEPS (the first steps include connection and warm-up), the WAN's
# share, and the WAN all-reduce's effective rate (ring all-reduce bytes sent per site / WAN time).
set -euo pipefail
cd "$(dirname "$0")/.."
STEPS=${STEPS:-8}
SITES=${SITES:-3}
ATOLL=${ATOLL:-build/release/atoll}
BANDWIDTHS=${BANDWIDTHS:-50 100 400 1000}
LATENCIES=${LATENCIES:-5 20 40 80}
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
T=$(mktemp -d "${TMPDIR:-/tmp}/world_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

# median KEY FILE: the median of KEY over lines 3.. of a metrics.jsonl.
median() {
  sed -E "s/.*\"$1\":([^,}]*).*/\1/" "$2" | tail -n +3 | sort -g |
    awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}

run() {  # run BANDWIDTH LATENCY -> a table row
  local bw=$1 lat=$2 out="$T/w_$1_$2"
  "$ATOLL" launch --config configs/world-demo.toml --insecure -q --out "$out" \
    --set world.sites="$SITES" --set train.batch_size=$((8 * SITES)) --set train.steps="$STEPS" \
    --set world.strategy=sync \
    --set train.eval_batches=0 --set world.link.bandwidth_mbps="$bw" \
    --set world.link.latency_ms="$lat" --set world.link.jitter_ms=0 \
    --set world.link.0-2.latency_ms="$lat" --set world.link.0-2.bandwidth_mbps="$bw" \
    --set world.link.0-2.jitter_ms=0 >/dev/null 2>"$out.err" ||
    { echo "| $bw | $lat | failed: $(tail -1 "$out.err") | | | |"; return; }
  local m="$out/site-0/metrics.jsonl"
  local step wan bytes1 bytes0 lines
  step=$(median step_ms "$m")
  wan=$(median wan_ms "$m")
  lines=$(wc -l <"$m")
  bytes0=$(sed -n 2p "$m" | sed -E 's/.*"wan_bytes_sent":([0-9]+).*/\1/')
  bytes1=$(sed -n "${lines}p" "$m" | sed -E 's/.*"wan_bytes_sent":([0-9]+).*/\1/')
  awk -v bw="$bw" -v lat="$lat" -v step="$step" -v wan="$wan" -v b0="$bytes0" -v b1="$bytes1" \
    -v n="$lines" 'BEGIN { per = (b1 - b0) / (n - 2);
      printf "| %g | %g | %.0f | %.0f | %.0f%% | %.1f MB | %.0f |\n", bw, lat, step, wan,
             100 * wan / step, per / 1e6, per * 8 / (wan / 1e3) / 1e6 }'
}

echo "Sync training, $SITES sites x 1 rank, world-demo model, $STEPS steps (medians of steps 3..$STEPS)"
echo
echo "| link Mbit/s | latency ms | step ms | WAN ms | WAN share | sent per step | WAN Mbit/s |"
echo "|---|---|---|---|---|---|---|"
for bw in $BANDWIDTHS; do run "$bw" 20; done
for lat in $LATENCIES; do run 400 "$lat"; done
