#!/usr/bin/env bash
# Start-up and restart cost of a world: launch-to-first-step against ranks per site (2 sites x
# 1, 2, 4, 8 ranks) and against sites (2, 3, 4, 6, 8 sites x 1 rank), then a site restarted from
# a live site's memory (--fail-site 1@4 --rejoin: from its death until it logged a step again)
# and the whole world restarted from its disk checkpoint (a fresh launch --resume: until its
# first step). configs/tiny.toml, links of 5 ms and 200 Mbit/s, heartbeat 0.5 s, --insecure.
# Prints markdown tables and the fitted constants, and writes them as JSON to OUT (--out FILE,
# default runs/startup.json) for `atoll plan goodput --startup OUT`:
#   fixed_s, per_rank_s, per_site_s   launch-to-first-step = fixed + per_rank x (ranks per site)
#                                     + per_site x sites (least squares over both sweeps)
#   restart_from_memory_s             a lost site back (death to its first step), incl. the
#                                     dead-site time
#   restart_from_disk_s               a world of 3 sites started again from a checkpoint
# Usage: bench/startup.sh [--out FILE] ; env: ATOLL, DATA.
set -euo pipefail
cd "$(dirname "$0")/.."
ATOLL=${ATOLL:-build/release/atoll}
DATA=${DATA:-.cache/data/sotu}
source bench/bench_lib.sh
bench_args "$0" "$@"
OUT=${OUT:-runs/startup.json}
export OMP_NUM_THREADS=1
T=$(mktemp -d "${TMPDIR:-/tmp}/startup_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT
mkdir -p "$(dirname "$OUT")"

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.micro_batch_size=1
  --set train.eval_every=0 --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200
  --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 --insecure -q)
now() { date +%s.%N; }

# first_step DIR SITES T0 PID: seconds from T0 until every site of DIR logged step 1, less the
# slowest first step's own time (so: until the first step began everywhere). Gives up when the
# launch PID ends first, or after 120 s.
first_step() {
  local dir=$1 sites=$2 t0=$3 pid=$4 s i
  for ((i = 0; ; i++)); do
    local all=1
    for ((s = 0; s < sites; s++)); do
      [[ -s $dir/site-$s/metrics.jsonl ]] || { all=0; break; }
    done
    [[ $all == 1 ]] && break
    if ! kill -0 "$pid" 2>/dev/null || ((i > 6000)); then
      echo "launch in $dir ended or hung before every site's first step" >&2
      exit 1
    fi
    sleep 0.02
  done
  local t1 step_s
  t1=$(now)
  step_s=$(for ((s = 0; s < sites; s++)); do head -n 1 "$dir/site-$s/metrics.jsonl"; done |
    sed -E 's/.*"step_ms":([0-9.e+-]+).*/\1/' | sort -g | tail -1)
  awk -v a="$t0" -v b="$t1" -v s="$step_s" 'BEGIN { printf "%.3f", b - a - s / 1000 }'
}

# wait_line FILE PATTERN PID: the time when FILE first has a line matching PATTERN.
wait_line() {
  local i
  for ((i = 0; i < 6000; i++)); do
    [[ -f $1 ]] && grep -qE "$2" "$1" && { now; return; }
    kill -0 "$3" 2>/dev/null || break
    sleep 0.02
  done
  echo "no line /$2/ in $1" >&2
  exit 1
}

rows=()  # "ranks sites seconds"
measure() {  # measure RANKS SITES
  local r=$1 s=$2 dir="$T/w_$1_$2" t0 secs
  t0=$(now)
  "$ATOLL" launch "${C[@]}" --set world.sites="$s" --set world.ranks_per_site="$r" \
    --set parallel.dp="$r" --set train.batch_size=$((r * s)) --set train.steps=3 \
    --out "$dir" >/dev/null 2>"$dir.err" &
  local pid=$!
  secs=$(first_step "$dir" "$s" "$t0" "$pid")
  wait "$pid" || { echo "launch of $s x $r failed: $(tail -3 "$dir.err")" >&2; exit 1; }
  rows+=("$r $s $secs")
  echo "| $s | $r | $secs |"
}

echo "| sites | ranks per site | launch to first step, s |"
echo "|---:|---:|---:|"
for r in 1 2 4 8; do measure "$r" 2; done
for s in 3 4 6 8; do measure 1 "$s"; done

# A site restarted from a live site's memory: site 1 dies right after its step 4 line and comes
# back; wall clock from that line to its new process's first one.
W=(--set world.sites=3 --set train.batch_size=6 --set train.steps=16
  --set parallel.reproducible=true)
"$ATOLL" launch "${C[@]}" "${W[@]}" --fail-site 1@4 --rejoin --set train.checkpoint_every=8 \
  --out "$T/m" >/dev/null 2>"$T/m.err" &
pid=$!
died=$(wait_line "$T/m/site-1/metrics.jsonl" '"step":4,' "$pid")
came=$(wait_line "$T/m/site-1/metrics.jsonl" '"step":([5-9]|1[0-9]),' "$pid")
wait "$pid" || { echo "rejoin run failed: $(tail -3 "$T/m.err")" >&2; exit 1; }
back=$(awk -v a="$died" -v b="$came" 'BEGIN { printf "%.3f", b - a }')
# The whole world from its disk checkpoint of step 8: a fresh launch with --resume.
t0=$(now)
"$ATOLL" launch "${C[@]}" "${W[@]}" --resume "$T/m/checkpoint-8" --out "$T/d" >/dev/null \
  2>"$T/d.err" &
pid=$!
disk=$(first_step "$T/d" 3 "$t0" "$pid")
wait "$pid" || { echo "resume run failed: $(tail -3 "$T/d.err")" >&2; exit 1; }
echo
echo "| restart | s |"
echo "|---|---:|"
echo "| a site, from a live site's memory (its last step's line to its new process's first, incl. 1.5 s dead-site time) | $back |"
echo "| the world, from its disk checkpoint (launch --resume to the first step) | $disk |"

python3 - "$OUT" "$back" "$disk" "${rows[@]}" <<'PY'
import json, sys
rows = [tuple(float(x) for x in l.split()) for l in sys.argv[4:]]
# Least squares of t = a + b r + c s (normal equations, 3 x 3).
X = [(1.0, r, s) for r, s, _ in rows]
y = [t for _, _, t in rows]
A = [[sum(x[i] * x[j] for x in X) for j in range(3)] for i in range(3)]
v = [sum(x[i] * t for x, t in zip(X, y)) for i in range(3)]
for i in range(3):  # Gauss-Jordan
    p = A[i][i]
    A[i] = [a / p for a in A[i]]; v[i] /= p
    for k in range(3):
        if k != i:
            f = A[k][i]
            A[k] = [a - f * b for a, b in zip(A[k], A[i])]; v[k] -= f * v[i]
out = {"fixed_s": round(v[0], 3), "per_rank_s": round(v[1], 3), "per_site_s": round(v[2], 3),
       "restart_from_memory_s": float(sys.argv[2]), "restart_from_disk_s": float(sys.argv[3]),
       "restart_sites": 3,
       "measured": [{"ranks": int(r), "sites": int(s), "seconds": t} for r, s, t in rows]}
json.dump(out, open(sys.argv[1], "w"), indent=1)
print("\nfit: launch to first step = {fixed_s} s + {per_rank_s} s x ranks per site + "
      "{per_site_s} s x sites".format(**out))
print("written to", sys.argv[1], "(atoll plan goodput --startup", sys.argv[1] + ")")
PY
