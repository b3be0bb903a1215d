# Shared prelude of the end-to-end CLI tests: `source tests/e2e_lib.sh path/to/atoll`.
# Sets ATOLL (the binary), T (a scratch directory removed on exit) and DATA (prepared token
# files: .cache/data/sotu from `atoll data prepare`, or prepared into T if that is missing; the
# test is skipped, exit 77, when neither is possible).
ATOLL=${1:?usage: $0 path/to/atoll}
T=$(mktemp -d "${TMPDIR:-/tmp}/atoll_e2e.XXXXXX")
trap 'rm -rf "$T"' EXIT
# OpenBLAS's AVX-512 kernels where the CPU has them (an AVX2-only CPU, e.g. AMD Zen 3, would die
# of an illegal instruction in them).
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=${OPENBLAS_CORETYPE:-SkylakeX}
DATA=${ATOLL_TEST_DATA:-.cache/data/sotu}
if [[ ! -f $DATA/train.bin || ! -f $DATA/val.bin ]]; then
  if "$ATOLL" data prepare --out "$T/sotu" >"$T/prepare.log" 2>&1; then
    DATA=$T/sotu
  else
    echo "SKIP: no token files in $DATA and 'atoll data prepare' failed:" >&2
    tail -3 "$T/prepare.log" >&2
    exit 77
  fi
fi

fail() {
  echo "FAIL: $*" >&2
  exit 1
}
source "${BASH_SOURCE[0]%/*}/coordinator_lib.sh"

# expect_exit CODE cmd...: runs cmd with stdout in $T/out and stderr in $T/err.
expect_exit() {
  local want=$1 rc=0
  shift
  "$@" >"$T/out" 2>"$T/err" || rc=$?
  [[ $rc == "$want" ]] || fail "expected exit $want, got $rc from: $* -- stderr: $(cat "$T/err")"
}

# expect_err TEXT: the last expect_exit's stderr contains TEXT.
expect_err() {
  grep -qF -- "$1" "$T/err" || fail "stderr lacks '$1': $(cat "$T/err")"
}

# The deterministic columns of a metrics.jsonl (drops tokens_per_s and step_ms).
loss_columns() {
  sed -E 's/,"tokens_per_s":[^,}]*//; s/,"step_ms":[^,}]*//' "$1"
}

same_files() {
  cmp -s "$1" "$2" || fail "$1 and $2 differ"
}

# column KEY FILE: the values of KEY in a metrics.jsonl, one a line ("-" where absent).
column() {
  sed -E "s/.*\"$1\":([^,}]*).*/\1/; t; s/.*/-/" "$2"
}

# close A B [STEPS]: every step's loss and val_loss within 1e-5 relative (STEPS lines, 20).
close() {
  local key
  for key in loss val_loss; do
    paste <(column "$key" "$1") <(column "$key" "$2") | awk -v key="$key" -v f="$2" -v steps="${3:-20}" '
      { n++; if ($1 == "-" && $2 == "-") next;
        if ($1 == "-" || $2 == "-") { print "missing " key " at line " NR " of " f; bad = 1; exit }
        d = $1 - $2; if (d < 0) d = -d; r = d / ($1 < 0 ? -$1 : $1);
        if (r > 1e-5) { print key " at line " NR ": " $1 " vs " $2 " (" r " relative) in " f; bad = 1 } }
      END { if (n != steps) { print n " lines in " f ", expected " steps; bad = 1 } exit bad }' ||
      fail "$2 differs from $1"
  done
}

# wait_for_step METRICS STEP [SECONDS]: waits (up to SECONDS, 60) until a metrics.jsonl has the
# line of STEP; fails otherwise.
wait_for_step() {
  local i
  for ((i = 0; i < ${3:-60} * 10; i++)); do
    [[ -f $1 ]] && grep -q "\"step\":$2," "$1" && return 0
    sleep 0.1
  done
  fail "$1 did not reach step $2 within ${3:-60} s"
}

# kill_coordinator_at RUN STEP PID WHAT: once site 1 of the launch writing RUN (pid PID, stderr in
# RUN.err) logged STEP, kills its coordinator (-9); launch must then finish (exit 0) having
# started it again, with no site ended. WHAT names the run in failures.
kill_coordinator_at() {
  local run=$1 step=$2 pid=$3 what=$4 rc=0
  wait_for_step "$run/site-1/metrics.jsonl" "$step"
  pkill -9 -f "atoll coordinator .*--state $run " || { kill "$pid"; fail "no coordinator to kill"; }
  wait "$pid" || rc=$?
  [[ $rc == 0 ]] || fail "$what with its coordinator killed exited $rc: $(tail -20 "$run.err")"
  grep -q "the coordinator ended (killed by signal 9" "$run.err" ||
    fail "launch did not start the coordinator again: $(tail "$run.err")"
  ! grep -q "site [0-9] ended" "$run.err" || fail "a site ended with the coordinator: $(cat "$run.err")"
}
