#!/usr/bin/env bash
# atoll's planner against Epoch's own code, setting by setting (issue 19, point 4): where linear
# scaling ends (crossover) and the largest run that finishes in 3 months, from
#   - the reference notebook as committed (bench/plan/reference_run.py runs its own code; DP not
#     overlapped, TP and PP overlapped, both pipeline schedules tried),
#   - `atoll plan frontier` as it is by default (the reference's way of adding a step's parts),
#   - `atoll plan frontier --combine atoll` (ours: hierarchical levels in sequence, DP overlapped
#     inside the pipeline; see docs/PLANNER.md 1.7 for its effect).
# Both sweeps are cut where the reference's ends, at its widest model (d_model <= 128 x 12288).
#
#   bench/plan/reference_agreement.sh REF_CHECKOUT     (a checkout of
#       github.com/ege-erdil/limits_to_distributed_training; ~2 min; needs python3-numpy/sympy)
# Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${1:?usage: $0 REF_CHECKOUT (a checkout of ege-erdil/limits_to_distributed_training)}
ATOLL=${ATOLL:-build/release/atoll}
[[ -f $REF/optimal_parallelism.ipynb ]] || { echo "reference_agreement: no optimal_parallelism.ipynb in $REF" >&2; exit 2; }
# The reference sweeps d_model from 12288 to 128 x 12288; ours from 1e24 FLOP, here to 1e37, and
# its largest run is taken among the widths the reference tries.
ours() {
  "$ATOLL" plan frontier "$@" --max-flop 1e37 --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
f = lambda x: "%.2e" % x if x else "-"
rows = [r for r in j["rows"] if r["d_model"] <= 128 * 12288 and r["state"] == "feasible"]
print(f(j["crossover_flop"]), f(rows[-1]["compute_flop"] if rows else None))'
}
ref() {
  /usr/bin/python3 bench/plan/reference_run.py "$REF" "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
f = lambda x: "%.2e" % x if x else "-"
print(f(j["crossover_flop"]), f(j["largest_feasible_flop"]))'
}
echo "| setting | reference crossover | largest | atoll crossover | largest | atoll --combine atoll crossover | largest |"
echo "|---|---|---|---|---|---|---|"
while IFS='|' read -r name refname args; do
  read -r rc rl <<<"$(ref "$refname")"
  read -r ac al <<<"$(ours $args)"
  read -r bc bl <<<"$(ours $args --combine atoll)"
  echo "| $name | $rc | $rl | $ac | $al | $bc | $bl |"
done <<EOF2
H100|H100 SXM|--gpu H100
H100 sparse|H100 SXM sparse|--gpu H100 --sparse
A100|A100 SXM|--gpu A100
V100|V100 SXM|--gpu V100
H100 fixed batch|No scaling|--gpu H100 --batch fixed
H100 DeepSeek batch|DeepSeek scaling|--gpu H100 --batch deepseek
H100 low latency (/10)|H100 SXM Low Latency|--gpu H100 --network low-latency
H100 zero latency|H100 SXM Zero Latency|--gpu H100 --network zero-latency
H100 global NVLink|H100 SXM Global NVLink|--gpu H100 --network global-nvlink
EOF2
