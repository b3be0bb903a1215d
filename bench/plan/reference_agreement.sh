#!/usr/bin/env bash
# atoll's planner against Epoch's own code, setting by setting (issue 19, point 4): where linear
# scaling ends (crossover) and the largest run that finishes in 3 months, from
#   - the reference notebook as committed (bench/plan/reference_run.py runs its own code; DP not
#     overlapped, TP and PP overlapped, both pipeline schedules tried),
#   - `atoll plan frontier` as it is by default,
#   - `atoll plan frontier --combine reference` (the reference's way of
#     adding a step's parts; see docs/PLANNER.md for what still differs).
#
#   bench/plan/reference_agreement.sh REF_CHECKOUT     (a checkout of
#       github.com/ege-erdil/limits_to_distributed_training; ~1 min; needs python3-numpy/sympy)
# Prints a markdown table.
set -euo pipefail
cd "$(dirname "$0")/../.."
REF=${1:?usage: $0 REF_CHECKOUT (a checkout of ege-erdil/limits_to_distributed_training)}
ATOLL=${ATOLL:-build/release/atoll}
[[ -f $REF/optimal_parallelism.ipynb ]] || { echo "reference_agreement: no optimal_parallelism.ipynb in $REF" >&2; exit 2; }
ll=$(mktemp)
trap 'rm -f "$ll"' EXIT
# The reference's "Low Latency" divides every network and matmul latency by 10.
cat >"$ll" <<'TOML'
name = "H100, latencies / 10 (the reference's Low Latency)"
base_gpu = "H100"
base_network = "default"
[gpu]
latency_per_matmul = 4.5e-7
[[network]]
name = "NVLink"
size = 8
bandwidth = 9e11
latency = 1.125e-7
[[network]]
name = "InfiniBand"
bandwidth = 1e11
latency = 1.125e-7
TOML
ours() {
  "$ATOLL" plan frontier "$@" --json | python3 -c '
import json, sys
j = json.load(sys.stdin)
f = lambda x: "%.2e" % x if x else "-"
print(f(j["crossover_flop"]), f(j["largest_feasible_flop"]))'
}
ref() {
  /usr/bin/python3 bench/plan/reference_run.py "$REF" "$1" | python3 -c '
import json, sys
j = json.load(sys.stdin)
f = lambda x: "%.2e" % x if x else "-"
print(f(j["crossover_flop"]), f(j["largest_feasible_flop"]))'
}
echo "| setting | reference crossover | largest | atoll crossover | largest | atoll --combine reference crossover | largest |"
echo "|---|---|---|---|---|---|---|"
while IFS='|' read -r name refname args; do
  read -r rc rl <<<"$(ref "$refname")"
  read -r ac al <<<"$(ours $args)"
  read -r bc bl <<<"$(ours $args --combine reference)"
  echo "| $name | $rc | $rl | $ac | $al | $bc | $bl |"
done <<EOF2
H100|H100 SXM|--gpu H100
H100 sparse|H100 SXM sparse|--gpu H100 --sparse
A100|A100 SXM|--gpu A100
V100|V100 SXM|--gpu V100
H100 fixed batch|No scaling|--gpu H100 --batch fixed
H100 DeepSeek batch|DeepSeek scaling|--gpu H100 --batch deepseek
H100 low latency (/10)|H100 SXM Low Latency|--gpu H100 --hardware $ll
H100 global NVLink|H100 SXM Global NVLink|--gpu H100 --network global-nvlink
EOF2
