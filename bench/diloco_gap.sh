#!/usr/bin/env bash
# Where the validation-loss gap between DiLoCo and synchronous training comes from, in the setting
# of bench/strategies_bench.sh (4 sites x 1 rank, configs/small.toml, 300 steps of a global batch
# of 16 x 128 tokens, each site 4 sequences a step) with no network, so only the arithmetic of
# each strategy differs. Rows (validation loss of site 0 at the last step, 8 batches):
#   sync                 gradients all-reduced every step (the baseline)
#   one site alone       one process on batch 4 for the same steps: what one replica reaches
#                        by itself on a quarter of the tokens
#   diloco H=1 ...       the sites' AdamW updates averaged after every step (no communication
#                        saved): what remains is each site's optimizer seeing a quarter batch
#   diloco H=1, lr ...   the same with the inner lr halved (what suits a quarter batch)
#   diloco H=100 ...     the exchange every 100 steps with the paper's outer step (lr 0.7,
#                        Nesterov 0.9), with plain averaging (outer lr 1, no momentum), with
#                        plain averaging and the inner lr halved, and with the inner lr halved
#                        and Nesterov 0.5 (bench/strategies_bench.sh's setting)
#   sync lr ...          the baseline at other learning rates (is sync's lr its best?)
#   streaming H=100 ...  Streaming DiLoCo, P = 4 fragments by transformer blocks (the strided
#                        pattern; the embeddings in fragments of their own), tau = 5,
#                        alpha 0.5, with bench/strategies_bench.sh's tuned outer step
#   M=2 ...              two sites of 8 sequences a step instead of four of 4: sync, DiLoCo
#                        H=100 tuned, streaming tuned (the literature's smallest M)
# Usage: bench/diloco_gap.sh [--out DIR]
#   env: STEPS (300), ATOLL (build/release/atoll), ROWS (default: all of the above, by key:
#        "sync alone h1 h1x2 h1_lr h100 h100avg h100avg_lr h100_tuned sync_lr_low sync_lr_high
#        stream_tuned m2_sync m2_h100_tuned m2_stream_tuned").
# Prints a markdown table; DIR/gap.csv has every validation point (row,step,val_loss).
# About an hour on the 2-vCPU VM (each row one run, ~3 minutes; H=1 runs ~2x longer).
set -euo pipefail
cd "$(dirname "$0")/.."
source bench/bench_lib.sh
bench_args "$0" "$@"
STEPS=${STEPS:-300}
ATOLL=${ATOLL:-build/release/atoll}
ROWS=${ROWS:-sync alone h1 h1x2 h1_lr h100 h100avg h100avg_lr h100_tuned sync_lr_low sync_lr_high
  stream_tuned m2_sync m2_h100_tuned m2_stream_tuned}
[[ -x $ATOLL ]] || { echo "diloco_gap: $ATOLL not found (scripts/setup.sh builds it)" >&2; exit 2; }
T=$(mktemp -d "${TMPDIR:-/tmp}/diloco_gap.XXXXXX")
trap 'rm -rf "$T"' EXIT
BENCH=diloco_gap
source bench/world_lib.sh
[[ -n $OUT ]] || OUT=$T
mkdir -p "$OUT"
EVAL=$((STEPS / 6))
LR_LOW=(--set train.lr=1.5e-3 --set train.min_lr=1.5e-4)
LR_HIGH=(--set train.lr=6e-3 --set train.min_lr=6e-4)
AVG=(--set world.diloco.outer_lr=1 --set world.diloco.outer_momentum=0)

# world NAME ARGS...: 4 sites x 1 rank with no network into $T/NAME; metrics in $T/NAME/m
# (ARGS come last: --set world.sites=2 --set train.micro_batch_size=8 makes it M = 2)
world() {
  local name=$1
  shift
  world_run "$name" --set world.sites=4 --set train.steps="$STEPS" \
    --set train.micro_batch_size=4 --set train.eval_every="$EVAL" \
    --set world.link.bandwidth_mbps=0 --set world.link.latency_ms=0 "$@" &&
    ln -s site-0/metrics.jsonl "$T/$name/m"
}
# single NAME ARGS...: one process (no world) into $T/NAME
single() {
  local name=$1
  shift
  echo "diloco_gap: $name" >&2
  "$ATOLL" train --config configs/small.toml -q --out "$T/$name" --set train.steps="$STEPS" \
    --set train.eval_every="$EVAL" "$@" >"$T/$name.out" 2>"$T/$name.err" ||
    { echo "diloco_gap: $name failed: $(tail -3 "$T/$name.err")" >&2; return 1; }
  ln -s metrics.jsonl "$T/$name/m"
}

declare -A LABEL
LABEL[sync]="sync (the baseline)"
LABEL[alone]="one site alone, batch 4"
LABEL[h1]="DiLoCo H=1, outer lr 1, no momentum"
LABEL[h1x2]="DiLoCo H=1, outer lr 2, no momentum"
LABEL[h1_lr]="DiLoCo H=1, outer lr 1, no momentum, inner lr 1.5e-3"
LABEL[h100]="DiLoCo H=100, outer lr 0.7, Nesterov 0.9"
LABEL[h100avg]="DiLoCo H=100, outer lr 1, no momentum"
LABEL[h100avg_lr]="DiLoCo H=100, outer lr 1, no momentum, inner lr 1.5e-3"
LABEL[h100_tuned]="DiLoCo H=100, outer lr 0.7, Nesterov 0.5, inner lr 1.5e-3"
LABEL[sync_lr_low]="sync, lr 1.5e-3"
LABEL[sync_lr_high]="sync, lr 6e-3"
LABEL[stream_tuned]="streaming H=100, P=4 by blocks, tau 5, alpha 0.5, tuned as above"
LABEL[m2_sync]="M=2: sync (2 sites x 8 sequences)"
LABEL[m2_h100_tuned]="M=2: DiLoCo H=100, tuned as above"
LABEL[m2_stream_tuned]="M=2: streaming H=100, P=4 by blocks, tuned as above"
D=(--set world.strategy=diloco --set world.codec=none)
TUNED=("${LR_LOW[@]}" --set world.diloco.outer_lr=0.7 --set world.diloco.outer_momentum=0.5)
S=(--set world.strategy=streaming --set world.codec=none --set world.diloco.inner_steps=100
  --set world.streaming.fragments=4 --set world.streaming.overlap_steps=5
  --set world.streaming.alpha=0.5)
M2=(--set world.sites=2 --set train.micro_batch_size=8)
run_row() {
  case $1 in
    sync) world sync --set world.strategy=sync ;;
    alone) single alone --set train.batch_size=4 --set train.micro_batch_size=4 ;;
    h1) world h1 "${D[@]}" --set world.diloco.inner_steps=1 "${AVG[@]}" ;;
    h1x2) world h1x2 "${D[@]}" --set world.diloco.inner_steps=1 --set world.diloco.outer_lr=2 \
      --set world.diloco.outer_momentum=0 ;;
    h1_lr) world h1_lr "${D[@]}" --set world.diloco.inner_steps=1 "${AVG[@]}" "${LR_LOW[@]}" ;;
    h100) world h100 "${D[@]}" --set world.diloco.inner_steps=100 --set world.diloco.outer_lr=0.7 \
      --set world.diloco.outer_momentum=0.9 ;;
    h100avg) world h100avg "${D[@]}" --set world.diloco.inner_steps=100 "${AVG[@]}" ;;
    h100avg_lr) world h100avg_lr "${D[@]}" --set world.diloco.inner_steps=100 "${AVG[@]}" "${LR_LOW[@]}" ;;
    h100_tuned) world h100_tuned "${D[@]}" --set world.diloco.inner_steps=100 "${LR_LOW[@]}" \
      --set world.diloco.outer_lr=0.7 --set world.diloco.outer_momentum=0.5 ;;
    sync_lr_low) world sync_lr_low --set world.strategy=sync "${LR_LOW[@]}" ;;
    sync_lr_high) world sync_lr_high --set world.strategy=sync "${LR_HIGH[@]}" ;;
    stream_tuned) world stream_tuned "${S[@]}" "${TUNED[@]}" ;;
    m2_sync) world m2_sync --set world.strategy=sync "${M2[@]}" ;;
    m2_h100_tuned) world m2_h100_tuned "${D[@]}" --set world.diloco.inner_steps=100 "${TUNED[@]}" \
      "${M2[@]}" ;;
    m2_stream_tuned) world m2_stream_tuned "${S[@]}" "${TUNED[@]}" "${M2[@]}" ;;
    *) echo "diloco_gap: unknown row $1 (see --help)" >&2; return 2 ;;
  esac
}

# vals NAME: "step val_loss" lines
vals() {
  grep '"val_loss"' "$T/$1/m" | sed -E 's/.*"step":([0-9]+).*"val_loss":([0-9.e+-]+).*/\1 \2/'
}

for row in $ROWS; do
  [[ -n ${LABEL[$row]:-} ]] || { echo "diloco_gap: unknown row $row (see --help)" >&2; exit 2; }
done
echo "row,step,val_loss" >"$OUT/gap.csv"
declare -A VAL
for row in $ROWS; do
  run_row "$row"
  vals "$row" | awk -v r="$row" '{ print r "," $1 "," $2 }' >>"$OUT/gap.csv"
  VAL[$row]=$(vals "$row" | tail -1 | cut -d' ' -f2)
done

echo
echo "4 sites x 1 rank (M=2 rows: 2 sites), configs/small.toml, $STEPS steps of 16 x 128 tokens (4 sequences per site; M=2: 8), no network, no codec"
echo
echo "| run | val loss (step $STEPS) | vs sync |"
echo "|---|---:|---:|"
for row in $ROWS; do
  awk -v l="${LABEL[$row]}" -v v="${VAL[$row]}" -v s="${VAL[sync]:-0}" 'BEGIN {
    rel = (s > 0) ? sprintf("%+.1f%%", 100 * (v - s) / s) : "-"
    printf("| %s | %.3f | %s |\n", l, v, rel) }'
done
echo
echo "data: $OUT/gap.csv"
