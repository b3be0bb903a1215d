#!/usr/bin/env bash
# Training throughput per parallel layout, gradient communication hidden behind backward, and the
# cost of the reproducible reduction. Prints three markdown tables.
#   bench/layout_bench.sh [config]        (default configs/small.toml)
# env: STEPS (default 12; the median is over steps 3..STEPS), BATCH (train.batch_size, default 16),
#      MICRO (train.micro_batch_size, default 4: with batch 16, a pp 2 replica of dp 2 still gets
#      2 micro-batches), REPEAT (default 3: every case runs REPEAT times, interleaved with the other
#      cases of its table; the lowest median is kept, since other load only ever adds time),
#      BUCKETS (parallel.bucket_mb values of the overlap table, default "1 4 16"),
#      SECTIONS (default "layouts overlap repro"), EXTRA (more key=value overrides for every run,
#      e.g. EXTRA="model.n_layer=8 model.n_embd=384"), ATOLL (default build/release/atoll).
# One OpenMP thread per rank (train.threads=1); the 1-process references use 1, 2 and 4 threads.
# Runs with more ranks (or threads) than cores are oversubscribed; MPI ranks then yield when idle.
# Overlap table: "wait" is the trainer's mean per step (all steps) of rank 0's wait for the gradient
# reductions after backward, of the run with the lowest median step time; "hidden, median waits" uses
# the median over all runs of each mode instead (less sensitive to one disturbed run).
# Defaults: 63 training runs (21 per repeat), about 10 minutes on 2 vCPUs.
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/small.toml}
STEPS=${STEPS:-12}
BATCH=${BATCH:-16}
MICRO=${MICRO:-4}
REPEAT=${REPEAT:-3}
BUCKETS=${BUCKETS:-1 4 16}
SECTIONS=${SECTIONS:-layouts overlap repro}
EXTRA=${EXTRA:-}
ATOLL=${ATOLL:-build/release/atoll}
NCPU=$(getconf _NPROCESSORS_ONLN)
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
T=$(mktemp -d "${TMPDIR:-/tmp}/layout_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

# median step_ms of steps 3..STEPS of a metrics.jsonl
median_ms() {
  sed -E 's/.*"step_ms":([^,}]*).*/\1/' "$1" | tail -n +3 | sort -g |
    awk '{ a[NR] = $1 } END { print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}

# run NAME RANKS THREADS [key=value ...] -> prints "median_ms tokens_per_step wait_ms buckets",
# wait_ms and buckets "-" where the trainer does not log them; "ERR ..." if the run failed (its
# command and the end of its stderr go to stderr).
run() {
  local name=$1 ranks=$2 threads=$3 out="$T/$1"
  shift 3
  local -a sets=()
  local kv
  for kv in train.steps="$STEPS" train.batch_size="$BATCH" train.micro_batch_size="$MICRO" \
    train.threads="$threads" train.eval_batches=0 $EXTRA "$@"; do sets+=(--set "$kv"); done
  local -a cmd=("$ATOLL" train --config "$CONFIG" "${sets[@]}" -q --out "$out")
  ((ranks > 1)) && cmd=(mpirun -n "$ranks" "${cmd[@]}")
  local yield=0
  ((ranks > 1 && ranks * threads > NCPU)) && yield=1
  rm -rf "$out"
  if ! OMPI_MCA_mpi_yield_when_idle=$yield "${cmd[@]}" >/dev/null 2>"$out.err" ||
    [[ ! -s "$out/metrics.jsonl" ]]; then
    { echo "FAILED: ${cmd[*]}"; tail -n 20 "$out.err"; } >&2
    touch "$T/failed"
    echo "ERR - - -"
    return
  fi
  local wait buckets tokens
  wait=$(sed -nE 's/.*data parallel: ([0-9.]+) ms per step waiting.*/\1/p' "$out.err")
  buckets=$(sed -nE 's/.*, ([0-9]+) gradient buckets.*/\1/p' "$out.err")
  tokens=$(head -n 1 "$out/metrics.jsonl" | sed -E 's/.*"tokens":([0-9]+).*/\1/')
  echo "$(median_ms "$out/metrics.jsonl" | awk '{ printf "%.1f", $1 }') $tokens ${wait:--} ${buckets:--}"
  rm -rf "$out"  # the checkpoint: ~130 MB for small
}

median_of() {  # median of the numeric arguments ("-" if none)
  printf '%s\n' "$@" | grep -E '^[0-9.]+$' | sort -g |
    awk '{ a[NR] = $1 } END { if (!NR) print "-"; else print (NR % 2 ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2) }'
}
hidden_frac() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-" || b + 0 == 0) print "–"; else printf "%.0f%%", (1 - a / b) * 100 }'; }
lt() { awk -v a="$1" -v b="$2" 'BEGIN { exit !(a != "ERR" && (b == "ERR" || a + 0 < b + 0)) }'; }
ratio() { awk -v a="$1" -v b="$2" -v f="$3" 'BEGIN { if (a == "ERR" || b == "ERR") print "–"; else printf f, a / b }'; }

echo "config $CONFIG${EXTRA:+ + $EXTRA}, $STEPS steps of batch $BATCH in micro-batches of $MICRO,"
echo "median step time of steps 3..$STEPS, best of $REPEAT interleaved runs, $NCPU cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"

# ---- 1. Tokens/s per layout -------------------------------------------------------------------
if [[ " $SECTIONS " == *" layouts "* ]]; then
  # name | ranks | threads per rank | overrides
  LAYOUTS=(
    "1 process|1|1|"
    "1 process|1|2|"
    "1 process|1|4|"
    "dp2|2|1|parallel.dp=2"
    "dp2 + ZeRO-1|2|1|parallel.dp=2 parallel.zero=true"
    "tp2|2|1|parallel.tp=2"
    "pp2 (1f1b)|2|1|parallel.pp=2"
    "pp2 (gpipe)|2|1|parallel.pp=2 parallel.schedule=gpipe"
    "dp2 × tp2|4|1|parallel.dp=2 parallel.tp=2"
    "dp2 × pp2 (1f1b)|4|1|parallel.dp=2 parallel.pp=2"
    "tp2 × pp2 (1f1b)|4|1|parallel.tp=2 parallel.pp=2"
  )
  declare -A best tok
  for ((i = 0; i < REPEAT; i++)); do
    for j in "${!LAYOUTS[@]}"; do
      IFS='|' read -r name ranks threads sets <<<"${LAYOUTS[$j]}"
      # shellcheck disable=SC2086
      read -r ms tokens _ _ < <(run "l$j" "$ranks" "$threads" $sets)
      if [[ -z ${best[$j]:-} ]] || lt "$ms" "${best[$j]}"; then best[$j]=$ms tok[$j]=$tokens; fi
    done
  done
  ref() {  # best ms of the 1-process run with this many threads
    local j
    for j in "${!LAYOUTS[@]}"; do
      IFS='|' read -r name ranks threads sets <<<"${LAYOUTS[$j]}"
      [[ $ranks == 1 && $threads == "$1" ]] && { echo "${best[$j]}"; return; }
    done
    echo ERR
  }
  echo
  echo "### Tokens/s per layout"
  echo
  echo "| layout | ranks × threads | ms/step | tokens/s | vs 1 process, same total threads | vs 1 process, 1 thread |"
  echo "|---|---:|---:|---:|---:|---:|"
  for j in "${!LAYOUTS[@]}"; do
    IFS='|' read -r name ranks threads sets <<<"${LAYOUTS[$j]}"
    ms=${best[$j]}
    if [[ $ms == ERR ]]; then tps=ERR; else tps=$(awk -v t="${tok[$j]}" -v m="$ms" 'BEGIN { printf "%.0f", t / m * 1000 }'); fi
    total=$((ranks * threads))
    note=""
    ((total > NCPU)) && note=" (oversubscribed)"
    echo "| $name | $ranks × $threads$note | $ms | $tps | $(ratio "$(ref "$total")" "$ms" "%.2f×") | $(ratio "$(ref 1)" "$ms" "%.2f×") |"
  done
fi

# ---- 2. Gradient communication hidden behind backward -------------------------------------------
if [[ " $SECTIONS " == *" overlap "* ]]; then
  echo
  echo "### dp2: gradient all-reduce wait after backward, overlap on vs off"
  echo
  echo "| bucket_mb | buckets | ms/step on | ms/step off | wait ms/step on | wait ms/step off | hidden = 1 − on/off | hidden, median waits | all runs' wait on ; off |"
  echo "|---:|---:|---:|---:|---:|---:|---:|---:|---|"
  for b in $BUCKETS; do
    on=ERR off=ERR won=- woff=- nb=- all_on="" all_off=""
    for ((i = 0; i < REPEAT; i++)); do
      read -r a _ aw ab < <(run "on" 2 1 parallel.dp=2 parallel.bucket_mb="$b" parallel.overlap=true)
      read -r c _ cw _ < <(run "off" 2 1 parallel.dp=2 parallel.bucket_mb="$b" parallel.overlap=false)
      all_on+=" $aw" all_off+=" $cw"
      if [[ $on == ERR ]] || lt "$a" "$on"; then on=$a won=$aw nb=$ab; fi
      if [[ $off == ERR ]] || lt "$c" "$off"; then off=$c woff=$cw; fi
    done
    hidden=$(hidden_frac "$won" "$woff")
    hidden_med=$(hidden_frac "$(median_of $all_on)" "$(median_of $all_off)")
    echo "| $b | $nb | $on | $off | $won | $woff | $hidden | $hidden_med |${all_on} ;${all_off} |"
  done
fi

# ---- 3. Reproducible-mode cost ------------------------------------------------------------------
if [[ " $SECTIONS " == *" repro "* ]]; then
  echo
  echo "### dp2: normal vs reproducible reduction"
  echo
  echo "| zero | normal ms/step | reproducible ms/step | reproducible cost | wait ms/step (normal / reproducible) | all runs' ms/step normal ; reproducible |"
  echo "|---|---:|---:|---:|---:|---|"
  declare -A rb rw ra
  for ((i = 0; i < REPEAT; i++)); do
    for z in false true; do
      for r in false true; do
        read -r ms _ w _ < <(run "r" 2 1 parallel.dp=2 parallel.zero="$z" parallel.reproducible="$r")
        ra[$z$r]+=" $ms"
        if [[ -z ${rb[$z$r]:-} ]] || lt "$ms" "${rb[$z$r]}"; then rb[$z$r]=$ms rw[$z$r]=$w; fi
      done
    done
  done
  for z in false true; do
    n=${rb[${z}false]} r=${rb[${z}true]}
    cost=$(awk -v n="$n" -v r="$r" 'BEGIN { if (n == "ERR" || r == "ERR") print "–"; else printf "%+.1f%%", (r / n - 1) * 100 }')
    echo "| $z | $n | $r | $cost | ${rw[${z}false]} / ${rw[${z}true]} |${ra[${z}false]} ;${ra[${z}true]} |"
  done
fi
if [[ -e "$T/failed" ]]; then echo; echo "some runs FAILED (see stderr)"; exit 1; fi
