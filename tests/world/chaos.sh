#!/usr/bin/env bash
# `atoll launch --chaos` end to end: a sync world of 3 sites x 2 ranks (configs/tiny.toml,
# parallel.reproducible) where seed 3 kills the coordinator twice and rank 1 of site 2 once, one
# at a time: every kill is recovered from (DIR/chaos.jsonl), the run finishes, and its checkpoint
# is bitwise the one of a single process that lost nothing. A run too short for its kills is
# refused (exit 2). bench/chaos.sh runs twenty seeds.
# Usage: chaos.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=6
  --set train.micro_batch_size=1 --set train.steps=24 --set train.eval_every=4
  --set parallel.reproducible=true)
W=(--set parallel.dp=2 --set world.sites=3 --set world.ranks_per_site=2
  --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0
  --set world.heartbeat_s=0.5 --insecure -q)

"$ATOLL" train "${C[@]}" -q --out "$T/one" >/dev/null 2>"$T/one.err" ||
  fail "the single process failed: $(tail -5 "$T/one.err")"

rc=0
"$ATOLL" launch "${C[@]}" "${W[@]}" --chaos 3 --out "$T/c" >"$T/c.out" 2>"$T/c.err" || rc=$?
[[ $rc == 0 ]] || fail "the chaos run exited $rc: $(tail -20 "$T/c.err")"
[[ $(grep -c "launch --chaos: killed" "$T/c.err") == 3 ]] || fail "3 kills: $(cat "$T/c.err")"
grep -q "killed the coordinator" "$T/c.err" || fail "the coordinator was not killed"
grep -q "killed rank 1 of site" "$T/c.err" || fail "no rank was killed"
[[ $(wc -l <"$T/c/chaos.jsonl") == 3 ]] || fail "chaos.jsonl: $(cat "$T/c/chaos.jsonl")"
! grep -q '"recover_s":-1' "$T/c/chaos.jsonl" || fail "a kill not recovered: $(cat "$T/c/chaos.jsonl")"
same_files "$T/one/checkpoint/model.safetensors" "$T/c/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/c/checkpoint/optimizer.safetensors"

expect_exit 2 "$ATOLL" launch "${C[@]}" "${W[@]}" --set train.steps=8 --chaos 1 --out "$T/short"
expect_err "3 kills need train.steps >= 15"
echo "chaos: 3 kills (the coordinator twice, a rank) recovered; bitwise equal to one process"
