#!/usr/bin/env bash
# The low-communication and asynchronous strategies end to end, with `atoll launch` (3 sites x 1
# rank, configs/tiny.toml, links of 5 ms and 200 Mbit/s, 1 s heartbeats):
#   1. diloco (H = 5, int8) with site 0 dying after step 8: the world goes on (exit 0, the view
#      says so), sites 1 and 2 finish every step, site 0's metrics stop at 8, the coordinator
#      logged the death, site 1 (the lowest live site) validates and writes the checkpoint; then
#      site 2 dies with --rejoin: a new process takes site 2 over and all three sites finish;
#   2. streaming (P = 2, tau = 1, int4): finishes; far fewer WAN bytes than sync would have sent;
#   3. async (H = 4, int8): finishes with an operation log; `atoll replay` reproduces the final
#      parameters bitwise; a tampered log is caught (exit 1, naming the update); a run with a site
#      taken over by a new process (--rejoin; site 0, whose duties move to site 1 meanwhile)
#      replays bitwise too; so does a run whose coordinator was killed (-9) and started again by
#      launch (the parameter server's state from its snapshot); a run resumed from a checkpoint
#      goes on from each site's state beside it and replays bitwise from there; a run dir that is
#      not async is refused (exit 2);
#   4. the memory checks found nothing in any of these runs.
# Usage: strategies.sh ATOLL MPIEXEC [PART]  (PART: lowcomm = 1 and 2, async = 3 and 3b,
# restarts = 3c to 3d; all by default. ctest runs each part as a test of its own,
# world_strategies_PART, with its own time limit)
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC [lowcomm|async|restarts]}
PART=${3:-all}
case $PART in lowcomm | async | restarts | all) ;; *) echo "unknown part: $PART" >&2 && exit 2 ;; esac
runs() { [[ $PART == all || $PART == "$1" ]]; }  # whether this run has part $1
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

W=(--config configs/tiny.toml --set data.dir="$DATA" --set world.sites=3 --set train.batch_size=6
  --set train.micro_batch_size=2 --set train.steps=20 --set world.link.latency_ms=5
  --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5
  --insecure)

last_step() { tail -1 "$1" | sed -E 's/.*"step":([0-9]+).*/\1/'; }
field() { tail -1 "$2" | sed -E "s/.*\"$1\":([0-9.e+-]+).*/\1/"; }
# The memory checks (on by default) found nothing in these runs: an exchange or a rejoin that
# replaces parameters between steps is not corruption at rest.
expect_no_memory_events() {
  local run m
  for run in "$@"; do
    for m in "$T/$run"/site-*/metrics.jsonl; do
      if grep -q '"detector":"memory"' "$m"; then
        fail "memory-check events in a clean run ($m): $(grep -m1 '"memory"' "$m")"
      fi
    done
  done
}

if runs lowcomm; then
  # 1. DiLoCo survives the death of site 0, whose duties move to site 1.
  rc=0
  "$ATOLL" launch "${W[@]}" --set world.strategy=diloco --set world.diloco.inner_steps=5 \
    --set world.codec=int8 --fail-site 0@8 --out "$T/d" >"$T/d.out" 2>"$T/d.err" || rc=$?
  [[ $rc == 0 ]] || fail "diloco with a lost site exited $rc: $(tail -20 "$T/d.err")"
  grep -q "site 0 ended" "$T/d.err" ||
    fail "launch did not report site 0's loss: $(tail "$T/d.err")"
  [[ -f $T/d/checkpoint/model.safetensors ]] || fail "diloco: no checkpoint"
  [[ $(last_step "$T/d/site-1/metrics.jsonl") == 20 ]] || fail "site 1 did not finish"
  [[ $(last_step "$T/d/site-2/metrics.jsonl") == 20 ]] || fail "site 2 did not finish"
  [[ $(last_step "$T/d/site-0/metrics.jsonl") == 8 ]] || fail "site 0 went past step 8"
  grep -q '"death"' "$T/d/coordinator.log" || fail "the coordinator logged no death"
  grep -q '"outer_rounds":4' "$T/d/site-1/metrics.jsonl" || fail "site 1 lacks 4 outer rounds"
  # Validation at steps 10 and 20 by the lowest live site: site 1 (site 0 was lost at 8).
  tail -1 "$T/d/site-1/metrics.jsonl" | grep -q '"val_loss"' || fail "site 1 did not validate last"
  ! grep -q '"val_loss"' "$T/d/site-2/metrics.jsonl" || fail "site 2 validated too"
  grep -q "exchanges (diloco)" "$T/d/site-1/train.log" || fail "no exchange summary in site 1's log"

  # 1b. The lost site comes back: a new process takes it over (launch --rejoin), fetches the state
  # from a live site, joins at an exchange boundary and trains to the end with the others.
  rc=0
  # 150 steps over 20 ms links: the others are still at it when the new process is ready.
  "$ATOLL" launch "${W[@]}" --set world.strategy=diloco --set world.diloco.inner_steps=5 \
    --set world.codec=int8 --set train.steps=150 --set world.link.latency_ms=20 \
    --fail-site 2@8 --rejoin --out "$T/r" >"$T/r.out" 2>"$T/r.err" || rc=$?
  [[ $rc == 0 ]] || fail "diloco with a rejoining site exited $rc: $(tail -20 "$T/r.err")"
  grep -q "take it over" "$T/r.err" || fail "launch did not restart site 2: $(tail "$T/r.err")"
  grep -q "took over at step" "$T/r/site-2/rejoin.log" ||
    fail "site 2 did not rejoin: $(tail -20 "$T/r/site-2/rejoin.log")"
  for s in 0 1 2; do
    [[ $(last_step "$T/r/site-$s/metrics.jsonl") == 150 ]] || fail "site $s did not finish (rejoin)"
  done
  grep -q '"join_round"' "$T/r/coordinator.log" || fail "the coordinator logged no rejoin"
  grep -q "reconnecting to site 2" "$T/r/site-0/train.log" ||
    fail "site 0 did not reconnect to site 2"
  [[ -f $T/r/checkpoint/model.safetensors ]] || fail "rejoin: no checkpoint"
  # 1c. DiLoCo resumed from a mid-round checkpoint (step 8 of rounds of 5): every site takes its own
  # state from beside it (its replica, error feedback, inner AdamW, the global parameters and
  # momentum) and the run ends bitwise as the one that did not stop.
  rc=0
  "$ATOLL" launch "${W[@]}" --set world.strategy=diloco --set world.diloco.inner_steps=5 \
    --set world.codec=int8 --set train.checkpoint_every=8 -q --out "$T/k" >/dev/null 2>"$T/k.err" ||
    fail "diloco with checkpoints: $(tail -5 "$T/k.err")"
  [[ -f $T/k/checkpoint-8.sites/site-2.bin ]] || fail "no per-site state beside checkpoint-8"
  "$ATOLL" launch "${W[@]}" --set world.strategy=diloco --set world.diloco.inner_steps=5 \
    --set world.codec=int8 --set train.checkpoint_every=8 -q --resume "$T/k/checkpoint-8" \
    --out "$T/kr" >/dev/null 2>"$T/kr.err" || fail "diloco resumed: $(tail -5 "$T/kr.err")"
  [[ $(head -1 "$T/kr/site-1/metrics.jsonl" | column step /dev/stdin) == 9 ]] ||
    fail "the resumed run did not start at step 9"
  same_files "$T/k/checkpoint/model.safetensors" "$T/kr/checkpoint/model.safetensors"
  same_files "$T/k/checkpoint/optimizer.safetensors" "$T/kr/checkpoint/optimizer.safetensors"
  rm "$T/k/checkpoint-8.sites/site-1.bin"
  expect_exit 2 "$ATOLL" launch "${W[@]}" --set world.strategy=diloco --resume "$T/k/checkpoint-8" \
    --out "$T/kx"
  expect_err "site-1.bin is missing"

  # --rejoin is refused where it cannot work.
  expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --rejoin \
    --out "$T/bad"
  expect_err "world.sites > 1"

  # 2. Streaming with int4: fewer bytes than sync by far.
  rc=0
  "$ATOLL" launch "${W[@]}" --set world.strategy=streaming --set world.diloco.inner_steps=10 \
    --set world.streaming.fragments=2 --set world.streaming.overlap_steps=1 \
    --set world.codec=int4 --out "$T/s" >"$T/s.out" 2>"$T/s.err" || rc=$?
  [[ $rc == 0 ]] || fail "streaming exited $rc: $(tail -20 "$T/s.err")"
  for s in 0 1 2; do
    m="$T/s/site-$s/metrics.jsonl"
    [[ $(last_step "$m") == 20 ]] || fail "streaming site $s did not finish"
    sent=$(field wan_bytes_sent "$m")
    sync=$(field sync_bytes_sent "$m")
    awk -v a="$sent" -v b="$sync" 'BEGIN { exit !(a > 0 && a * 20 < b) }' ||
      fail "streaming site $s sent $sent bytes, sync would have sent $sync"
  done

  # Not an async run.
  expect_exit 2 "$ATOLL" replay --run "$T/d" -q
  expect_err "async"
  expect_no_memory_events d r s
fi

if runs async; then
  # 3. Async, then replay.
  rc=0
  "$ATOLL" launch "${W[@]}" --set world.strategy=async --set world.diloco.inner_steps=4 \
    --set world.codec=int8 --set world.async.max_staleness=1 --out "$T/a" >"$T/a.out" \
    2>"$T/a.err" || rc=$?
  [[ $rc == 0 ]] || fail "async exited $rc: $(tail -20 "$T/a.err")"
  [[ -f $T/a/ops.jsonl ]] || fail "async: no operation log"
  updates=$(grep -c '"t":"update"' "$T/a/ops.jsonl")
  [[ $updates == 15 ]] || fail "async: $updates logged updates, 15 expected (3 sites x 5 pushes)"
  expect_exit 0 "$ATOLL" replay --run "$T/a" -q
  grep -q "bitwise identical" "$T/out" || fail "replay: $(cat "$T/out")"
  # A tampered log: another checksum for update 3.
  cp -r "$T/a" "$T/a2"
  python3 - "$T/a2/ops.jsonl" <<'PY'
import json, sys
p = sys.argv[1]
lines = open(p).read().splitlines()
out = []
for l in lines:
    j = json.loads(l)
    if j.get("t") == "update" and j.get("id", j.get("update_id")) == 3:
        j["checksum"] = "0123456789abcdef"
        l = json.dumps(j, separators=(",", ":"))
    out.append(l)
open(p, "w").write("\n".join(out) + "\n")
PY
  expect_exit 1 "$ATOLL" replay --run "$T/a2" -q
  expect_err "update 3"
  # The op log names the run's build and CPU; a replay elsewhere (here: a log claiming another
  # build) says so, and still replays (bitwise here: it is the same build really).
  grep -q '"build":"' "$T/a/ops.jsonl" || fail "async: the init record names no build"
  grep -q '"cpu":"' "$T/a/ops.jsonl" || fail "async: the init record names no CPU"
  cp -r "$T/a" "$T/a3"
  sed -i -E '1s/"build":"[^"]*"/"build":"0123456789abcdef0123456789abcdef01234567"/' \
    "$T/a3/ops.jsonl"
  expect_exit 0 "$ATOLL" replay --run "$T/a3" -q
  expect_err "the run's build was 0123456789abcdef"
  # Other data than the run's is refused before anything runs (exit 2).
  mkdir -p "$T/otherdata"
  cp "$DATA/val.bin" "$T/otherdata/val.bin"
  cp "$DATA/val.bin" "$T/otherdata/train.bin"  # a valid token file, not the run's
  cp -r "$T/a" "$T/a4"
  sed -i -E "s#^dir = .*#dir = \"$T/otherdata\"#" "$T/a4/config.toml"
  grep -q "otherdata" "$T/a4/config.toml" || fail "could not point the run at other data"
  expect_exit 2 "$ATOLL" replay --run "$T/a4" -q
  expect_err "is not the run's"
  # 3b. Async with a lost site taken over by a new process: it goes on after the site's last push,
  # the op log records it, and replay re-executes both processes bitwise. With checkpoints every 40
  # steps, the new process meets the others from the cut after the next one past the latest round
  # (step 80 or 120) on, so the later checkpoints keep its site's state too.
  rc=0
  "$ATOLL" launch "${W[@]}" --set world.strategy=async --set world.diloco.inner_steps=4 \
    --set world.codec=int8 --set world.async.max_staleness=1 --set train.steps=240 \
    --set train.checkpoint_every=40 --fail-site 0@8 --rejoin --out "$T/ar" >"$T/ar.out" \
    2>"$T/ar.err" || rc=$?
  [[ $rc == 0 ]] || fail "async with a rejoining site exited $rc: $(tail -20 "$T/ar.err")"
  grep -q "took over after step 8" "$T/ar/site-0/rejoin.log" ||
    fail "async: site 0 did not take over: $(tail -20 "$T/ar/site-0/rejoin.log")"
  [[ $(last_step "$T/ar/site-0/metrics.jsonl") == 240 ]] || fail "async: site 0 did not finish"
  grep -q '"t":"rejoin"' "$T/ar/ops.jsonl" || fail "async: no rejoin record in the op log"
  k=$(grep -o "meets the others from the checkpoint cut at step [0-9]*" "$T/ar/site-0/rejoin.log" |
    grep -o "[0-9]*$" || true)
  [[ -n $k && $k -le 200 ]] ||
    fail "async: site 0's new process did not join a cut: $(grep -i cut "$T/ar/site-0/rejoin.log")"
  for s in 0 1 2; do
    [[ -f $T/ar/checkpoint-200.sites/site-$s.bin ]] || fail "async: no state of site $s at step 200"
  done
  expect_exit 0 "$ATOLL" replay --run "$T/ar" -q
  grep -q "bitwise identical" "$T/out" || fail "replay of a rejoined run: $(cat "$T/out")"
  expect_no_memory_events a ar
fi

if runs restarts; then
  # 3c. Async with the coordinator killed (-9) after step 20 of site 1: launch starts it again; the
  # parameter server's state comes back from its snapshot and op log, no site exits, and the run
  # replays bitwise.
  "$ATOLL" launch "${W[@]}" --set world.strategy=async --set world.diloco.inner_steps=4 \
    --set world.codec=int8 --set world.async.max_staleness=1 --set train.steps=120 -q \
    --out "$T/ac" >"$T/ac.out" 2>"$T/ac.err" &
  kill_coordinator_at "$T/ac" 20 $! async
  grep -q "parameter server recovered" "$T/ac/coordinator.stderr" ||
    fail "the parameter server did not recover: $(tail "$T/ac/coordinator.stderr")"
  expect_exit 0 "$ATOLL" replay --run "$T/ac" -q
  grep -q "bitwise identical" "$T/out" ||
    fail "replay across a coordinator restart: $(cat "$T/out")"
  # 3c'. Async losing site 0 for good after step 10 (it wrote checkpoint-8 and validated at 10),
  # with checkpoints every 8 steps (push steps, H = 4): at the next checkpoint's cut the sites that
  # met there agree that site 1 leads, so site 1 writes the mid-run checkpoints and validates from
  # then on.
  "$ATOLL" launch "${W[@]}" --set world.strategy=async --set world.diloco.inner_steps=4 \
    --set world.codec=int8 --set train.checkpoint_every=8 --set train.steps=40 --fail-site 0@10 \
    -q --out "$T/al" >/dev/null 2>"$T/al.err" || fail "async losing site 0: $(tail -5 "$T/al.err")"
  for k in 16 24 32; do
    [[ -f $T/al/checkpoint-$k/model.safetensors ]] ||
      fail "async: no checkpoint-$k after site 0 died"
  done
  grep -q '"step":20,.*"val_loss"' "$T/al/site-1/metrics.jsonl" ||
    fail "async: site 1 did not validate at step 20 after site 0 died"
  ! grep -q '"step":20,.*"val_loss"' "$T/al/site-2/metrics.jsonl" || fail "async: site 2 validated"
  # 3d. Async resumed from checkpoint-8 (H = 4): the sites met around their push at step 8 (rounds
  # 15 and 16), each kept its error feedback, AdamW and counters beside the checkpoint; the resumed
  # run (to step 160) starts its parameter server from the checkpoint and every site at step 9
  # (site 2's push count goes on from its 2). Site 1 dies after step 9, before its first push
  # since: its new process goes on from the site's state beside the checkpoint; site 0 dies after
  # its push at 12: its new process goes on from there (a rejoin record). The resumed run replays
  # bitwise from the checkpoint (launch wrote where it resumed from). A missing site state is
  # refused (exit 2).
  AK=(--set world.strategy=async --set world.diloco.inner_steps=4 --set world.codec=int8
    --set world.async.max_staleness=1 --set train.checkpoint_every=8 -q)
  "$ATOLL" launch "${W[@]}" "${AK[@]}" --out "$T/ak" >/dev/null 2>"$T/ak.err" ||
    fail "async with checkpoints: $(tail -5 "$T/ak.err")"
  for s in 0 1 2; do
    [[ -f $T/ak/checkpoint-8.sites/site-$s.bin ]] || fail "async: no state of site $s at step 8"
  done
  grep -q '"round":15,' "$T/ak/coordinator.log" && grep -q '"round":16,' "$T/ak/coordinator.log" ||
    fail "async: the sites did not meet at step 8's checkpoint"
  "$ATOLL" launch "${W[@]}" "${AK[@]}" --set train.steps=160 --resume "$T/ak/checkpoint-8" \
    --fail-site 1@9 --fail-site 0@12 --rejoin --out "$T/akr" >/dev/null 2>"$T/akr.err" ||
    fail "async resumed: $(tail -5 "$T/akr.err")"
  for s in 0 1 2; do
    [[ $(head -1 "$T/akr/site-$s/metrics.jsonl" | column step /dev/stdin) == 9 ]] ||
      fail "async resumed: site $s did not start at step 9"
    [[ $(last_step "$T/akr/site-$s/metrics.jsonl") == 160 ]] || fail "async resumed: site $s"
  done
  grep -q "site 2: 40 pushes" "$T/akr/site-2/train.log" ||
    fail "async resumed: site 2's counters: $(grep pushes "$T/akr/site-2/train.log")"
  grep -q "took over at step 8 from the site's state" "$T/akr/site-1/rejoin.log" ||
    fail "async resumed: site 1's new process: $(tail -5 "$T/akr/site-1/rejoin.log")"
  grep -q "took over after step 12" "$T/akr/site-0/rejoin.log" ||
    fail "async resumed: site 0's new process: $(tail -5 "$T/akr/site-0/rejoin.log")"
  [[ $(grep -c '"t":"rejoin"' "$T/akr/ops.jsonl") == 1 ]] || fail "async resumed: rejoin records"
  grep -q '"first_step":9,' "$T/akr/ops.jsonl" || fail "async resumed: no push of steps 9.."
  expect_exit 0 "$ATOLL" replay --run "$T/akr" -q
  grep -q "bitwise identical" "$T/out" || fail "replay of a resumed async run: $(cat "$T/out")"
  rm "$T/ak/checkpoint-8.sites/site-2.bin"
  expect_exit 2 "$ATOLL" launch "${W[@]}" "${AK[@]}" --resume "$T/ak/checkpoint-8" --out "$T/akx"
  expect_err "site-2.bin is missing"
fi
echo "OK"
