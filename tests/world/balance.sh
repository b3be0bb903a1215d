#!/usr/bin/env bash
# world.balance end to end: a sync world of 3 sites x 1 rank (configs/tiny.toml, batch 18 of
# micro-batches of 1, parallel.reproducible) where site 2 is three times slower (--slow-site 2:3)
# and site 1 dies after step 3 and comes back (--fail-site 1@3 --rejoin): the shares follow the
# measured speeds (site 2 gets fewer than its 6 micro-batches; the lost site none; equal again
# when it is back), and the run ends bitwise equal to one process that computed every
# micro-batch itself. The same world in diloco (H = 3, site 1 lost after step 4): the shares
# follow the paces voted at each exchange, the live sites take the lost site's micro-batches,
# site 1 has a share again once it merged, and sites 0 and 2 log the same shares. world.balance with async, or with pp > 1, and a
# bad --slow-site are refused (exit 2).
# Usage: balance.sh ATOLL MPIEXEC
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC}
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=18
  --set train.micro_batch_size=1 --set train.steps=10 --set parallel.reproducible=true)
W=(--set world.sites=3 --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200
  --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 --insecure -q)

"$ATOLL" train "${C[@]}" -q --out "$T/one" >/dev/null 2>"$T/one.err" ||
  fail "the single process failed: $(tail -5 "$T/one.err")"
rc=0
"$ATOLL" launch "${C[@]}" "${W[@]}" --set world.balance=true --slow-site 2:3 --fail-site 1@3 \
  --rejoin --out "$T/b" >"$T/b.out" 2>"$T/b.err" || rc=$?
[[ $rc == 0 ]] || fail "the balanced run exited $rc: $(tail -20 "$T/b.err")"
log="$T/b/site-0/train.log"
grep -q "shares of the 18 micro-batches (world.balance): site 0: 6, site 1: 6, site 2: 6" "$log" ||
  fail "no equal shares at the start: $(grep shares "$log")"
grep -E "shares of the 18 micro-batches \(world.balance\): site 0: [0-9]+, site 1: [0-9]+, site 2: [1-5]$" \
  "$log" >/dev/null || fail "the slow site 2 never got fewer micro-batches: $(grep shares "$log")"
grep -E "shares of the 18 micro-batches \(world.balance\): site 0: [0-9]+, site 2: [0-9]+$" \
  "$log" >/dev/null || fail "no shares without the lost site 1: $(grep shares "$log")"
grep -q "took over at step" "$T/b/site-1/rejoin.log" || fail "site 1 did not come back"
same_files "$T/one/checkpoint/model.safetensors" "$T/b/checkpoint/model.safetensors"
same_files "$T/one/checkpoint/optimizer.safetensors" "$T/b/checkpoint/optimizer.safetensors"

rc=0
"$ATOLL" launch "${C[@]}" "${W[@]}" --set world.balance=true --set world.strategy=diloco \
  --set world.diloco.inner_steps=3 --set train.steps=36 --slow-site 2:3 --fail-site 1@4 \
  --rejoin --out "$T/d" >"$T/d.out" 2>"$T/d.err" || rc=$?
[[ $rc == 0 ]] || fail "the balanced diloco run exited $rc: $(tail -20 "$T/d.err")"
log="$T/d/site-0/train.log"
S="shares of the 18 micro-batches \(world.balance\)"
grep -E "^\[atoll info\] step 4: $S: site 0: [0-9]+, site 1: [0-9]+, site 2: [1-5]$" "$log" \
  >/dev/null || fail "diloco: site 2 did not get fewer after the first exchange: $(grep shares "$log")"
grep -E "$S: site 0: [0-9]+, site 2: [0-9]+$" "$log" >/dev/null ||
  fail "diloco: the live sites did not take the lost site 1's share: $(grep shares "$log")"
grep -E "step [1-3][0-9]: $S: site 0: [0-9]+, site 1: [0-9]+, site 2: [1-5]$" "$log" >/dev/null ||
  fail "diloco: site 1 had no share after it came back: $(grep shares "$log")"
grep -q "took over at step" "$T/d/site-1/rejoin.log" || fail "diloco: site 1 did not come back"
# Every site cuts the batch alike: site 2's shares are site 0's, line for line.
diff <(grep "shares of the" "$log") <(grep "shares of the" "$T/d/site-2/train.log") >/dev/null ||
  fail "diloco: sites 0 and 2 disagree on the shares"

expect_exit 2 "$ATOLL" launch "${C[@]}" "${W[@]}" --set world.balance=true \
  --set world.strategy=async --out "$T/x"
expect_err "world.balance"
expect_exit 2 "$ATOLL" train "${C[@]}" --set world.balance=true --set parallel.pp=2 --out "$T/x"
expect_err "parallel.pp = 1"
expect_exit 2 "$ATOLL" launch "${C[@]}" "${W[@]}" --slow-site 3:2 --out "$T/x"
expect_err "expected SITE:FACTOR"
echo "OK"
