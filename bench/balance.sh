#!/usr/bin/env bash
# world.balance: a sync world of 3 sites x 1 rank (configs/tiny.toml, batch 18 of micro-batches
# of 1, parallel.reproducible, links of 5 ms and 200 Mbit/s) where site 2 runs at 1/SLOW of the
# others' speed (--slow-site 2:SLOW), with equal shares of each step's micro-batches and with
# world.balance = true, interleaved REPEATS times. Prints a markdown table: the median step time
# and tokens/s of each (steps 3 and later), their ratio, the last step's shares, and whether the
# final parameters are bitwise the same (they must be: the reproducible sums do not depend on the
# shares).
# Usage: bench/balance.sh [--help] ; env: SLOW (default 2), STEPS (default 16), REPEATS (default
#        2), ATOLL (default build/release/atoll), DATA (default .cache/data/sotu).
set -euo pipefail
cd "$(dirname "$0")/.."
SLOW=${SLOW:-2}
STEPS=${STEPS:-16}
REPEATS=${REPEATS:-2}
ATOLL=${ATOLL:-build/release/atoll}
DATA=${DATA:-.cache/data/sotu}
source bench/bench_lib.sh
bench_args "$0" "$@"
export OMP_NUM_THREADS=1
T=$(mktemp -d "${TMPDIR:-/tmp}/balance_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=18
  --set train.micro_batch_size=1 --set train.steps="$STEPS" --set parallel.reproducible=true
  --set world.sites=3 --set world.link.latency_ms=5 --set world.link.bandwidth_mbps=200
  --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5 --insecure -q --slow-site 2:"$SLOW")
for r in $(seq 1 "$REPEATS"); do
  for b in false true; do
    "$ATOLL" launch "${C[@]}" --set world.balance=$b --out "$T/$b-$r" >/dev/null 2>"$T/$b-$r.err" ||
      { echo "the run with world.balance = $b failed: $(tail -3 "$T/$b-$r.err")"; exit 1; }
  done
done
python3 - "$T" "$REPEATS" "$SLOW" <<'PY'
import json, statistics, sys, filecmp, re
t, repeats, slow = sys.argv[1], int(sys.argv[2]), sys.argv[3]
def runs(b):
    ms, tps = [], []
    for r in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f"{t}/{b}-{r}/site-0/metrics.jsonl")]
        ms += [x["step_ms"] for x in rows[2:]]
        tps += [x["tokens_per_s"] for x in rows[2:]]
    return statistics.median(ms), statistics.median(tps)
off, on = runs("false"), runs("true")
shares = [l.split("(world.balance): ")[1].strip()
          for l in open(f"{t}/true-{repeats}/site-0/train.log") if "shares of the" in l]
same = all(filecmp.cmp(f"{t}/false-{r}/checkpoint/model.safetensors",
                       f"{t}/true-{r}/checkpoint/model.safetensors", shallow=False)
           for r in range(1, repeats + 1))
print(f"site 2 at 1/{slow} speed, {repeats} runs of each, steps 3 and later:\n")
print("| world.balance | step ms (median) | tokens/s (median) | last shares of 18 |")
print("|---|---:|---:|---|")
print(f"| false | {off[0]:.0f} | {off[1]:.0f} | 6, 6, 6 |")
print(f"| true | {on[0]:.0f} | {on[1]:.0f} | {shares[-1] if shares else '-'} |")
print(f"\nbalanced / equal tokens/s: {on[1] / off[1]:.2f}x; final parameters bitwise the same: "
      f"{'yes' if same else 'NO'}")
sys.exit(0 if same else 1)
PY
