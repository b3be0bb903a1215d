#!/usr/bin/env bash
# Data-parallel training end to end under mpirun, on configs/tiny.toml (20 steps, batch 4).
# Usage: dp_train.sh ATOLL MPIEXEC equivalence|reproducible|faulty_rank|memory_repair [--set ...]
#  equivalence:  dp2 (micro 2) and dp4 (micro 1) give the single-process loss and validation
#                curves within 1e-5 relative; only rank 0 writes; the manifest records the mesh;
#                a world size that is not dp*tp*pp, and a tp that does not divide n_head, are
#                exit-2 errors.
#  faulty_rank:  dp 3, a stuck core on rank 1: the audit's peer check names rank 1, the run
#                stops with exit 1; the same with tp 2 (6 ranks), the core on rank 3.
#  reproducible: parallel.reproducible = true gives bitwise-identical final model and optimizer
#                files for dp 1, 2 and 4 (with and without ZeRO-1), and a dp2 checkpoint resumed
#                on dp4 ends on the same bits.
#  memory_repair: dp 2 (with the extra settings: GPU ranks, --set train.device=cuda): a
#                parameter flipped at rest on rank 1 and a moment on rank 0 are found by the
#                memory checks at the start of the step they would first be used in, each
#                repaired from the other replica, and the run ends on the clean run's bits; the
#                replicas' fingerprints agree every other step (no other event).
set -euo pipefail
MPIEXEC=${2:?usage: $0 ATOLL MPIEXEC equivalence|reproducible|faulty_rank|memory_repair}
MODE=${3:?usage: $0 ATOLL MPIEXEC equivalence|reproducible|faulty_rank|memory_repair}
EXTRA=("${@:4}")
source "$(dirname "$0")/../e2e_lib.sh"
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive

train1() { "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" -q "$@" >"$T/stdout"; }
trainN() {
  local n=$1
  shift
  "$MPIEXEC" -n "$n" "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" \
    --set parallel.dp="$n" -q "$@" >"$T/stdout"
}

case $MODE in
equivalence)
  train1 --out "$T/one"
  trainN 2 --out "$T/dp2"
  [[ $(cat "$T/stdout") == "$T/dp2/checkpoint" ]] || fail "dp2 printed '$(cat "$T/stdout")'"
  close "$T/one/metrics.jsonl" "$T/dp2/metrics.jsonl"
  grep -q '"dp": 2' "$T/dp2/checkpoint/manifest.json" || fail "manifest lacks mesh dp 2"
  train1 --out "$T/one_m1" --set train.micro_batch_size=1
  trainN 4 --out "$T/dp4" --set train.micro_batch_size=1
  close "$T/one_m1/metrics.jsonl" "$T/dp4/metrics.jsonl"
  # Bad layouts: exit 2 naming the keys.
  expect_exit 2 "$MPIEXEC" -n 2 "$ATOLL" train --config configs/tiny.toml \
    --set data.dir="$DATA" -q --out "$T/bad"
  expect_err "parallel.dp * parallel.tp * parallel.pp = 1 * 1 * 1 = 1, but 2 ranks"
  expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" -q \
    --set parallel.tp=3 --out "$T/bad"
  expect_err "parallel.tp: must divide model.n_head"
  expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" -q \
    --set parallel.dp=2 --out "$T/bad"
  expect_err "but 1 ranks are running"
  ;;
reproducible)
  R=(--set parallel.reproducible=true --set train.micro_batch_size=1)
  train1 --out "$T/r1" "${R[@]}"
  trainN 2 --out "$T/r2" "${R[@]}" --set train.checkpoint_every=10
  trainN 4 --out "$T/r4" "${R[@]}"
  # Layout-free resume: the dp2 checkpoint at step 10, continued on 4 ranks.
  "$MPIEXEC" -n 4 "$ATOLL" train --resume "$T/r2/checkpoint-10" --set parallel.dp=4 -q \
    --out "$T/r24" >"$T/stdout"
  # ZeRO-1 (int64 reduce-scatter, sharded optimizer): the same bits.
  trainN 2 --out "$T/r2z" "${R[@]}" --set parallel.zero=true
  trainN 4 --out "$T/r4z" "${R[@]}" --set parallel.zero=true
  for run in r2 r4 r24 r2z r4z; do
    for f in model.safetensors optimizer.safetensors; do
      same_files "$T/r1/checkpoint/$f" "$T/$run/checkpoint/$f"
    done
  done
  ;;
faulty_rank)
  # A stuck core on rank 1 (the same wrong GEMM product whenever it computes it): its own
  # replay repeats it; the other two replicas' executions of its micro-batches name it, and
  # every rank stops (exit 1) after the step's metrics line.
  expect_exit 1 "$MPIEXEC" -n 3 "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" \
    -q --set parallel.dp=3 --set train.batch_size=6 --set train.micro_batch_size=1 \
    --set sdc.audit_every=1 --out "$T/faulty" \
    --inject bad_core:step=4,rank=1,layer=1,gemm=2,p=1,bit=26,stuck=1
  expect_err "computes wrong results that its own replay repeats"
  last=$(tail -n 1 "$T/faulty/metrics.jsonl")
  [[ $last == *'"step":4,'* ]] || fail "the last metrics line is not step 4: $last"
  [[ $last == *'"rank":1,"detector":"replay","what":"micro-batches of rank 1","verdict":"faulty_rank"'* ]] ||
    fail "step 4 does not name rank 1 faulty: $last"
  [[ $(grep -c '"peers":"agree"' "$T/faulty/metrics.jsonl") == 3 ]] ||
    fail "steps 1-3 were not confirmed by the other ranks"
  # Replicas of two ranks (tp 2): the stuck core on rank 3 (replica 1's tp rank 1) is named
  # where its GEMM went wrong, and its replica's other rank as one the fault reached.
  expect_exit 1 "$MPIEXEC" -n 6 "$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" \
    -q --set parallel.dp=3 --set parallel.tp=2 --set train.batch_size=6 \
    --set train.micro_batch_size=2 --set sdc.audit_every=1 --out "$T/faulty_tp" \
    --inject bad_core:step=4,rank=3,layer=1,gemm=2,p=1,bit=26,stuck=1
  expect_err '"rank":3,"detector":"replay","what":"micro-batches of replica 1","verdict":"faulty_rank","micro":1,"layer":1,"op":"gemm_fwd 2"'
  last=$(tail -n 1 "$T/faulty_tp/metrics.jsonl")
  [[ $last == *'"step":4,'* && $last == *'"rank":2,"detector":"replay","what":"micro-batches of replica 1","verdict":"reached"'* ]] ||
    fail "step 4 does not name rank 2 as reached: $last"
  [[ $(grep -c '"peers":"agree"' "$T/faulty_tp/metrics.jsonl") == 3 ]] ||
    fail "tp 2: steps 1-3 were not confirmed by the other replicas"
  ;;
memory_repair)
  trainN 2 --out "$T/clean" --set parallel.reproducible=true "${EXTRA[@]}"
  trainN 2 --out "$T/flipped" --set parallel.reproducible=true "${EXTRA[@]}" \
    --inject "param:step=6,rank=1,elem=0,bit=0;moment:step=9,rank=0,moment=v,elem=5,bit=2"
  grep -q '"sdc"' "$T/clean/metrics.jsonl" && fail "the clean run has events"
  [[ $(grep -c '"sdc"' "$T/flipped/metrics.jsonl") == 2 ]] || fail "not 2 steps with events"
  grep -q '"step":6,.*"sdc":\[{"site":0,"rank":1,"detector":"memory","what":"params:wte.weight","verdict":"repaired","source":0}\]' \
    "$T/flipped/metrics.jsonl" || fail "step 6: no repaired parameter on rank 1"
  grep -q '"step":9,.*"sdc":\[{"site":0,"rank":0,"detector":"memory","what":"moment_v:wte.weight","verdict":"repaired","source":1}\]' \
    "$T/flipped/metrics.jsonl" || fail "step 9: no repaired moment on rank 0"
  for f in model.safetensors optimizer.safetensors; do
    same_files "$T/clean/checkpoint/$f" "$T/flipped/checkpoint/$f"
  done
  ;;
*) fail "unknown mode $MODE" ;;
esac
echo "PASS: data parallel $MODE"
