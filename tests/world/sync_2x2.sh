#!/usr/bin/env bash
# Hierarchical synchronous training across sites, by hand (no launcher): a coordinator and two
# sites of two MPI ranks each (configs/tiny.toml, 20 steps, micro-batches of 1, emulated links of
# 5 ms and 200 Mbit/s) give the single-process loss curve within 1e-5 relative; site 0 writes the
# checkpoint; each site's metrics carry its index and the WAN time. Site 0 listens on 0.0.0.0 and
# advertises 127.0.0.1 (a wildcard without --wan-advertise: exit 2). Then the faults: a site with a
# different model config is refused at registration (exit 2) with a message on both sides.
# Usage: sync_2x2.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

COORD_PID=
cleanup() { [[ -n $COORD_PID ]] && kill "$COORD_PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$T"; }
trap cleanup EXIT

# coordinator SITES: starts one on a free port; sets ADDR.
coordinator() {
  rm -f "$T/addr"  # not the address of the one before
  "$ATOLL" coordinator --listen 127.0.0.1:0 --sites "$1" --state "$T/coord" --insecure \
    --heartbeat-s 0.5 >"$T/addr" 2>"$T/coord.err" &
  COORD_PID=$!
  coordinator_address "$T/addr" "$COORD_PID" "$T/coord.err"
}

W=(--config configs/tiny.toml --set data.dir="$DATA" --set train.micro_batch_size=1
  --set world.sites=2 --set world.ranks_per_site=2 --set parallel.dp=2
  --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200 -q --insecure)

"$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --set train.micro_batch_size=1 \
  -q --out "$T/one" >/dev/null

coordinator 2
rc0=0 rc1=0
# Site 0 listens on every interface and advertises the address the others dial (port 0: the port
# it bound); a wildcard listen without --wan-advertise is refused before anything starts.
expect_exit 2 "$ATOLL" train "${W[@]}" --coordinator "$ADDR" --site 0 --out "$T/x" \
  --wan-listen 0.0.0.0:0
expect_err "--wan-advertise"
# Each mpirun its own Open MPI session directory: two starting side by side in one race on it.
mkdir -p "$T/ompi-0" "$T/ompi-1"
OMPI_MCA_orte_tmpdir_base="$T/ompi-0" \
  "$MPIEXEC" -n 2 "$ATOLL" train "${W[@]}" --coordinator "$ADDR" --site 0 --out "$T/site-0" \
  --checkpoint-dir "$T/w" --wan-listen 0.0.0.0:0 --wan-advertise 127.0.0.1:0 \
  >"$T/s0.out" 2>"$T/s0.err" &
p0=$!
OMPI_MCA_orte_tmpdir_base="$T/ompi-1" \
  "$MPIEXEC" -n 2 "$ATOLL" train "${W[@]}" --coordinator "$ADDR" --site 1 --out "$T/site-1" \
  --checkpoint-dir "$T/w" >"$T/s1.out" 2>"$T/s1.err" || rc1=$?
wait "$p0" || rc0=$?
[[ $rc0 == 0 && $rc1 == 0 ]] ||
  fail "sites exited $rc0 / $rc1: $(tail -5 "$T/s0.err") $(tail -5 "$T/s1.err")"
[[ $(cat "$T/s0.out") == "$T/w/checkpoint" ]] || fail "site 0 printed '$(cat "$T/s0.out")'"
[[ -f $T/w/checkpoint/model.safetensors ]] || fail "no checkpoint"
for s in 0 1; do
  f="$T/site-$s/metrics.jsonl"
  grep -q "\"site\":$s" "$f" || fail "$f lacks the site"
  grep -q '"wan_ms"' "$f" || fail "$f lacks wan_ms"
done
# Site 0 validates like the single process; site 1 logs the same losses without val_loss.
close "$T/one/metrics.jsonl" "$T/site-0/metrics.jsonl"
paste <(column loss "$T/one/metrics.jsonl") <(column loss "$T/site-1/metrics.jsonl") | awk '
  { d = $1 - $2; if (d < 0) d = -d; if (d > 1e-5 * $1) { print "site 1 loss at step " NR ": " $2 " vs " $1; exit 1 } }' ||
  fail "site 1's loss curve differs"
kill "$COORD_PID"
wait "$COORD_PID" 2>/dev/null || true
grep -q '"event"' "$T/coord/coordinator.log" 2>/dev/null || grep -q . "$T/coord/coordinator.log" ||
  fail "the coordinator wrote no log"

# A site with another model shape is refused at registration, with a message on both sides.
rm -rf "$T/coord"
coordinator 2
OMPI_MCA_orte_tmpdir_base="$T/ompi-0" \
  "$MPIEXEC" -n 2 "$ATOLL" train "${W[@]}" --coordinator "$ADDR" --site 0 --out "$T/b0" \
  >/dev/null 2>"$T/b0.err" &
p0=$!
# Site 0 registers first (its config is the reference), then site 1 arrives with another shape.
for _ in $(seq 1200); do
  grep -q '"site":0' "$T/coord/coordinator.log" 2>/dev/null && break
  kill -0 "$p0" 2>/dev/null || fail "site 0 exited before registering: $(tail -5 "$T/b0.err")"
  sleep 0.1
done
grep -q '"site":0' "$T/coord/coordinator.log" || fail "site 0 did not register within 120 s"
expect_exit 2 env OMPI_MCA_orte_tmpdir_base="$T/ompi-1" \
  "$MPIEXEC" -n 2 "$ATOLL" train "${W[@]}" --set model.n_embd=64 \
  --coordinator "$ADDR" --site 1 --out "$T/b1"
grep -qi "config" "$T/err" || fail "the refused site's error does not mention the config: $(cat "$T/err")"
kill "$p0" 2>/dev/null || true
wait "$p0" 2>/dev/null || true
grep -qi "config" "$T/coord.err" "$T/coord/coordinator.log" ||
  fail "the coordinator did not log the refusal"
echo "PASS: 2 sites x 2 ranks sync training"
