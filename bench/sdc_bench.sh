#!/usr/bin/env bash
# Silent-data-corruption campaign and detector costs (issue 15): how many bit flips each detector
# catches, per injection site and per bit, whether the missed ones mattered, false positives over
# clean steps, and what each detector costs in step time.
# Usage: bench/sdc_bench.sh [--out DIR]
#   env: INJECTIONS (per campaign, default 192: 6 sites x 32 bits), STEPS (each run's, 24),
#        CLEAN_STEPS (a clean run for false positives in the "checksums" campaign, 10000),
#        CAMPAIGNS (default "guard:1 checksums:1:sdc.checksums=true dp2:2:sdc.checksums=true
#        sites2:1:world.sites=2,world.ranks_per_site=1,sdc.checksums=true":
#        NAME:DP[:SET,SET...], the detectors under test and the data-parallel ranks, run as
#        threads; a NAME beginning with "sites" also injects wan payload flips, at
#        SITES_INJECTIONS, default 224: 7 sites x 32 bits), COST_STEPS (12),
#        ATOLL (build/release/atoll), SKIP_COST=1, SKIP_CAMPAIGN=1.
# The "sites2" campaign runs two sync sites in one process, their leaders joined by the WAN
# transport on loopback.
# Each campaign is `atoll sdc-campaign` on configs/tiny.toml (sdc.on_alarm = redo: alarmed steps
# are replayed, localized and undone; guard, fingerprints and memory checks on, as by default);
# its tables go to DIR/campaign-NAME/tables.md and are printed. DIR/sdc_bits.svg plots the
# detection rate against the bit position (bench/plot_sdc.py). The cost runs configs/small.toml
# for COST_STEPS steps with every detector on, in one process and at dp 2, and prints what each
# detector took per step, timed inside the run, and its share of that run's step time.
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
bench_args "$0" "$@"
INJECTIONS=${INJECTIONS:-192}
STEPS=${STEPS:-24}
CLEAN_STEPS=${CLEAN_STEPS:-10000}
CAMPAIGNS=${CAMPAIGNS:-"guard:1 checksums:1:sdc.checksums=true dp2:2:sdc.checksums=true sites2:1:world.sites=2,world.ranks_per_site=1,sdc.checksums=true"}
COST_STEPS=${COST_STEPS:-12}
ATOLL=${ATOLL:-build/release/atoll}
OUT=${OUT:-$(mktemp -d /tmp/sdc_bench.XXXXXX)}
mkdir -p "$OUT"
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
    n=$INJECTIONS
    if [[ $name == sites* ]]; then
      extra+=(--kinds gemm_fwd,gemm_bwd,activation,grad,param,moment,wan)
      n=${SITES_INJECTIONS:-224}
    fi
    dir="$OUT/campaign-$name"
    echo
    note=""
    ((clean > 0)) && note=", and a clean run of $clean steps"
    echo "## campaign $name: configs/tiny.toml, dp $dp${sets:+, $sets}, $n injections" \
      "of $STEPS steps$note"
    echo
    "$ATOLL" sdc-campaign --config configs/tiny.toml --set train.steps="$STEPS" \
      --set parallel.dp="$dp" "${extra[@]}" --injections "$n" --clean-steps "$clean" \
      --out "$dir" 2>"$dir.err" || { tail -5 "$dir.err" >&2; exit 1; }
    plots+=("$dir/bits.csv" "$name")
  done
  python3 bench/plot_sdc.py "$OUT/sdc_bits.svg" "${plots[@]}"
  echo
  echo "plot: $OUT/sdc_bits.svg"
fi

[[ -n ${SKIP_COST:-} ]] && exit 0
# The cost, measured inside each run: every detector times itself (the "sdc cost per step" line
# that `atoll train` logs at the end), as a share of that run's own step time. Ratios within one
# run do not move with the load on a shared machine, unlike two runs' step times.
cost_run() {  # NAME DP SETS...
  local name=$1 dp=$2
  shift 2
  local dir="$OUT/cost-$name" sets=()
  for s in "$@"; do sets+=(--set "$s"); done
  local cmd=("$ATOLL" train --config configs/small.toml --set train.steps="$COST_STEPS"
    --set train.eval_every=0 --set parallel.dp="$dp" "${sets[@]}" -q --out "$dir")
  if ((dp == 1)); then "${cmd[@]}" >/dev/null 2>"$dir.err"
  else mpirun -n "$dp" --bind-to none -x OMP_NUM_THREADS=1 "${cmd[@]}" >/dev/null 2>"$dir.err"; fi
  grep -m1 "sdc cost per step" "$dir.err" | sed 's/.*sdc cost per step: //'
}
echo
echo "## detector cost: configs/small.toml, $COST_STEPS steps, each detector timed inside the run"
echo
echo "| run | detectors on | per step: ms (% of the step time) |"
echo "|---|---|---|"
echo "| one process | guard, memory, checksums, redo (snapshot + trace) |" \
  "$(cost_run all 1 sdc.on_alarm=redo sdc.checksums=true) |"
echo "| one process | the same + sdc.audit_every = 1 (every step replayed) |" \
  "$(cost_run audit 1 sdc.on_alarm=redo sdc.checksums=true sdc.audit_every=1) |"
echo "| dp 2 (mpirun, a thread per rank) | the same as the first + fingerprints, moments every step |" \
  "$(cost_run dp2 2 sdc.on_alarm=redo sdc.checksums=true sdc.moments_every=1) |"
