#!/usr/bin/env bash
# Issue 18's GPU checks in ONE call of the device tool, sized to its lease (15 minutes of device
# time a session, the machine's start included; 10 minutes a call):
#   here:    scripts/gpu_pack.sh --atoll        (builds build/release first)
#   device:  run(command="scripts/gpu_session.sh", timeout_s=600,
#                carry=[".gpu/pack.tar.xz", ".cache/data/sotu"])
# The parts, most valuable first. Each starts only when what is left of BUDGET_S (counted from the
# start) covers the least it needs, and is stopped when the budget runs out:
#   tests      every CUDA test program (scripts/gpu_test.sh's), each stopped after TESTS_S;
#   attention  the attention alone at each shape's heads: atoll's four block-row settings with the
#              split and the fused backward (bench/kernels/attention.cc: their bits compared),
#              then PyTorch's scaled_dot_product_attention; the backward kind faster at the first
#              shape is the one the table and the profile run;
#   table      bf16 tokens/s and MFU of atoll (train.attention_rows = auto: its choice and timings
#              are shown) against PyTorch 2.x (torch.compile, fused AdamW, SDPA), shape by shape
#              (bench/gpu_bench.sh's table);
#   profile    atoll's bf16 time per op at the first shape (kernels_model_step --profile, at the
#              preset of that shape: gpt2-124m, gpt2-350m, or tiny for LxHxC);
#   hf         the Hugging Face check (scripts/gpu_check.sh hf);
#   sanitize   (asked for by PARTS only) compute-sanitizer over the tensor-core attention's tests,
#              with the time left (at least 120 s).
# Writes $OUT/summary.md, each part's outcome and tables as the part ends (a call stopped at its
# limit still returns what was done), and $OUT/logs.tar.gz, every log: 2 files (the tool returns
# at most 8). Prints the summary last. Exit 0 when every part asked for ran and passed; 1 when one
# failed, or was skipped or stopped for want of time (the summary's last line says which); 2 for
# bad arguments. The default budget leaves about 5 minutes of a lease for a second call: parts
# again (PARTS, BUDGET_S within what the tool's status says is left), or sanitize.
#
#   --rehearse  the same parts here, without a GPU: the CUDA emulator's builds in BUILD
#               (build/release: atoll-emu, kernels_*_emu, cuda_*_emu_test filtered by
#               TEST_FILTER), a tiny shape, PyTorch's GPU peers answered by a stand-in
#               (tests/gpu_rehearsal_python.sh) and transformers by tests/hf_shim: it proves the
#               script before a GPU session spends its minutes on it, not the GPU
#               (tests/gpu_session_rehearsal.sh runs it).
#
# Environment: BUDGET_S=420 (rehearsal 300) TESTS_S=150 SHAPES="124m 350m" (rehearsal 2x2x64;
# LxHxC: layers, heads, width) BATCH=8 (2) STEPS=12 (4) WARMUP=3 (1) SEQ=1024 (64)
# PARTS="tests attention table profile hf" TEST_FILTER (a gtest filter for every test program)
# OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
rehearse=0
for a in "$@"; do
  case $a in
    -h|--help) usage; exit 0 ;;
    --rehearse) rehearse=1 ;;
    *) echo "gpu_session: unknown argument $a (--rehearse, --help)" >&2; exit 2 ;;
  esac
done
PARTS=${PARTS:-"tests attention table profile hf"}
if ((rehearse)); then
  BUDGET_S=${BUDGET_S:-300} SHAPES=${SHAPES-2x2x64} BATCH=${BATCH:-2} STEPS=${STEPS:-4}
  WARMUP=${WARMUP:-1} SEQ=${SEQ:-64}
  TEST_FILTER=${TEST_FILTER:-"*TimeAttention*:*AutoOrFixed*:*WithoutAGpu*"}
  BUILD=${BUILD:-build/release}
  export ATOLL=$BUILD/atoll-emu PY=$PWD/tests/gpu_rehearsal_python.sh ATOLL_GPU_ENV=rehearsal
  MODEL_STEP=$BUILD/bench/kernels_model_step_emu
  ATTENTION=$BUILD/bench/kernels_attention_emu
  attention_steps=(--steps 1 --warmup 0)
  mapfile -t test_programs < <(find "$BUILD" -type f -name 'cuda_*_emu_test' -perm -u+x | sort)
  rev=$(git describe --always --dirty 2>/dev/null)
else
  BUDGET_S=${BUDGET_S:-420} SHAPES=${SHAPES-"124m 350m"} BATCH=${BATCH:-8} STEPS=${STEPS:-12}
  WARMUP=${WARMUP:-3} SEQ=${SEQ:-1024}
  source scripts/gpu_env.sh || exit 2
  export ATOLL=/tmp/atoll-gpu/bin/atoll PY=${PY:-python3}
  MODEL_STEP=/tmp/atoll-gpu/bin/kernels_model_step
  ATTENTION=/tmp/atoll-gpu/bin/kernels_attention
  attention_steps=()
  mapfile -t test_programs < <(ls /tmp/atoll-gpu/bin/cuda_*_test 2>/dev/null)
  rev=$(head -1 /tmp/atoll-gpu/rev 2>/dev/null)
fi
TESTS_S=${TESTS_S:-150} TEST_FILTER=${TEST_FILTER:-}
for v in BUDGET_S TESTS_S BATCH STEPS SEQ; do
  [[ ${!v} =~ ^[1-9][0-9]*$ ]] || { echo "gpu_session: $v is not a whole number > 0" >&2; exit 2; }
done
[[ $WARMUP =~ ^(0|[1-9][0-9]*)$ ]] || { echo "gpu_session: WARMUP is not a whole number" >&2; exit 2; }
for p in $PARTS; do
  [[ $p =~ ^(tests|attention|table|profile|hf|sanitize)$ ]] ||
    { echo "gpu_session: unknown part $p" >&2; exit 2; }
done
source bench/gpu_shapes.sh
check_shapes gpu_session "$SHAPES"
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8} PYTHONUNBUFFERED=1
out=${OUT:-$(mktemp -d)}
logs=$(mktemp -d)
mkdir -p "$out"
summary=$out/summary.md
failed=() incomplete=()
now_part=start

left() { echo $((BUDGET_S - SECONDS)); }
say() { printf '%s\n' "$*" | tee -a "$summary"; }
# The logs as they are now, into OUT (after every part: a call stopped at its limit keeps them),
# whole or not at all (written beside, then renamed).
keep_logs() {
  if tar -C "$logs" -czf "$out/logs.tar.gz.part" . 2>/dev/null; then
    mv -f "$out/logs.tar.gz.part" "$out/logs.tar.gz"
  else
    rm -f "$out/logs.tar.gz.part"
  fi
}
trap 'rm -rf "$logs"' EXIT
# Stopped (TERM, INT, HUP): the command running stopped too (and waited for: timeout kills it
# within 10 s), a closing line, the logs kept; exit 128 + the signal's number.
child=""
stopped() {
  if [[ -n $child ]]; then
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  say "session: stopped by a signal in part $now_part, $SECONDS s in"
  keep_logs
  exit "$1"
}
trap 'stopped 143' TERM
trap 'stopped 130' INT
trap 'stopped 129' HUP
# part NAME LEAST: whether NAME is asked for and LEAST seconds are left for it (else says why
# not, and counts it as incomplete).
part() {
  [[ " $PARTS " == *" $1 "* ]] || return 1
  if (($(left) < $2)); then
    say "## $1: skipped ($(left) s of the budget left, it needs at least $2)"
    say ""
    incomplete+=("$1")
    return 1
  fi
  now_part=$1
  say "## $1"
  part_start=$SECONDS
  return 0
}
done_part() {  # NAME ok|FAILED|incomplete
  case $2 in FAILED) failed+=("$1") ;; incomplete) incomplete+=("$1") ;; esac
  say "$1: $2 ($((SECONDS - part_start)) s)"
  say ""
  keep_logs
}
# run CAP_S COMMAND...: the command, stopped after CAP_S or what is left of the budget (the
# least), 10 s kept back for the summary and 10 for timeout's kill. Waited for in the background,
# so that a signal to the session is handled at once.
run() {
  local cap=$1 t rc
  shift
  t=$(($(left) - 20))
  ((t < cap)) || t=$cap
  ((t > 0)) || t=1
  timeout -k 10 "$t" "$@" &
  child=$!
  wait "$child"
  rc=$?
  child=""
  return $rc
}
# outcome RC: what a command's exit status makes of its part: ok, incomplete (stopped for want of
# time: timeout's 124, or 137 after its kill) or FAILED.
outcome() {
  case $1 in
    0) echo ok ;;
    124|137) echo incomplete ;;
    *) echo FAILED ;;
  esac
}
# worse A B: the worse of two outcomes (FAILED over incomplete over ok).
worse() {
  if [[ $1 == FAILED || $2 == FAILED ]]; then echo FAILED
  elif [[ $1 == incomplete || $2 == incomplete ]]; then echo incomplete
  else echo ok; fi
}
# test_names LOG FAILED|SKIPPED: gtest's tests of that outcome, each once (gtest names a failed
# or skipped test again in its closing list).
test_names() {
  grep -E "^\\[  $2 +\\] [A-Za-z]" "$1" | sed 's/^[^]]*\] //; s/ (.*//' | sort -u
}

: >"$summary"
say "# atoll GPU session$( ((rehearse)) && echo ' (rehearsal on the CUDA emulator: no speed, a stand-in for PyTorch)'), $(date -u '+%F %H:%M') UTC, ${rev:-revision unknown}"
say "device: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi')"
say "budget ${BUDGET_S} s; shapes $SHAPES; batch $BATCH, seq $SEQ; parts: $PARTS"
say ""

# 1. Tests: each program's passed, failed and skipped tests (counted from gtest's lines, so that
# a program stopped at its time still says how far it got). Failing tests fail the part; a
# program stopped, or not started, for want of time leaves it incomplete.
if part tests 40; then
  r=ok
  filter=()
  [[ -z $TEST_FILTER ]] || filter=(--gtest_filter="$TEST_FILTER")
  ((${#test_programs[@]})) || { say "no CUDA test programs"; r=FAILED; }
  for p in "${test_programs[@]}"; do
    name=$(basename "$p")
    if (($(left) < 40)); then
      say "- $name: skipped ($(left) s of the budget left)"
      r=$(worse "$r" incomplete)
      continue
    fi
    run "$TESTS_S" "$p" "${filter[@]}" >"$logs/$name.log" 2>&1
    rc=$?
    n_ok=$(grep -c '^\[       OK \] ' "$logs/$name.log")
    mapfile -t failures < <(test_names "$logs/$name.log" FAILED)
    line="- $name: $n_ok passed, ${#failures[@]} failed,"
    line+=" $(test_names "$logs/$name.log" SKIPPED | wc -l) skipped"
    last=$(grep '^\[ RUN ' "$logs/$name.log" | tail -1 | sed 's/^[^]]*\] //')
    case $rc in
      0) say "$line" ;;
      124|137) say "$line; stopped after ${TESTS_S} s (or the budget) in ${last:-its start}"
         r=$(worse "$r" incomplete) ;;
      *) say "$line; exit $rc, the last test started: ${last:-none}"; r=FAILED ;;
    esac
    ((${#failures[@]} == 0)) || r=FAILED
    for f in "${failures[@]:0:20}"; do say "  FAILED $f"; done
  done
  done_part tests $r
fi

# 2. The attention alone; the faster backward kind (at the first shape) for what follows.
kind=split
if part attention 30; then
  r=ok
  first=1
  for s in $SHAPES; do
    read -r L H C <<<"$(shape_args "$s")"
    if (($(left) < 30)); then
      say "attention at $s's heads: skipped ($(left) s of the budget left)"
      r=$(worse "$r" incomplete)
      continue
    fi
    say "attention at $s's heads (batch $BATCH, seq $SEQ):"
    run 120 "$ATTENTION" --batch "$BATCH" --seq "$SEQ" --heads "$H" --width "$C" \
      "${attention_steps[@]}" >"$logs/attention-$s.log" 2>&1
    r=$(worse "$r" "$(outcome $?)")
    grep -vE '^(OpenBLAS|$)' "$logs/attention-$s.log" | tee -a "$summary"
    if ((first)); then
      # The least forward + backward of each kind: | rows kind | fwd ms | bwd ms | ...
      faster=$(awk -F'|' '$2 ~ /(split|fused) *$/ { split($2, w, " "); t = $3 + $4;
                 if (!(w[2] in best) || t < best[w[2]]) best[w[2]] = t }
               END { if (("split" in best) && ("fused" in best))
                       print (best["fused"] < best["split"] ? "fused" : "split") }' \
               "$logs/attention-$s.log")
      if grep -q 'every setting gave the same bits' "$logs/attention-$s.log" && [[ -n $faster ]]; then
        kind=$faster
        say "the faster backward at $s: $kind (the table and the profile run it)"
      else
        say "no backward kind chosen (a setting failed or differed): split"
      fi
      first=0
    fi
    run 90 "$PY" bench/torch_attention_gpu.py --batch "$BATCH" --seq "$SEQ" --heads "$H" \
      --width "$C" >"$logs/torch-attention-$s.log" 2>&1
    r=$(worse "$r" "$(outcome $?)")
    tee -a "$summary" <"$logs/torch-attention-$s.log"
    say ""
  done
  done_part attention $r
fi

# 3. The table, shape by shape: each shape needs an atoll run and PyTorch's compile and run.
if part table 60; then
  r=ok
  header_said=0
  : >"$logs/auto-rows"
  for s in $SHAPES; do
    if (($(left) < 60)); then
      say "| $s | skipped ($(left) s of the budget left) |"
      r=$(worse "$r" incomplete)
      continue
    fi
    OUT=$logs/table-$s SHAPES=$s PRECISIONS=bf16 PARTS=table BATCH=$BATCH STEPS=$STEPS \
      WARMUP=$WARMUP SEQ=$SEQ ATOLL_ARGS="--set train.attention_backward=$kind" \
      run 300 bench/gpu_bench.sh >"$logs/table-$s.log" 2>&1
    r=$(worse "$r" "$(outcome $?)")
    if ((!header_said)) && grep -m2 '^|' "$logs/table-$s/gpu_bench.md" 2>/dev/null | tee -a "$summary" |
         grep -q .; then
      header_said=1
    fi
    grep -h "^| $s |" "$logs/table-$s/gpu_bench.md" 2>/dev/null | tee -a "$summary" ||
      say "| $s | no row (see logs.tar.gz: table-$s.log) |"
    grep -h 'attention_rows = auto' "$logs/table-$s/gpu_bench.md" 2>/dev/null >>"$logs/auto-rows"
  done
  say ""
  sed 's/^/atoll /' "$logs/auto-rows" | tee -a "$summary"
  say "(atoll with train.attention_backward = $kind; fp32 not run: PRECISIONS=fp32 bench/gpu_bench.sh)"
  done_part table $r
fi

# 4. Where atoll's bf16 step goes, at the first shape, with the rows auto chose there.
if part profile 30; then
  s=${SHAPES%% *}
  case $s in 124m) preset=gpt2-124m ;; 350m) preset=gpt2-350m ;; *) preset=tiny ;; esac
  rows=$(grep -m1 "^$s bf16: " "$logs/auto-rows" 2>/dev/null | grep -oE 'auto: [0-9]+/[0-9]+' |
         cut -d' ' -f2)
  say "bf16 time per op, preset $preset, batch $BATCH, attention ${rows:-64/64} $kind (the GPU waited for after every op):"
  run 90 "$MODEL_STEP" --device cuda --precision bf16 --preset "$preset" --batch "$BATCH" \
    --steps 3 --warmup 1 --profile --attention-rows "${rows:-64/64}" \
    --attention-backward "$kind" >"$logs/profile.log" 2>&1
  r=$(outcome $?)
  if [[ $r == ok ]]; then
    grep -vE '^(OpenBLAS|SGEMM)' "$logs/profile.log" | tee -a "$summary"
  else
    tail -5 "$logs/profile.log" | tee -a "$summary"
  fi
  done_part profile $r
fi

# 5. The Hugging Face check.
if part hf 45; then
  OUT=$logs/hf run 120 scripts/gpu_check.sh hf >"$logs/hf.log" 2>&1
  r=$(outcome $?)
  tail -3 "$logs/hf.log" | tee -a "$summary"
  done_part hf $r
fi

# 6. compute-sanitizer with what is left: each of its two tools a half, less timeout's kill (30 s).
if part sanitize 120; then
  OUT=$logs/sanitize SANITIZE_S=$((($(left) - 100) / 2)) run "$(left)" scripts/gpu_check.sh \
    sanitize >"$logs/sanitize.log" 2>&1
  grep -E '^(racecheck|memcheck):|gpu_check:' "$logs/sanitize.log" | tee -a "$summary"
  if [[ $(grep -cE '^(racecheck|memcheck): clean' "$logs/sanitize.log") -eq 2 ]]; then r=ok
  elif grep -qE '^(racecheck|memcheck): exit|^gpu_check: (SANITIZE_S|unknown)' "$logs/sanitize.log"
  then r=FAILED  # errors found (exit 3), or the tests or the tool failed
  else r=incomplete; fi  # stopped at its time, or no compute-sanitizer here
  done_part sanitize $r
fi

if ((${#failed[@]} + ${#incomplete[@]} == 0)); then
  say "session: every part asked for ran and passed, $SECONDS s of the ${BUDGET_S} s budget"
else
  say "session: FAILED: ${failed[*]:-none}; incomplete (skipped or stopped for want of time, or no tool): ${incomplete[*]:-none}; $SECONDS s of the ${BUDGET_S} s budget"
fi
keep_logs
echo
echo "== summary ($summary; logs in $out/logs.tar.gz)"
cat "$summary"
((${#failed[@]} + ${#incomplete[@]} == 0))
