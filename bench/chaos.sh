#!/usr/bin/env bash
# Chaos: RUNS runs of `atoll launch --chaos SEED` (seeds 1..RUNS), each killing KILLS processes
# (site leaders, other ranks, the coordinator; one at a time) of a sync world of 3 sites x 2 ranks
# (configs/tiny.toml, batch 6 of micro-batches of 1, parallel.reproducible, links of 5 ms and
# 200 Mbit/s, heartbeat 0.5 s), against one process that lost nothing. Prints two markdown tables:
# per kill (what, at which step, detect and recover seconds, the step the site came back at), and
# per run (finished, bitwise equal to the clean run, wall time).
# STRATEGY=diloco|streaming|async: the same world with that strategy (H = 5, int8, 60 steps by
# default, batch 12 of micro-batches of 2), against a clean launch of it: the last validation
# loss of the lowest site that logged one, next to the clean run's (these do not end bitwise).
# Usage: bench/chaos.sh [--help] ; env: RUNS (default 20), KILLS (default 3), STEPS (default 24; 60 with
#        STRATEGY), STRATEGY (default sync), ATOLL (default build/release/atoll), DATA (default
#        .cache/data/sotu).
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-20}
KILLS=${KILLS:-3}
STRATEGY=${STRATEGY:-sync}
[[ $STRATEGY == sync ]] && STEPS=${STEPS:-24} || STEPS=${STEPS:-60}
ATOLL=${ATOLL:-build/release/atoll}
DATA=${DATA:-.cache/data/sotu}
source bench/bench_lib.sh
bench_args "$0" "$@"
export OMP_NUM_THREADS=1
T=$(mktemp -d "${TMPDIR:-/tmp}/chaos_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=6
  --set train.micro_batch_size=1 --set train.steps="$STEPS" --set train.eval_every=4
  --set parallel.reproducible=true)
L=(--set parallel.dp=2 --set world.sites=3 --set world.ranks_per_site=2
  --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0
  --set world.heartbeat_s=0.5 --insecure -q)
if [[ $STRATEGY != sync ]]; then
  C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=12
    --set train.micro_batch_size=2 --set train.steps="$STEPS" --set world.strategy="$STRATEGY"
    --set world.diloco.inner_steps=5 --set world.codec=int8)
  # streaming: 2 fragments (one every 2 or 3 steps), each exchange overlapping 1 inner step.
  [[ $STRATEGY == streaming ]] &&
    C+=(--set world.streaming.fragments=2 --set world.streaming.overlap_steps=1)
  "$ATOLL" launch "${C[@]}" "${L[@]}" --out "$T/clean" >/dev/null 2>"$T/clean.err" ||
    { echo "the clean run failed: $(tail -3 "$T/clean.err")"; exit 1; }
else
  "$ATOLL" train "${C[@]}" -q --out "$T/clean" >/dev/null 2>"$T/clean.err" ||
    { echo "the clean run failed: $(tail -3 "$T/clean.err")"; exit 1; }
fi
# last_val DIR: the last val_loss of the lowest site that logged one (a single process: its own).
last_val() {
  local f
  for f in "$1"/metrics.jsonl "$1"/site-*/metrics.jsonl; do
    [[ -f $f ]] && grep -q '"val_loss"' "$f" &&
      { grep '"val_loss"' "$f" | tail -1 | sed -E 's/.*"val_loss":([0-9.e+-]+).*/\1/'; return; }
  done
  echo -
}
clean_val=$(last_val "$T/clean")

runs="| seed | finished | bitwise = clean | last val loss (clean $clean_val) | kills recovered | wall s |"$'\n'"|---:|---|---|---:|---:|---:|"
kills="| seed | killed | at step | detect s | recover s | back at step |"$'\n'"|---:|---|---:|---:|---:|---:|"
finished=0 bitwise=0
for seed in $(seq 1 "$RUNS"); do
  out="$T/run-$seed"
  t0=$(date +%s.%N)
  rc=0
  "$ATOLL" launch "${C[@]}" "${L[@]}" --chaos "$seed" --chaos-kills "$KILLS" --out "$out" \
    >"$out.out" 2>"$out.err" || rc=$?
  wall=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  same=no
  [[ $STRATEGY == sync ]] || same=-
  if [[ $rc == 0 && $STRATEGY == sync ]]; then
    if cmp -s "$T/clean/checkpoint/model.safetensors" "$out/checkpoint/model.safetensors" &&
      cmp -s "$T/clean/checkpoint/optimizer.safetensors" "$out/checkpoint/optimizer.safetensors"; then
      same=yes
      bitwise=$((bitwise + 1))
    fi
  fi
  [[ $rc == 0 ]] && finished=$((finished + 1))
  recovered=0 total=0
  if [[ -f $out/chaos.jsonl ]]; then
    while IFS= read -r line; do
      total=$((total + 1))
      row=$(python3 -c '
import json, sys
j = json.loads(sys.argv[1])
r = j["recover_s"]
print("| {} | {} | {} | {:.2f} | {} | {} |".format(sys.argv[2], j["kill"], max(j["at_steps"]),
      j["detect_s"], "never" if r < 0 else "{:.2f}".format(r),
      "-" if j["back_at"] < 0 else j["back_at"]))
print("ok" if r >= 0 else "no", file=sys.stderr)' "$line" "$seed" 2>"$T/ok")
      kills+=$'\n'"$row"
      [[ $(cat "$T/ok") == ok ]] && recovered=$((recovered + 1))
    done <"$out/chaos.jsonl"
  fi
  runs+=$'\n'"| $seed | $([[ $rc == 0 ]] && echo yes || echo "no (exit $rc)") | $same | $(last_val "$out") | $recovered / $total | $wall |"
  [[ $rc == 0 ]] || { echo "seed $seed failed; its launch stderr:" >&2; tail -15 "$out.err" >&2; }
done
echo "$kills"
echo
echo "$runs"
echo
echo "$STRATEGY: $finished / $RUNS runs finished$([[ $STRATEGY == sync ]] && echo "; $bitwise / $RUNS bitwise equal to the clean run")"
