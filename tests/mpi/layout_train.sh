#!/usr/bin/env bash
# Any dp x tp x pp layout trains the same model, end to end under mpirun (configs/tiny.toml:
# 2 layers, 2 heads, 20 steps, batch 4 of micro-batches of 1).
# Usage: layout_train.sh ATOLL MPIEXEC DP TP PP [--set KEY=VALUE ...]
#   Runs one process and `mpirun -n DP*TP*PP` with that layout (plus the extra settings, e.g. the
#   gpipe schedule or ZeRO-1) and requires every step's loss and validation loss within 1e-5
#   relative of the single process, and a checkpoint with the same tensors (names, shapes,
#   dtypes, offsets) whose evaluation agrees within 1e-5.
# Usage: layout_train.sh ATOLL MPIEXEC resume
#   Layout-free checkpoints: a tp2 x pp2 run's checkpoint at step 10 resumed on dp2 (ZeRO-1) and
#   on one process ends where the uninterrupted single-process run ends (within 1e-5).
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC DP TP PP [--set ...] | resume}
MODE=${3:?usage: $0 ATOLL MPIEXEC DP TP PP [--set ...] | resume}
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive
BASE=(--config configs/tiny.toml --set data.dir="$DATA" --set train.micro_batch_size=1 -q)

# layout DIR DP TP PP [args...]: trains on DP*TP*PP ranks into DIR.
layout() {
  local dir=$1 dp=$2 tp=$3 pp=$4
  shift 4
  "$MPIEXEC" -n $((dp * tp * pp)) "$ATOLL" train "${BASE[@]}" --set parallel.dp="$dp" \
    --set parallel.tp="$tp" --set parallel.pp="$pp" --out "$dir" "$@" >"$T/stdout" \
    2>"$T/stderr" || { cat "$T/stderr" >&2; fail "dp $dp tp $tp pp $pp $* exited $?"; }
  [[ $(cat "$T/stdout") == "$dir/checkpoint" ]] || fail "printed '$(cat "$T/stdout")'"
  # GPU ranks: over NCCL the gradients and activations stay on the GPU, rank 0 uploads a few
  # kilobytes a step (ZeRO's shards aside: they are on the host); over MPI at most its share of
  # the gradient once (configs/tiny.toml's is 6537 KB; uploading it twice is a regression).
  if [[ " $* " == *" train.device=cuda "* ]]; then
    local up bound=7000
    [[ " $* " == *" parallel.comm=nccl "* && " $* " != *" parallel.zero=true "* ]] && bound=200
    up=$(sed -nE 's/.*GPU copies per step .*: ([0-9.]+) KB host to GPU.*/\1/p' "$T/stderr")
    [[ -n $up ]] || fail "no 'GPU copies per step' line"
    awk -v up="$up" -v b="$bound" 'BEGIN { exit !(up < b) }' ||
      fail "rank 0 uploads $up KB a step (bound $bound KB)"
  fi
}

# header FILE: the safetensors JSON header (tensor names, dtypes, shapes, offsets).
header() {
  local n
  n=$(od -An -t u8 -N 8 "$1" | tr -d ' ')
  head -c $((n + 8)) "$1" | tail -c "$n"
}

# eval_loss CHECKPOINT: its validation loss (first 16 windows).
eval_loss() {
  "$ATOLL" eval --checkpoint "$1" --tokens "$DATA/val.bin" --max-windows 16 --threads 1 |
    sed -E 's/.*"loss": *([^,}]*).*/\1/'
}

"$ATOLL" train "${BASE[@]}" --out "$T/one" >/dev/null
case $MODE in
resume)
  set -- resume
  layout "$T/a" 1 2 2 --set train.checkpoint_every=10
  grep -q '"tp": 2' "$T/a/checkpoint-10/manifest.json" || fail "manifest lacks tp 2"
  layout "$T/b" 2 1 1 --set parallel.zero=true --resume "$T/a/checkpoint-10"
  "$ATOLL" train --resume "$T/a/checkpoint-10" --set parallel.tp=1 --set parallel.pp=1 -q \
    --out "$T/c" >/dev/null
  tail -n 10 "$T/one/metrics.jsonl" >"$T/one_last10.jsonl"
  for run in b c; do
    close "$T/one_last10.jsonl" "$T/$run/metrics.jsonl" 10
  done
  ;;
*)
  DP=$MODE TP=${4:?} PP=${5:?}
  set -- "${@:6}"
  layout "$T/l" "$DP" "$TP" "$PP" "$@"
  set -- dp "$DP" tp "$TP" pp "$PP" "$@"
  close "$T/one/metrics.jsonl" "$T/l/metrics.jsonl"
  [[ $(header "$T/one/checkpoint/model.safetensors") == "$(header "$T/l/checkpoint/model.safetensors")" ]] ||
    fail "model.safetensors tensors differ from the single process's"
  a=$(eval_loss "$T/one/checkpoint") b=$(eval_loss "$T/l/checkpoint")
  awk -v a="$a" -v b="$b" 'BEGIN { d = a - b; if (d < 0) d = -d; exit !(d <= 1e-5 * a) }' ||
    fail "checkpoint eval loss $b vs $a"
  ;;
esac
echo "PASS: layout $*"
