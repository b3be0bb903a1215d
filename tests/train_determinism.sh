#!/usr/bin/env bash
# Determinism end to end, on configs/tiny.toml:
#  - two runs with the same seed give bitwise-identical losses and checkpoints;
#  - 1 and 2 threads give the same bits;
#  - resuming from checkpoint-k gives bitwise the same final checkpoint (and the same losses
#    for the steps after k) as not stopping, and a different seed gives different losses.
set -euo pipefail
source "$(dirname "$0")/e2e_lib.sh"

# 12 steps (tiny.toml has 20) keep the test to seconds; validation at 10 and 12.
train() {
  "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --set train.steps=12 -q "$@" \
    >"$T/stdout"
}

train --out "$T/one" --set train.threads=1
[[ $(cat "$T/stdout") == "$T/one/checkpoint" ]] || fail "train printed '$(cat "$T/stdout")'"
train --out "$T/two" --set train.threads=2
train --out "$T/again" --set train.threads=2 --set train.checkpoint_every=4
for run in two again; do
  for f in model.safetensors optimizer.safetensors; do
    same_files "$T/one/checkpoint/$f" "$T/$run/checkpoint/$f"
  done
  [[ $(loss_columns "$T/one/metrics.jsonl") == $(loss_columns "$T/$run/metrics.jsonl") ]] ||
    fail "losses of $run differ from those of run one"
done
[[ $(wc -l <"$T/one/metrics.jsonl") == 12 ]] || fail "expected 12 metrics lines"
grep -q '"val_loss"' "$T/one/metrics.jsonl" || fail "no val_loss in metrics"
[[ -d $T/again/checkpoint-4 && -d $T/again/checkpoint-8 ]] || fail "no periodic checkpoints"

# Resume from step 4 in a new directory (the checkpoint's own config) and in place.
"$ATOLL" train --resume "$T/again/checkpoint-4" --out "$T/resumed" -q >/dev/null
for f in model.safetensors optimizer.safetensors manifest.json config.json; do
  same_files "$T/again/checkpoint/$f" "$T/resumed/checkpoint/$f"
done
[[ $(loss_columns "$T/resumed/metrics.jsonl") == $(loss_columns "$T/again/metrics.jsonl" | tail -n 8) ]] ||
  fail "resumed losses differ from the uninterrupted run's steps 5..12"
cp "$T/again/checkpoint/model.safetensors" "$T/uninterrupted.safetensors"
loss_columns "$T/again/metrics.jsonl" >"$T/uninterrupted.losses"
train --out "$T/again" --set train.checkpoint_every=4 --resume "$T/again/checkpoint-8"
same_files "$T/uninterrupted.safetensors" "$T/again/checkpoint/model.safetensors"
[[ $(loss_columns "$T/again/metrics.jsonl") == $(cat "$T/uninterrupted.losses") ]] ||
  fail "resuming in place changed metrics.jsonl"

train --out "$T/seed2" --set train.seed=2
[[ $(loss_columns "$T/one/metrics.jsonl") != $(loss_columns "$T/seed2/metrics.jsonl") ]] ||
  fail "a different seed gave the same losses"
echo "PASS"
