#!/usr/bin/env bash
# scripts/gpu_session.sh --rehearse: the one-call GPU session on the CUDA emulator (BUILD's
# *_emu programs, a tiny shape, a stand-in for PyTorch), so that the script a rare GPU lease
# runs is known to work before it spends the lease. Checks that every part runs and reports
# (the tests' tallies, the attention table and the backward kind it picks, the table's row and
# what train.attention_rows = auto chose, the profile, the Hugging Face check), that OUT holds
# the two files the device tool returns, that a part the budget cannot cover is skipped saying
# so, that a failing part fails the session (exit 1), that a session stopped by a signal says
# where and keeps its logs (exit 143), and that bad arguments exit 2.
#
# Usage: tests/gpu_session_rehearsal.sh [BUILD]   (default build/release)
set -uo pipefail
cd "$(dirname "$0")/.."
export BUILD=${1:-build/release}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "gpu_session_rehearsal: $*" >&2; exit 1; }
# The session trains on .cache/data/sotu, as on the GPU machine (carried there): prepared here
# when missing, else the test is skipped (exit 77).
if [[ ! -f .cache/data/sotu/train.bin || ! -f .cache/data/sotu/val.bin ]] &&
   ! "$BUILD/atoll" data prepare --out .cache/data/sotu >"$tmp/prepare.log" 2>&1; then
  echo "SKIP: no .cache/data/sotu and 'atoll data prepare' failed:" >&2
  tail -3 "$tmp/prepare.log" >&2
  exit 77
fi
expect() {  # FILE PATTERN WHAT
  grep -qE -- "$2" "$1" || { cat "$1" >&2; fail "$3 (no /$2/ in $1)"; }
}

# The whole session.
OUT=$tmp/out scripts/gpu_session.sh --rehearse >"$tmp/log" 2>&1
rc=$?
[[ $rc -eq 0 ]] || { tail -60 "$tmp/log" >&2; fail "the rehearsal exited $rc"; }
s=$tmp/out/summary.md
[[ "$(ls "$tmp/out" | sort | tr '\n' ' ')" == "logs.tar.gz summary.md " ]] ||
  fail "OUT holds $(ls "$tmp/out" | tr '\n' ' '), not summary.md and logs.tar.gz"
expect "$s" '^# atoll GPU session \(rehearsal' "no heading"
expect "$s" '^- cuda_ops_emu_test: 1 passed, 0 failed, 0 skipped$' "no tally of the op tests"
expect "$s" '^- cuda_train_emu_test: 1 passed, 0 failed, 1 skipped$' "no tally of the training tests"
expect "$s" '^tests: ok' "the tests part did not pass"
expect "$s" '^\| 128/128 fused \| [0-9.]+ \| [0-9.]+ \|' "no attention table"
expect "$s" '^the faster backward at 2x2x64: (split|fused) ' "no backward kind chosen"
expect "$s" '^attention: ok' "the attention part did not pass"
expect "$s" '^\| 2x2x64 \| not run \| - \| not run \| - \| - \| [0-9,]+ \| [0-9.]+% \| 1,000 \|' \
  "no table row (atoll bf16 against the stand-in's 1,000 tok/s)"
expect "$s" '^atoll 2x2x64 bf16: train.attention_rows = auto: (64|128)/(64|128) ' \
  "the table's atoll run did not say what train.attention_rows = auto chose"
expect "$s" '^table: ok' "the table part did not pass"
expect "$s" 'attention (64|128)/(64|128) (split|fused)' "the profile did not take auto's rows"
expect "$s" '^profile: ok' "the profile part did not pass"
expect "$s" '"result": "PASS"' "the Hugging Face check did not pass"
expect "$s" '^hf_import: PASS' "atoll eval did not read back what save_pretrained wrote"
expect "$s" '^hf: ok' "the hf part did not pass"
expect "$s" '^session: every part asked for ran and passed' "no closing line"
tar -tzf "$tmp/out/logs.tar.gz" >"$tmp/files" || fail "logs.tar.gz is not a tar"
for f in cuda_ops_emu_test.log attention-2x2x64.log table-2x2x64.log profile.log hf.log; do
  expect "$tmp/files" "/$f\$" "$f not among the logs"
done

# A budget too small for the parts: skipped, saying so, and the session incomplete (exit 1).
OUT=$tmp/short BUDGET_S=20 PARTS="table hf" scripts/gpu_session.sh --rehearse >"$tmp/short.log" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "a session whose parts were all skipped exited $rc, not 1"
expect "$tmp/short/summary.md" '^## table: skipped \([0-9]+ s of the budget left, it needs at least 60\)' \
  "the table was not skipped"
expect "$tmp/short/summary.md" '^## hf: skipped' "hf was not skipped"
expect "$tmp/short/summary.md" '^session: FAILED: none; incomplete [^:]*: table hf;' \
  "the closing line does not name the skipped parts"

# Parts that fail (test programs stopped at their time; heads that do not divide the width,
# which atoll and the bench refuse) fail the session, each saying so.
OUT=$tmp/bad SHAPES=2x3x64 TESTS_S=1 PARTS="tests attention table" \
  scripts/gpu_session.sh --rehearse >"$tmp/bad.log" 2>&1
rc=$?
[[ $rc -eq 1 ]] || fail "a session with failing parts exited $rc, not 1"
expect "$tmp/bad/summary.md" '^- cuda_train_emu_test: [0-9]+ passed, 0 failed, [0-9]+ skipped; stopped after 1 s \(or the budget\) in ' \
  "a test program stopped at its time did not say so"
expect "$tmp/bad/summary.md" '^tests: incomplete' "the tests part was not incomplete"
expect "$tmp/bad/summary.md" '^attention: FAILED' "the attention part did not fail"
expect "$tmp/bad/summary.md" '^table: FAILED' "the table part did not fail"
expect "$tmp/bad/summary.md" '^session: FAILED: attention table; incomplete [^:]*: tests;' \
  "no failing closing line"

# Stopped by a signal (as a call at its limit may be): a closing line naming the part, the logs
# kept, exit 143.
OUT=$tmp/term scripts/gpu_session.sh --rehearse >"$tmp/term.log" 2>&1 &
session=$!
for _ in $(seq 600); do
  grep -q '^## tests' "$tmp/term/summary.md" 2>/dev/null && break
  sleep 0.1
done
kill -TERM "$session"
wait "$session"
rc=$?
[[ $rc -eq 143 ]] || fail "a session stopped by TERM exited $rc, not 143"
expect "$tmp/term/summary.md" '^session: stopped by a signal in part tests, [0-9]+ s in$' \
  "a stopped session did not say where it stopped"
[[ -f $tmp/term/logs.tar.gz ]] || fail "a stopped session kept no logs"

# Bad arguments.
for bad in "--bogus" "PARTS=everything" "SHAPES=1b" "SHAPES=" "BUDGET_S=soon" "BUDGET_S=0420"; do
  if [[ $bad == --* ]]; then
    scripts/gpu_session.sh --rehearse "$bad" >/dev/null 2>&1
  else
    env "$bad" scripts/gpu_session.sh --rehearse >/dev/null 2>&1
  fi
  rc=$?
  [[ $rc -eq 2 ]] || fail "$bad: exit $rc, not 2"
done
echo "gpu_session_rehearsal: ok"
