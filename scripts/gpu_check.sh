#!/usr/bin/env bash
# Everything of issue 18 that needs a GPU, part by part, for the device tool (a lease of 15
# minutes runs scripts/gpu_session.sh instead: these parts and more in one call, on a budget):
#   here:     scripts/gpu_pack.sh --atoll
#   device:   run(command="scripts/gpu_check.sh [PART...]",
#                 carry=[".gpu/pack.tar.xz", ".cache/data/sotu"])
# PARTs (default: tests, hf, bench; they run in the order below; the device tool stops a command
# after 10 minutes, so run them as separate calls, and bench/gpu_bench.sh's own PARTS and SHAPES
# split it further):
#   tests  the CUDA tests (scripts/gpu_test.sh: every op against the CPU, the GPU training tests);
#   hf     the Hugging Face check: a checkpoint trained on the GPU loads in transformers'
#          GPT2LMHeadModel.from_pretrained and gives atoll eval's loss and logits (hf_check.py);
#          and what transformers' save_pretrained writes of it, atoll eval reads back with the
#          same loss (train/hf_import.h: "hf_import: PASS");
#   sanitize  (not in the default) compute-sanitizer's racecheck, then memcheck, over the
#          tensor-core attention's tests (CudaOps.Bf16Attention*: every block-row setting and
#          backward kind): shared-memory races and out-of-bounds accesses that the emulator's
#          tests cannot show. Needs the toolkit's compute-sanitizer on the machine (PATH or
#          /usr/local/cuda/bin; the part fails saying so when it is missing); each tool is stopped
#          after SANITIZE_S seconds (240: up to 8 minutes for the part, so a call of its own);
#   bench  the speed table against PyTorch and the profiles (bench/gpu_bench.sh), unless
#          NO_BENCH=1.
# e.g. "scripts/gpu_check.sh tests hf", then "SHAPES=124m PARTS='table profile'
# scripts/gpu_check.sh bench". Logs and tables go to $OUT when set. Exits non-zero if a part
# failed (the others still run); 2 for an unknown part.
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"
  exit 0
fi
args=("$@")
[[ ${#args[@]} -gt 0 ]] || args=(tests hf bench)
for p in "${args[@]}"; do
  [[ $p =~ ^(tests|hf|bench|sanitize)$ ]] || { echo "gpu_check: unknown part $p" >&2; exit 2; }
done
parts=" ${args[*]} "
sanitize_s=${SANITIZE_S:-240}
[[ $sanitize_s =~ ^[1-9][0-9]*$ ]] || { echo "gpu_check: SANITIZE_S is not a number of seconds" >&2; exit 2; }
# ATOLL_GPU_ENV set: the caller has set up the environment (gpu_env.sh, or the rehearsal of
# scripts/gpu_session.sh on the emulator, which gives ATOLL and PY).
if [[ -z ${ATOLL_GPU_ENV:-} ]]; then source scripts/gpu_env.sh || exit 2; fi
ATOLL=${ATOLL:-atoll} PY=${PY:-python3}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
status=0
if [[ $parts == *" tests "* ]]; then
echo "== 1. CUDA tests"
OUT=$out scripts/gpu_test.sh --gtest_brief=1 || status=1
fi
if [[ $parts == *" hf "* ]]; then
echo "== 2. Hugging Face transformers check"
w=$(mktemp -d)
trap 'rm -rf "$w"' EXIT
if "$ATOLL" train --config configs/tiny.toml -q --out "$w/run" --set train.device=cuda \
     --set train.steps=20 >"$out/hf_train.log" 2>&1 &&
   "$ATOLL" eval --checkpoint "$w/run/checkpoint" --tokens .cache/data/sotu/val.bin --max-windows 16 \
     --logits-out "$w/logits.safetensors" >"$w/eval.json" 2>"$out/hf_eval.log"; then
  loss=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' "$w/eval.json")
  "$PY" scripts/hf_check.py --checkpoint "$w/run/checkpoint" --tokens .cache/data/sotu/val.bin \
    --atoll-loss "$loss" --atoll-logits "$w/logits.safetensors" --max-windows 16 \
    --save-pretrained "$w/saved" | tee "$out/hf_check.json"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
  # The other way: what transformers' save_pretrained wrote, read by atoll eval (the same loss).
  if "$ATOLL" eval --checkpoint "$w/saved" --tokens .cache/data/sotu/val.bin --max-windows 16 \
       >"$w/eval_saved.json" 2>>"$out/hf_eval.log"; then
    back=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["loss"])' "$w/eval_saved.json")
    if [[ $back == "$loss" ]]; then
      echo "hf_import: PASS (atoll eval of transformers' save_pretrained: loss $back, as the checkpoint's)"
    else
      echo "hf_import: FAIL (atoll eval of transformers' save_pretrained: loss $back, the checkpoint's $loss)"
      status=1
    fi
  else
    echo "hf_import: FAIL (atoll eval of transformers' save_pretrained exited $?):"
    tail -3 "$out/hf_eval.log"
    status=1
  fi
else
  echo "gpu_check: training or eval for the HF check failed:"; tail -20 "$out"/hf_*.log
  status=1
fi
fi
if [[ $parts == *" sanitize "* ]]; then
  echo "== compute-sanitizer over the tensor-core attention's tests"
  sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  if [[ ! -x $sanitizer ]]; then
    echo "gpu_check: no compute-sanitizer on this machine (PATH, /usr/local/cuda/bin)"
    status=1
  else
    for tool in racecheck memcheck; do
      echo "-- $tool"
      timeout -k 30 "$sanitize_s" "$sanitizer" --tool "$tool" --error-exitcode 3 \
        /tmp/atoll-gpu/bin/cuda_ops_test --gtest_filter='CudaOps.Bf16Attention*' --gtest_brief=1 \
        >"$out/sanitize_$tool.log" 2>&1
      rc=$?
      tail -15 "$out/sanitize_$tool.log"
      case $rc in
        0) echo "$tool: clean" ;;
        124|137) echo "$tool: stopped after $sanitize_s s (not a finding; raise SANITIZE_S)"; status=1 ;;
        *) echo "$tool: exit $rc (3: the tool found errors; the log is in $out)"; status=1 ;;
      esac
    done
  fi
fi
if [[ $parts == *" bench "* && -z "${NO_BENCH:-}" ]]; then
  echo "== 3. speed against PyTorch"
  OUT=$out bench/gpu_bench.sh || status=1
fi
exit $status
