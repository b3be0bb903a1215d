#!/usr/bin/env bash
# GPU benchmark (issue 18, item 6), run ON a GPU machine: atoll and PyTorch train the same GPT-2
# shapes (124M and 350M, seq 1024) on the same GPU in one run, and the table gives tokens/s, MFU
# and the ratio; then atoll's per-op profile of one shape, fp32 and bf16.
#
#   bench/gpu_bench.sh            (after `source scripts/gpu_env.sh`, or with atoll on PATH)
#
# Environment: BATCH=8 STEPS=12 WARMUP=3 SEQ=1024; SHAPES="124m 350m" (or LxHxC: layers, heads,
# width); PRECISIONS="fp32 bf16" (the table's); ATOLL_ARGS (more arguments for atoll train, e.g.
# "--set train.attention_backward=fused"); PARTS="table detectors profile
# copies" (any of them, and `ab`, `attention` and `kernels`: the device tool runs a command for 10 minutes
# at most, so a session may run the parts as separate calls); BASELINE (part ab: a kernels_model_step built
# from another revision, default kernels_model_step_base on PATH, which `scripts/gpu_pack.sh
# --baseline FILE` packs: the bf16 step of both, alternately, 3 times each, in one run); part
# attention: the attention alone at each shape (batch, seq SEQ, its heads), atoll's
# (bench/kernels/attention.cc, the block-row settings of its tensor-core kernels, query/key rows
# 64/64, 128/64, 64/128 and 128/128, each with the split and the fused backward, and whether they
# give the same bits) and PyTorch's scaled_dot_product_attention (bench/torch_attention_gpu.py,
# each backend) in one run, then the bf16 step with each setting; part kernels: Nsight
# Compute's time of every kernel (ncu, gpu__time_duration.sum; bench/ncu_table.py's tables), of
# the attention alone at each shape and setting and of one bf16 step of gpt2-124m at
# 64/64 and 128/128, split and fused, the raw CSVs kept in OUT (NCU, default ncu on PATH or in /usr/local/cuda/bin);
# ATTENTION (default kernels_attention on PATH); OUT (when set, the table and the logs are also written there);
# ATOLL (default: atoll on PATH); PY=python3 (with torch 2.x). A run that fails is reported (its
# log's tail, "failed" in the table) and the rest goes on; the exit status is then 1.
#
# atoll runs `atoll train --set train.device=cuda` twice, train.precision fp32 and bf16 (the step
# guard and the memory checks off as PyTorch has neither, no eval, no checkpoint; then once more
# in bf16 with them, on the first shape: what they cost); its tokens/s
# is the median over the timed steps of metrics.jsonl; PyTorch runs
# bench/torch_gpt_gpu.py (torch.compile, fused AdamW, scaled_dot_product_attention) twice: fp32
# (no TF32: atoll's arithmetic) and bf16 autocast (the issue's peer). MFU: F_tok = 6 N + 12 L T C
# against 67 TFLOP/s for fp32 and 989 for bf16 (H100 SXM dense; pass PEAK_FP32 / PEAK_BF16 for
# another GPU).
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
  exit 0
fi
BATCH=${BATCH:-8} STEPS=${STEPS:-12} WARMUP=${WARMUP:-3} SHAPES=${SHAPES:-"124m 350m"}
SEQ=${SEQ:-1024} PRECISIONS=${PRECISIONS:-"fp32 bf16"}
read -r -a atoll_args <<<"${ATOLL_ARGS:-}"
PARTS=${PARTS:-"table detectors profile copies"}
status=0
part() { [[ " $PARTS " == *" $1 "* ]]; }
for p in $PARTS; do
  [[ $p =~ ^(table|detectors|profile|copies|ab|attention|kernels)$ ]] || { echo "gpu_bench: unknown part $p" >&2; exit 2; }
done
source bench/gpu_shapes.sh
check_shapes gpu_bench "$SHAPES"
for p in $PRECISIONS; do
  [[ $p == fp32 || $p == bf16 ]] || { echo "gpu_bench: unknown precision $p (fp32, bf16)" >&2; exit 2; }
done
[[ $SEQ =~ ^[1-9][0-9]*$ ]] || { echo "gpu_bench: SEQ is not a length" >&2; exit 2; }
PEAK_FP32=${PEAK_FP32:-67} PEAK_BF16=${PEAK_BF16:-989}
ATOLL=${ATOLL:-$(command -v atoll || echo build/release/atoll)}
PY=${PY:-python3}
work=$(mktemp -d)
out=${OUT:-$work}
# The runs' directories go (and the logs with them when OUT is not given): a bench is not kept.
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"
data=.cache/data/sotu
[[ -f $data/train.bin ]] || { echo "gpu_bench: no $data/train.bin (carry .cache/data/sotu)" >&2; exit 2; }

median_tps() {  # metrics.jsonl -> median tokens_per_s of the steps after WARMUP (0: no run)
  "$PY" - "$1" "$WARMUP" <<'PYEOF' 2>/dev/null || echo 0
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(statistics.median(r["tokens_per_s"] for r in rows[int(sys.argv[2]):]))
PYEOF
}
atoll_run() {  # name L H C precision [--set ...]: atoll trains the shape; false (reported) if not
  local name=$1 L=$2 H=$3 C=$4 prec=$5
  shift 5
  "$ATOLL" train --config configs/gpt2-124m.toml -q --out "$work/atoll-$name" \
    --set model.n_layer=$L --set model.n_head=$H --set model.n_embd=$C --set model.seq_len=$SEQ \
    --set train.device=cuda --set train.precision=$prec --set train.steps=$STEPS \
    --set train.batch_size=$BATCH --set train.micro_batch_size=$BATCH \
    --set train.eval_batches=0 --set train.checkpoint_every=-1 --set train.warmup_steps=1 \
    "${atoll_args[@]}" "$@" >"$out/atoll-$name.log" 2>&1 && return 0
  echo "gpu_bench: atoll $name failed:"
  tail -20 "$out/atoll-$name.log"
  status=1
  return 1
}
torch_run() {  # L H C dtype shape -> PyTorch's JSON line, or {} (reported)
  local line
  line=$("$PY" bench/torch_gpt_gpu.py --n-layer "$1" --n-head "$2" --n-embd "$3" --batch $BATCH \
    --seq-len $SEQ --dtype "$4" --steps $STEPS --warmup $WARMUP --json 2>"$out/torch-$4-$5.log" |
    tail -1)
  if [[ $line == "{"* ]]; then echo "$line"; return; fi
  echo "gpu_bench: PyTorch $4 $5 failed:" >&2
  tail -20 "$out/torch-$4-$5.log" >&2
  echo "{}"
  return 1
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null
if part table; then
table="| shape | atoll fp32 tok/s | MFU | PyTorch fp32 tok/s | MFU | atoll / PyTorch fp32 | atoll bf16 tok/s | MFU | PyTorch bf16 tok/s | MFU | atoll / PyTorch bf16 |"
table+=$'\n'"|---|---|---|---|---|---|---|---|---|---|---|"
for s in $SHAPES; do
  read -r L H C <<<"$(shape_args "$s")"
  N=$((L * 12 * C * C + 50257 * C))
  FTOK=$((6 * N + 12 * L * SEQ * C))
  a=0 a16=0 p32="{}" p16="{}"
  for prec in $PRECISIONS; do
    atoll_run "$prec-$s" "$L" "$H" "$C" "$prec" --set sdc.guard=false --set sdc.memory=false
  done
  if [[ " $PRECISIONS " == *" fp32 "* ]]; then
    a=$(median_tps "$work/atoll-fp32-$s/metrics.jsonl")
    p32=$(torch_run "$L" "$H" "$C" fp32 "$s") || status=1
  fi
  if [[ " $PRECISIONS " == *" bf16 "* ]]; then
    a16=$(median_tps "$work/atoll-bf16-$s/metrics.jsonl")
    p16=$(torch_run "$L" "$H" "$C" bf16 "$s") || status=1
    # What train.attention_rows = auto chose, with its timings (atoll's log).
    grep -ho "train.attention_rows = auto: .*" "$out/atoll-bf16-$s.log" | sed "s/^/$s bf16: /" |
      tee -a "$out/gpu_bench.md"
  fi
  row=$("$PY" - "$a" "$p32" "$p16" "$FTOK" "$PEAK_FP32" "$PEAK_BF16" "$s" "$a16" "$PRECISIONS" <<'PYEOF'
import json, sys
a, p32, p16 = float(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
ftok, peak32, peak16, s = float(sys.argv[4]), float(sys.argv[5]), float(sys.argv[6]), sys.argv[7]
a16, ran = float(sys.argv[8]), sys.argv[9].split()
t32, t16 = p32.get("tokens_per_s", 0.0), p16.get("tokens_per_s", 0.0)
tps = lambda t, prec: (f"{t:,.0f}" if t > 0 else "failed") if prec in ran else "not run"
mfu = lambda t, peak: f"{100 * t * ftok / (peak * 1e12):.1f}%" if t > 0 else "-"
ratio = lambda x, y: f"{x / y:.2f}x" if x > 0 and y > 0 else "-"
print(f"| {s} | {tps(a, 'fp32')} | {mfu(a, peak32)} | {tps(t32, 'fp32')} | {mfu(t32, peak32)} "
      f"| {ratio(a, t32)} | {tps(a16, 'bf16')} | {mfu(a16, peak16)} | {tps(t16, 'bf16')} "
      f"| {mfu(t16, peak16)} | {ratio(a16, t16)} |")
PYEOF
  ) || { status=1; row="| $s | failed (the row's numbers: see the logs) |"; }
  table+=$'\n'"$row"
done
echo "$table" | tee -a "$out/gpu_bench.md"
echo
fi
# What the default detectors cost (the step guard and the memory checks, which read the GPU's
# state where it lives): bf16, the first shape, with them against without.
s=${SHAPES%% *}
read -r L H C <<<"$(shape_args "$s")"
if part detectors; then
  [[ -f $work/atoll-bf16-$s/metrics.jsonl ]] ||
    atoll_run "bf16-$s" "$L" "$H" "$C" bf16 --set sdc.guard=false --set sdc.memory=false
  if atoll_run "checked-$s" "$L" "$H" "$C" bf16; then
    checked=$(median_tps "$work/atoll-checked-$s/metrics.jsonl")
    plain=$(median_tps "$work/atoll-bf16-$s/metrics.jsonl")
    "$PY" -c "import sys; c, p = map(float, sys.argv[1:]); print(f'the default detectors (sdc.guard, sdc.memory), bf16 $s: {c:,.0f} tok/s with, {p:,.0f} without: {c / p:.3f}x' if p > 0 else 'the default detectors: no run without them')" \
      "$checked" "$plain" | tee -a "$out/gpu_bench.md"
    grep -h "sdc cost per step" "$out/atoll-checked-$s.log" | tee -a "$out/gpu_bench.md"
  fi
  echo
fi
MODEL_STEP=${MODEL_STEP:-$(command -v kernels_model_step || echo build/release/bench/kernels_model_step)}
ATTENTION=${ATTENTION:-$(command -v kernels_attention || echo build/release/bench/kernels_attention)}
# The attention's block-row settings (query/key rows) and backward kinds parts attention and
# kernels time.
ROWS_SETTINGS="64/64 128/64 64/128 128/128"
BACKWARD_KINDS="split fused"
for prec in fp32 bf16; do
  part profile || break
  echo "atoll's time per op, $prec (gpt2-124m, batch $BATCH, the GPU waited for after every op):"
  "$MODEL_STEP" --device cuda --precision $prec --preset gpt2-124m --batch "$BATCH" --steps 5 \
    --warmup 2 --profile | tee "$out/profile-$prec.txt"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done
# What the bf16 copies of the products' inputs save (GPT::set_bf16_copies; the same bits):
# forward + backward without a profile, with them and without, one after the other.
if part copies; then
  echo "bf16 copies of the products' inputs (gpt2-124m, batch $BATCH, forward + backward):"
  for copies in on off; do
    "$MODEL_STEP" --device cuda --precision bf16 --preset gpt2-124m --batch "$BATCH" --steps 10 \
      --warmup 3 --bf16-copies $copies | tail -1 | tee -a "$out/gpu_bench.md"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  done
fi
# The attention alone, atoll's and PyTorch's, at each shape's heads (forward and backward, bf16).
if part attention; then
  for s in $SHAPES; do
    read -r L H C <<<"$(shape_args "$s")"
    echo "attention, $s's heads (batch $BATCH, seq $SEQ), atoll then PyTorch:" | tee -a "$out/gpu_bench.md"
    "$ATTENTION" --batch "$BATCH" --seq "$SEQ" --heads "$H" --width "$C" | tee -a "$out/gpu_bench.md"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    "$PY" bench/torch_attention_gpu.py --batch "$BATCH" --seq "$SEQ" --heads "$H" --width "$C" |
      tee -a "$out/gpu_bench.md"
    [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
    echo | tee -a "$out/gpu_bench.md"
  done
  echo "the bf16 step (gpt2-124m, batch $BATCH) by the attention's block rows and backward, alternately:" |
    tee -a "$out/gpu_bench.md"
  for i in 1 2; do
    for kind in $BACKWARD_KINDS; do
      for rows in $ROWS_SETTINGS; do
        line=$("$MODEL_STEP" --device cuda --precision bf16 --preset gpt2-124m --batch "$BATCH" \
          --steps 10 --warmup 3 --attention-rows $rows --attention-backward $kind | tail -1) ||
          status=1
        echo "  rows $rows $kind: $line" | tee -a "$out/gpu_bench.md"
      done
    done
  done
fi
# Every kernel's GPU time by Nsight Compute (one pass a kernel; the clocks and the caches left
# alone, as a run leaves them: L2 is not flushed before each kernel): the
# attention alone for each block-row setting and backward kind (its 4 forward and 4 backward
# calls: 3 timed rounds of one and the bits' run), then one bf16 step of gpt2-124m (after a
# warm-up step) at 64/64 and 128/128, split and fused, per step.
if part kernels; then
  NCU=${NCU:-$(command -v ncu || echo /usr/local/cuda/bin/ncu)}
  ncu_csv() {  # csv program args...: false (reported) when ncu or the program failed
    local csv=$1
    shift
    "$NCU" --csv --print-units base --clock-control none --cache-control none \
      --metrics gpu__time_duration.sum \
      --log-file "$csv" "$@" >"$csv.stdout" 2>&1 && return 0
    echo "gpu_bench: ncu $* failed:"
    tail -20 "$csv.stdout" "$csv" 2>/dev/null
    status=1
    return 1
  }
  if [[ ! -x $NCU ]]; then
    echo "gpu_bench: part kernels needs ncu (NCU=...)" >&2
    status=1
  else
    for s in $SHAPES; do
      read -r L H C <<<"$(shape_args "$s")"
      for kind in $BACKWARD_KINDS; do
        for rows in $ROWS_SETTINGS; do
          csv=$out/ncu-attention-$s-${rows/\//-}-$kind.csv
          ncu_csv "$csv" "$ATTENTION" --batch "$BATCH" --seq "$SEQ" --heads "$H" --width "$C" \
            --rows "$rows" --backward "$kind" --steps 1 --warmup 0 &&
            "$PY" bench/ncu_table.py "$csv" --per 4 \
              --title "attention alone, $s's heads, rows $rows, $kind (a forward and a backward):" |
            tee -a "$out/gpu_bench.md"
          [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
        done
      done
    done
    # Both steps profiled (a warm-up and a timed one), the table per step: the first step's
    # one-time kernels (zeroing at allocation, the padded classifier weight) count half.
    for kind in $BACKWARD_KINDS; do
      for rows in 64/64 128/128; do
        csv=$out/ncu-step-124m-${rows/\//-}-$kind.csv
        ncu_csv "$csv" "$MODEL_STEP" --device cuda --precision bf16 --preset gpt2-124m \
          --batch "$BATCH" --steps 1 --warmup 1 --attention-rows "$rows" \
          --attention-backward "$kind" &&
          "$PY" bench/ncu_table.py "$csv" --per 2 --title \
            "gpt2-124m bf16 step, batch $BATCH, attention rows $rows, $kind (a step: the mean of 2):" |
          tee -a "$out/gpu_bench.md"
        [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
      done
    done
  fi
fi
# Another revision's step against this one's (BASELINE): gpt2-124m bf16, forward + backward,
# alternately, so that both see the same GPU state; then the ratio of the medians.
if part ab; then
  BASELINE=${BASELINE:-$(command -v kernels_model_step_base || true)}
  if [[ -z "$BASELINE" || ! -x "$BASELINE" ]]; then
    echo "gpu_bench: part ab needs BASELINE (or kernels_model_step_base on PATH)" >&2
    status=1
  else
    echo "A/B: $BASELINE (base) against $MODEL_STEP (this), gpt2-124m bf16, batch $BATCH:"
    base_ms=() this_ms=()
    for i in 1 2 3; do
      for which in base this; do
        bin=$MODEL_STEP
        [[ $which == base ]] && bin=$BASELINE
        line=$("$bin" --device cuda --precision bf16 --preset gpt2-124m --batch "$BATCH" \
          --steps 10 --warmup 3 | tail -1) || status=1
        echo "  $which $i: $line" | tee -a "$out/gpu_bench.md"
        ms=$(grep -oE '[0-9.]+ ms' <<<"$line" | head -1 | cut -d' ' -f1)
        [[ -n "$ms" ]] || { status=1; continue; }
        [[ $which == base ]] && base_ms+=("$ms") || this_ms+=("$ms")
      done
    done
    if [[ ${#base_ms[@]} -gt 0 && ${#this_ms[@]} -gt 0 ]]; then
      "$PY" -c "import statistics as s, sys; a, b = (list(map(float, x.split())) for x in sys.argv[1:]); m, n = s.median(a), s.median(b); print(f'A/B median ms a step: base {m:.2f}, this {n:.2f}: this is {m / n:.3f}x the base')" \
        "${base_ms[*]}" "${this_ms[*]}" | tee -a "$out/gpu_bench.md"
    else
      echo "gpu_bench: A/B: no timed run of one side" | tee -a "$out/gpu_bench.md"
    fi
  fi
fi
exit $status
