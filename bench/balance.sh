#!/usr/bin/env bash
# world.balance: a world of 3 sites x 1 rank (configs/tiny.toml, batch 18 of micro-batches of 1,
# links of 5 ms and 200 Mbit/s) where site 2 runs at 1/SLOW of the others' speed
# (--slow-site 2:SLOW), with equal shares of each step's micro-batches and with
# world.balance = true, interleaved REPEATS times, for world.strategy = STRATEGY:
#   sync       parallel.reproducible: the final parameters must be bitwise the same (the
#              reproducible sums do not depend on the shares);
#   diloco,    H = 5 (streaming: 2 fragments, overlap 1): the shares follow the paces the sites
#   streaming  vote with at each exchange, so every site's round takes about the same wall time;
#              the final validation losses are printed side by side.
# Prints a markdown table: site 0's wall time per step and tokens/s over the steps after the
# first exchange (sync: after step 2), each run's sum of step times, with their ratio and the
# last step's shares.
# Usage: bench/balance.sh [--help] ; env: STRATEGY (default sync), SLOW (default 2), STEPS
#        (default 20), REPEATS (default 2), ATOLL (default build/release/atoll), DATA (default
#        .cache/data/sotu).
set -euo pipefail
cd "$(dirname "$0")/.."
STRATEGY=${STRATEGY:-sync}
SLOW=${SLOW:-2}
STEPS=${STEPS:-20}
REPEATS=${REPEATS:-2}
ATOLL=${ATOLL:-build/release/atoll}
DATA=${DATA:-.cache/data/sotu}
source bench/bench_lib.sh
bench_args "$0" "$@"
export OMP_NUM_THREADS=1
T=$(mktemp -d "${TMPDIR:-/tmp}/balance_bench.XXXXXX")
trap 'rm -rf "$T"' EXIT

C=(--config configs/tiny.toml --set data.dir="$DATA" --set train.batch_size=18
  --set train.micro_batch_size=1 --set train.steps="$STEPS" --set world.sites=3
  --set world.strategy="$STRATEGY" --set world.link.latency_ms=5
  --set world.link.bandwidth_mbps=200 --set world.link.jitter_ms=0 --set world.heartbeat_s=0.5
  --insecure -q --slow-site 2:"$SLOW")
case $STRATEGY in
  sync) C+=(--set parallel.reproducible=true); FROM=2 ;;
  diloco) C+=(--set world.diloco.inner_steps=5); FROM=5 ;;
  streaming) C+=(--set world.diloco.inner_steps=5 --set world.streaming.fragments=2
    --set world.streaming.overlap_steps=1); FROM=5 ;;
  *) echo "balance.sh: STRATEGY must be sync, diloco or streaming (got $STRATEGY)" >&2; exit 2 ;;
esac
for r in $(seq 1 "$REPEATS"); do
  for b in false true; do
    "$ATOLL" launch "${C[@]}" --set world.balance=$b --out "$T/$b-$r" >/dev/null 2>"$T/$b-$r.err" ||
      { echo "the run with world.balance = $b failed: $(tail -3 "$T/$b-$r.err")"; exit 1; }
  done
done
python3 - "$T" "$REPEATS" "$SLOW" "$STRATEGY" "$FROM" <<'PY'
import json, sys, filecmp
t, repeats, slow, strategy, start = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5])
def runs(b):
    ms, tokens, steps, vals = 0.0, 0.0, 0, []
    for r in range(1, repeats + 1):
        rows = [json.loads(l) for l in open(f"{t}/{b}-{r}/site-0/metrics.jsonl")]
        rows = [x for x in rows if x["step"] > start]
        steps += len(rows)
        ms += sum(x["step_ms"] for x in rows)
        tokens += sum(x["tokens_per_s"] * x["step_ms"] / 1e3 for x in rows)
        vals.append(next(x["val_loss"] for x in reversed(rows) if "val_loss" in x))
    return ms / steps, tokens / (ms / 1e3), vals
off, on = runs("false"), runs("true")
shares = [l.split("(world.balance): ")[1].strip()
          for l in open(f"{t}/true-{repeats}/site-0/train.log") if "shares of the" in l]
print(f"world.strategy = {strategy}, site 2 at 1/{slow} speed, {repeats} runs of each, "
      f"site 0's steps after step {start}:\n")
print("| world.balance | ms per step (mean) | tokens/s | last shares of 18 | final validation loss |")
print("|---|---:|---:|---|---|")
print(f"| false | {off[0]:.0f} | {off[1]:.0f} | 6, 6, 6 | {', '.join(f'{v:.4f}' for v in off[2])} |")
print(f"| true | {on[0]:.0f} | {on[1]:.0f} | {shares[-1] if shares else '-'} | "
      f"{', '.join(f'{v:.4f}' for v in on[2])} |")
print(f"\nbalanced / equal tokens/s: {on[1] / off[1]:.2f}x")
if strategy == "sync":
    same = all(filecmp.cmp(f"{t}/false-{r}/checkpoint/model.safetensors",
                           f"{t}/true-{r}/checkpoint/model.safetensors", shallow=False)
               for r in range(1, repeats + 1))
    print(f"final parameters bitwise the same: {'yes' if same else 'NO'}")
    sys.exit(0 if same else 1)
PY
