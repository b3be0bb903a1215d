#!/usr/bin/env bash
# Low-communication strategies across sites against synchronous training: throughput relative
# to the same run with no network, WAN bytes relative to sync, validation loss at equal tokens.
# Usage: bench/strategies_bench.sh [--out DIR]
#   env: STEPS (default 300), SYNC_STEPS (steps of the sync run over the slow link, default 8),
#        SITES (4), BW (Mbit/s, 100), LAT (one-way ms, 50), ATOLL (build/release/atoll),
#        ROWS (default "sync diloco:10 diloco:50 diloco:100 streaming:100"), CODEC (int4),
#        INNER_LR (the low-communication rows' train.lr, default 1.5e-3; min_lr a tenth of it),
#        OUTER_LR (0.7), OUTER_MOMENTUM (0.5). Sync keeps configs/small.toml's lr 3e-3, its best
#        of 1.5e-3, 3e-3 and 6e-3; each site's AdamW on a quarter batch does best at half of it,
#        and the outer step at Nesterov 0.5 (bench/diloco_gap.sh and docs/PERFORMANCE.md).
# The model is configs/small.toml's (11M parameters), one rank per site, the global batch of 16
# sequences split over the sites, validation every STEPS/3 steps on site 0. Each strategy runs
# twice with `atoll launch --insecure`: over links of BW Mbit/s and LAT ms, and with no network
# (links unlimited, 0 ms). Sync runs only SYNC_STEPS steps over the slow link (at ~5 s a step a
# full run would take most of an hour): its throughput comes from those steps and its WAN bytes
# are its bytes per step times STEPS; its validation losses come from the no-network run, whose
# arithmetic is the same (the link changes only timing). tokens/s = tokens / the sum of site 0's
# step times (validation excluded; the final exchange included). "waiting on the WAN" is the
# share of site 0's step time spent waiting for exchanges over the slow link (its wan_ms): unlike
# the ratio of two runs, it does not move with the load on a shared machine.
# Prints a markdown table and writes DIR/strategies.csv (every validation point) and
# DIR/strategies.svg (validation loss against cumulative WAN bytes; bench/plot_strategies.py).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
bench_args "$0" "$@"
STEPS=${STEPS:-300}
SYNC_STEPS=${SYNC_STEPS:-8}
SITES=${SITES:-4}
BW=${BW:-100}
LAT=${LAT:-50}
CODEC=${CODEC:-int4}
ATOLL=${ATOLL:-build/release/atoll}
ROWS=${ROWS:-sync diloco:10 diloco:50 diloco:100 streaming:100}
INNER_LR=${INNER_LR:-1.5e-3}
OUTER_LR=${OUTER_LR:-0.7}
OUTER_MOMENTUM=${OUTER_MOMENTUM:-0.5}
LOWCOMM="--set world.codec=$CODEC --set train.lr=$INNER_LR --set train.min_lr=$(awk -v l="$INNER_LR" 'BEGIN { print l / 10 }') --set world.diloco.outer_lr=$OUTER_LR --set world.diloco.outer_momentum=$OUTER_MOMENTUM"
T=$(mktemp -d "${TMPDIR:-/tmp}/strategies_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
BENCH=strategies_bench
source bench/world_lib.sh
[[ -n $OUT ]] || OUT=$T
mkdir -p "$OUT"
EVAL=$((STEPS / 3))

# launch NAME STEPS LINK(slow|none) EXTRA... : one run into $T/NAME
launch() {
  local name=$1 steps=$2 link=$3
  shift 3
  local l=(--set world.link.bandwidth_mbps="$BW" --set world.link.latency_ms="$LAT")
  [[ $link == none ]] && l=(--set world.link.bandwidth_mbps=0 --set world.link.latency_ms=0)
  world_run "$name" --set world.sites="$SITES" --set train.steps="$steps" \
    --set train.micro_batch_size=$((16 / SITES)) --set train.eval_every="$EVAL" "${l[@]}" "$@"
}

# stat NAME: "tokens/s bytes_sent wan_wait_share" of site 0
stat() {
  awk '{ match($0, /"step_ms":[0-9.e+-]+/); ms += substr($0, RSTART + 10, RLENGTH - 10);
         if (match($0, /"wan_ms":[0-9.e+-]+/)) wan += substr($0, RSTART + 9, RLENGTH - 9);
         match($0, /"tokens":[0-9]+/); tok = substr($0, RSTART + 9, RLENGTH - 9);
         b = 0; if (match($0, /"wan_bytes_sent":[0-9]+/)) b = substr($0, RSTART + 17, RLENGTH - 17) }
       END { printf "%.1f %.0f %.4f\n", tok / (ms / 1e3), b, wan / ms }' "$T/$1/site-0/metrics.jsonl"
}

# vals NAME: "step val_loss bytes" lines
vals() {
  grep '"val_loss"' "$T/$1/site-0/metrics.jsonl" | sed -E \
    's/.*"step":([0-9]+).*"val_loss":([0-9.e+-]+).*"wan_bytes_sent":([0-9]+).*/\1 \2 \3/'
}

args_for() {  # args_for ROW -> launch arguments
  local kind=${1%%:*} h=${1#*:}
  case $kind in
    sync) echo "--set world.strategy=sync" ;;
    diloco) echo "--set world.strategy=diloco --set world.diloco.inner_steps=$h $LOWCOMM" ;;
    streaming) echo "--set world.strategy=streaming --set world.diloco.inner_steps=$h --set world.streaming.fragments=4 --set world.streaming.overlap_steps=5 $LOWCOMM" ;;
    *) echo "strategies_bench: unknown row $1" >&2; return 2 ;;
  esac
}

echo "row,step,val_loss,wan_bytes_sent" >"$OUT/strategies.csv"
declare -A TPS_SLOW TPS_NONE BYTES VAL WAIT
for row in $ROWS; do
  name=${row/:/_}
  read -r -a a <<<"$(args_for "$row")"
  launch "${name}_none" "$STEPS" none "${a[@]}"
  if [[ $row == sync ]]; then
    launch "${name}_slow" "$SYNC_STEPS" slow "${a[@]}"
    read -r tps b wait <<<"$(stat "${name}_slow")"
    BYTES[$row]=$(awk -v b="$b" -v s="$SYNC_STEPS" -v n="$STEPS" 'BEGIN { printf "%.0f", b / s * n }')
    # Validation points: bytes per step times the step.
    while read -r st v _; do
      echo "$row,$st,$v,$(awk -v b="$b" -v s="$SYNC_STEPS" -v t="$st" 'BEGIN { printf "%.0f", b / s * t }')"
    done < <(vals "${name}_none") >>"$OUT/strategies.csv"
  else
    launch "${name}_slow" "$STEPS" slow "${a[@]}"
    read -r tps b wait <<<"$(stat "${name}_slow")"
    BYTES[$row]=$b
    vals "${name}_slow" | awk -v r="$row" '{ print r "," $1 "," $2 "," $3 }' >>"$OUT/strategies.csv"
  fi
  TPS_SLOW[$row]=$tps
  WAIT[$row]=$wait
  read -r TPS_NONE[$row] _ <<<"$(stat "${name}_none")"
  VAL[$row]=$(vals "${name}_none" | tail -1 | cut -d' ' -f2)
  [[ $row == sync ]] || VAL[$row]=$(vals "${name}_slow" | tail -1 | cut -d' ' -f2)
done

echo
echo "$SITES sites x 1 rank, configs/small.toml, $STEPS steps of 16 x 128 tokens, links of $BW Mbit/s and $LAT ms; low-communication rows: codec $CODEC, inner lr $INNER_LR, outer lr $OUTER_LR, outer momentum $OUTER_MOMENTUM"
echo
echo "| strategy | tokens/s | no network | relative | waiting on the WAN | WAN MB sent (site 0) | fewer than sync | val loss | vs sync |"
echo "|---|---|---|---|---|---|---|---|---|"
sb=${BYTES[sync]:-0}
sv=${VAL[sync]:-0}
for row in $ROWS; do
  awk -v r="$row" -v a="${TPS_SLOW[$row]}" -v n="${TPS_NONE[$row]}" -v b="${BYTES[$row]}" \
    -v sb="$sb" -v v="${VAL[$row]}" -v sv="$sv" -v w="${WAIT[$row]}" 'BEGIN {
      label = r; sub(/:/, " H=", label)
      fewer = (sb > 0 && b > 0) ? sprintf("%.0fx", sb / b) : "-"
      rel = (sv > 0) ? sprintf("%+.1f%%", 100 * (v - sv) / sv) : "-"
      printf("| %s | %.0f | %.0f | %.1f%% | %.1f%% | %.1f | %s | %.3f | %s |\n", label, a, n,
        100 * a / n, 100 * w, b / 1e6, fewer, v, rel) }'
done
python3 "$(dirname "$0")/plot_strategies.py" "$OUT/strategies.csv" "$OUT/strategies.svg" \
  "validation loss vs WAN bytes: $SITES sites, $BW Mbit/s, $LAT ms, small model, $STEPS steps"
echo
echo "data: $OUT/strategies.csv, plot: $OUT/strategies.svg"
