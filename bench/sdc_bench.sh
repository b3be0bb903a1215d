#!/usr/bin/env bash
# Silent-data-corruption campaign and detector costs (issue 15): how many bit flips each detector
# catches, per injection site and per bit, whether the missed ones mattered, false positives over
# clean steps, and what each detector costs in step time.
# Usage: bench/sdc_bench.sh [--out DIR]
#   env: INJECTIONS (per campaign, default 192: 6 sites x 32 bits), STEPS (each run's, 24),
#        CLEAN_STEPS (a clean run for false positives in the "checksums" campaign, 10000),
#        CAMPAIGNS (default "guard:1 checksums:1:sdc.checksums=true dp2:2:sdc.checksums=true":
#        NAME:DP[:SET,SET...], the detectors under test and the data-parallel ranks, run as
#        threads), COST_STEPS (12), COST_REPEAT (2), ATOLL (build/release/atoll), SKIP_COST=1,
#        SKIP_CAMPAIGN=1.
# Each campaign is `atoll sdc-campaign` on configs/tiny.toml (sdc.on_alarm = redo: alarmed steps
# are replayed, localized and undone; guard, fingerprints and memory checks on, as by default); its tables go
# to DIR/campaign-NAME/tables.md and are printed. DIR/sdc_bits.svg plots the detection rate
# against the bit position (bench/plot_sdc.py). The cost runs configs/small.toml for COST_STEPS steps per mode, the modes
# interleaved COST_REPEAT times, and prints each mode's median step time over steps 3..COST_STEPS
# (the lowest of its repeats) and its ratio to the run with every detector off, measured in the
# same invocation: one process for the guard and the replay machinery, dp 2 under mpirun (one
# thread per rank) for the fingerprints.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=""
while (($#)); do
  case $1 in
    --out) OUT=$2; shift 2 ;;
    -h|--help) source "$(dirname "$0")/world_lib.sh"; bench_help "$0"; exit 0 ;;
    *) echo "sdc_bench: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
INJECTIONS=${INJECTIONS:-192}
STEPS=${STEPS:-24}
CLEAN_STEPS=${CLEAN_STEPS:-10000}
CAMPAIGNS=${CAMPAIGNS:-"guard:1 checksums:1:sdc.checksums=true dp2:2:sdc.checksums=true"}
COST_STEPS=${COST_STEPS:-12}
COST_REPEAT=${COST_REPEAT:-2}
ATOLL=${ATOLL:-build/release/atoll}
OUT=${OUT:-$(mktemp -d /tmp/sdc_bench.XXXXXX)}
mkdir -p "$OUT"
export OMP_WAIT_POLICY=passive OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
[[ -x $ATOLL ]] || { echo "sdc_bench: $ATOLL not built (scripts/build.sh)" >&2; exit 2; }
[[ -f .cache/data/sotu/train.bin ]] || { echo "sdc_bench: run scripts/demo.sh first (data)" >&2; exit 2; }
echo "# sdc_bench $(date -u +%F) on $(nproc) CPUs; results in $OUT"

if [[ -z ${SKIP_CAMPAIGN:-} ]]; then
  plots=()
  for c in $CAMPAIGNS; do
    IFS=: read -r name dp sets <<<"$c"
    clean=0
    [[ $name == checksums ]] && clean=$CLEAN_STEPS
    extra=()
    IFS=, read -ra kv <<<"${sets:-}"
    for s in "${kv[@]}"; do extra+=(--set "$s"); done
    dir="$OUT/campaign-$name"
    echo
    note=""
    ((clean > 0)) && note=", and a clean run of $clean steps"
    echo "## campaign $name: configs/tiny.toml, dp $dp${sets:+, $sets}, $INJECTIONS injections" \
      "of $STEPS steps$note"
    echo
    "$ATOLL" sdc-campaign --config configs/tiny.toml --set train.steps="$STEPS" \
      --set parallel.dp="$dp" "${extra[@]}" --injections "$INJECTIONS" --clean-steps "$clean" \
      --out "$dir" 2>"$dir.err" || { tail -5 "$dir.err" >&2; exit 1; }
    plots+=("$dir/bits.csv" "$name")
  done
  python3 bench/plot_sdc.py "$OUT/sdc_bits.svg" "${plots[@]}"
  echo
  echo "plot: $OUT/sdc_bits.svg"
fi

[[ -n ${SKIP_COST:-} ]] && exit 0
median_ms() {
  sed -E 's/.*"step_ms":([^,}]*).*/\1/' "$1" | tail -n +3 | sort -g |
    awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
# mode NAME DP SETS...: one run of configs/small.toml; prints its median step time.
mode() {
  local name=$1 dp=$2
  shift 2
  local dir="$OUT/cost-$name" sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  local cmd=("$ATOLL" train --config configs/small.toml --set train.steps="$COST_STEPS"
    --set train.eval_every=0 --set parallel.dp="$dp" "${sets[@]}" -q --out "$dir")
  if ((dp == 1)); then "${cmd[@]}" >/dev/null 2>"$dir.err"
  else mpirun -n "$dp" --bind-to none -x OMP_NUM_THREADS=1 "${cmd[@]}" >/dev/null 2>"$dir.err"; fi
  median_ms "$dir/metrics.jsonl"
}
OFF=(sdc.guard=false sdc.fingerprints=false sdc.memory=false)
declare -A best
names=(off guard memory checksums redo audit dp2-off dp2-fingerprints dp2-all)
for ((r = 0; r < COST_REPEAT; r++)); do
  for n in "${names[@]}"; do
    case $n in
      off) ms=$(mode $n 1 "${OFF[@]}") ;;
      guard) ms=$(mode $n 1 sdc.guard=true sdc.fingerprints=false sdc.memory=false) ;;
      memory) ms=$(mode $n 1 sdc.guard=false sdc.fingerprints=false sdc.memory=true) ;;
      checksums) ms=$(mode $n 1 sdc.guard=false sdc.memory=false sdc.checksums=true) ;;
      redo) ms=$(mode $n 1 sdc.on_alarm=redo) ;;
      audit) ms=$(mode $n 1 sdc.on_alarm=redo sdc.audit_every=1) ;;
      dp2-off) ms=$(mode $n 2 "${OFF[@]}") ;;
      dp2-fingerprints) ms=$(mode $n 2 sdc.guard=false sdc.memory=false sdc.fingerprints=true) ;;
      dp2-all) ms=$(mode $n 2 sdc.on_alarm=redo sdc.checksums=true) ;;
    esac
    if [[ -z ${best[$n]:-} ]] || awk "BEGIN { exit !($ms < ${best[$n]}) }"; then best[$n]=$ms; fi
  done
done
echo
echo "## detector cost: configs/small.toml, $COST_STEPS steps, lowest of $COST_REPEAT medians"
echo
echo "| mode | layout | what runs | median step (ms) | vs off |"
echo "|---|---|---|---|---|"
row() {  # NAME LAYOUT WHAT BASE
  printf "| %s | %s | %s | %.0f | %+.1f%% |\n" "$1" "$2" "$3" "${best[$1]}" \
    "$(awk "BEGIN { print (${best[$1]} / ${best[$4]} - 1) * 100 }")"
}
row off "one process" "no detector" off
row guard "one process" "step guard" off
row memory "one process" "memory checks (seal and verify parameters and moments)" off
row checksums "one process" "GEMM column checksums (forward and backward)" off
row redo "one process" "guard + memory + snapshot + op trace (replays only on alarm)" off
row audit "one process" "redo + every step replayed (sdc.audit_every = 1)" off
row dp2-off "dp 2" "no detector" dp2-off
row dp2-fingerprints "dp 2" "parameter fingerprints every step, moments every 10" dp2-off
row dp2-all "dp 2" "guard + fingerprints + memory + checksums + snapshot + trace" dp2-off
