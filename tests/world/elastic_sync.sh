#!/usr/bin/env bash
# Elastic sync end to end, with `atoll launch` (3 sites x 1 rank, configs/tiny.toml, emulated
# links of 5 ms): site 0 (which validates and writes checkpoints) dies abruptly after step 6; the
# coordinator declares it dead, sites 1 and 2 take over its micro-batches and finish. With
# parallel.reproducible the final parameters and moments are bitwise those of one process that
# lost nothing; site 1 validates after the loss and writes the checkpoint. Then a site with a stuck
# core (a persistent fault from step 5 on) is named by the audit replay's peer check and, with
# sdc.on_faulty = exclude, leaves the world: the others end with the same bits. Last, site 1 dies
# after step 5 and a new process (--rejoin) fetches a live site's state, joins at a later step
# and takes its micro-batches back: the same bits again. Then a rank of a 2-rank site is killed:
# launch starts the site again and it rejoins. Last, the coordinator is killed and started again.
# Usage: elastic_sync.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=6
  --set train.micro_batch_size=1 --set train.steps=16 --set train.eval_every=4
  --set parallel.reproducible=true)

"$ATOLL" train "${C[@]}" -q --out "$T/one" >/dev/null 2>"$T/one.err" ||
  fail "the single process failed: $(tail -5 "$T/one.err")"

rc=0
"$ATOLL" launch "${C[@]}" --set world.sites=3 --set world.link.latency_ms=5 \
  --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 \
  --insecure -q --fail-site 0@6 --out "$T/w" >"$T/w.out" 2>"$T/w.err" || rc=$?
[[ $rc == 0 ]] || fail "sync with site 0 lost exited $rc: $(tail -20 "$T/w.err")"
grep -q "site 0 ended" "$T/w.err" || fail "launch did not report site 0's loss: $(tail "$T/w.err")"
grep -q '"death"' "$T/w/coordinator.log" || fail "the coordinator logged no death"
grep -q "take over their micro-batches" "$T/w/site-1/train.log" ||
  fail "site 1 did not take over: $(tail -20 "$T/w/site-1/train.log")"
same_files "$T/one/checkpoint/model.safetensors" "$T/w/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/w/checkpoint/optimizer.safetensors"
# Site 0 validated steps 4 (before its loss); site 1 the rest, with the single process's values.
[[ $(grep -c '"val_loss"' "$T/w/site-0/metrics.jsonl") == 1 ]] || fail "site 0's validations"
[[ $(grep -c '"val_loss"' "$T/w/site-1/metrics.jsonl") == 3 ]] || fail "site 1's validations"
diff <(grep '"step":16' "$T/one/metrics.jsonl" | column val_loss /dev/stdin) \
  <(grep '"step":16' "$T/w/site-1/metrics.jsonl" | column val_loss /dev/stdin) >/dev/null ||
  fail "site 1's last val_loss differs from the single process's"

rc=0
"$ATOLL" launch "${C[@]}" --set world.sites=3 --set world.heartbeat_s=0.5 \
  --set sdc.audit_every=1 --set sdc.on_faulty=exclude \
  --set faults.inject=bad_core:step=5,site=2,layer=1,gemm=2,p=1,bit=27,stuck=1 \
  --insecure -q --out "$T/x" >"$T/x.out" 2>"$T/x.err" || rc=$?
[[ $rc == 0 ]] || fail "sync excluding a faulty site exited $rc: $(tail -20 "$T/x.err")"
grep -q "site 2 leaves the world" "$T/x/site-2/train.log" ||
  fail "site 2 did not leave: $(tail -20 "$T/x/site-2/train.log")"
grep -q '"verdict":"faulty_rank"' "$T/x/site-0/metrics.jsonl" || fail "site 0 named no faulty site"
same_files "$T/one/checkpoint/model.safetensors" "$T/x/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/x/checkpoint/optimizer.safetensors"

# The same with sites of 3 ranks (dp 3 inside each): the in-site peer check names the rank, its
# whole site leaves cleanly (a Leave, no death: its other ranks wait for it), and the others end
# bitwise equal to one process.
C9=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=9
  --set train.micro_batch_size=1 --set train.steps=10 --set train.eval_every=4
  --set parallel.reproducible=true)
"$ATOLL" train "${C9[@]}" -q --out "$T/one9" >/dev/null 2>"$T/one9.err" ||
  fail "the single process (batch 9) failed: $(tail -5 "$T/one9.err")"
rc=0
"$ATOLL" launch "${C9[@]}" --set parallel.dp=3 --set world.sites=3 --set world.ranks_per_site=3 \
  --set world.heartbeat_s=0.5 --set sdc.audit_every=1 --set sdc.on_faulty=exclude \
  --set faults.inject=bad_core:step=5,site=2,layer=1,gemm=2,p=1,bit=27,stuck=1 \
  --insecure -q --out "$T/x3" >"$T/x3.out" 2>"$T/x3.err" || rc=$?
[[ $rc == 0 ]] || fail "3-rank sites excluding a faulty site exited $rc: $(tail -20 "$T/x3.err")"
! grep -q '"death"' "$T/x3/coordinator.log" || fail "the faulty 3-rank site died instead of leaving"
same_files "$T/one9/checkpoint/model.safetensors" "$T/x3/checkpoint/model.safetensors"

rc=0
# The emulated links keep the steps long enough (about 0.9 s) for the new process to start and
# register before the run's end, also on a loaded machine.
"$ATOLL" launch "${C[@]}" --set world.sites=3 --set world.link.latency_ms=5 \
  --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 \
  --insecure -q --fail-site 1@5 --rejoin --out "$T/r" >"$T/r.out" 2>"$T/r.err" || rc=$?
[[ $rc == 0 ]] || fail "sync with site 1 lost and rejoined exited $rc: $(tail -20 "$T/r.err")"
grep -q "took over at step" "$T/r/site-1/rejoin.log" ||
  fail "site 1's new process did not take over: $(tail -20 "$T/r/site-1/rejoin.log")"
grep -q "site(s) 1 back" "$T/r/site-0/train.log" || fail "site 0 did not take site 1 back"
[[ $(tail -1 "$T/r/site-1/metrics.jsonl" | column step /dev/stdin) == 16 ]] ||
  fail "site 1's new process did not train to the end"
same_files "$T/one/checkpoint/model.safetensors" "$T/r/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/r/checkpoint/optimizer.safetensors"

# A lost rank: sites of 2 ranks; rank 1 of site 1 is killed (-9) after step 4. MPI cannot shrink
# the site, so mpirun ends its other rank (exit 137); launch starts the site again (--rejoin),
# whose two new processes take over from a live site and rejoin.
rc=0
"$ATOLL" launch "${C[@]}" --set parallel.dp=2 --set world.sites=3 --set world.ranks_per_site=2 \
  --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 \
  --set world.heartbeat_s=0.5 --insecure -q --rejoin --out "$T/k" >"$T/k.out" 2>"$T/k.err" &
launched=$!
victim=""
wait_for_step "$T/k/site-1/metrics.jsonl" 4
for p in $(pgrep -f -- "$T/k/config.toml --site 1 " || true); do
  if tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx OMPI_COMM_WORLD_RANK=1 &&
    tr '\0' ' ' <"/proc/$p/cmdline" | grep -q " train "; then
    victim=$p
  fi
done
[[ -n $victim ]] || { kill "$launched"; fail "no rank 1 of site 1 to kill"; }
kill -9 "$victim"
wait "$launched" || rc=$?
[[ $rc == 0 ]] || fail "sync with a rank of site 1 killed exited $rc: $(tail -20 "$T/k.err")"
grep -q "site 1 ended (exit status 137).*starting a new process" "$T/k.err" ||
  fail "launch did not start site 1 again: $(tail "$T/k.err")"
grep -q "took over at step" "$T/k/site-1/rejoin.log" ||
  fail "site 1's new processes did not take over: $(tail -20 "$T/k/site-1/rejoin.log")"
same_files "$T/one/checkpoint/model.safetensors" "$T/k/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/k/checkpoint/optimizer.safetensors"

# The coordinator killed (-9) after step 6: launch starts it again at its address, from its
# durable log; the sites retry their rounds meanwhile and none of them exits.
"$ATOLL" launch "${C[@]}" --set world.sites=3 --set world.link.latency_ms=5 \
  --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 \
  --insecure -q --out "$T/c" >"$T/c.out" 2>"$T/c.err" &
kill_coordinator_at "$T/c" 6 $! sync
same_files "$T/one/checkpoint/model.safetensors" "$T/c/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/c/checkpoint/optimizer.safetensors"
echo "elastic sync: site 0 lost after step 6, a faulty site 2 excluded at step 5, site 1 lost"
echo "and rejoined, a rank of site 1 killed and its site started again, the coordinator killed and"
echo "started again: every run ended bitwise equal to one process"
