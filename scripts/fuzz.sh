#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/*_fuzz.cc; clang-14, AddressSanitizer + UBSan, in build/fuzz)
# and runs each from its seed corpus, then prints a table: target, seconds, inputs run, coverage,
# corpus size, crashes.
#
#   scripts/fuzz.sh                    every target for 600 s, one at a time
#   scripts/fuzz.sh --seconds 60 codec token   some targets, for 60 s each
#   scripts/fuzz.sh --smoke            every target for 10 s, two at a time (scripts/test.sh)
#   scripts/fuzz.sh --jobs 2           two targets at a time
#   scripts/fuzz.sh --seeds            rewrite fuzz/corpus/ with fuzz/make_seeds.cc (then commit)
#
# Seeds: fuzz/corpus/TARGET/ (committed; config_toml also reads configs/). What the fuzzer finds
# is kept in build/fuzz/corpus/TARGET/ (not committed), so later runs start from it. A crash or a
# violated property leaves its input in build/fuzz/crashes/TARGET/ and the log beside it; the
# script then exits 1. Reproduce one with: build/fuzz/fuzz/TARGET_fuzz build/fuzz/crashes/TARGET/crash-...
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=600 jobs=1 seeds=0
targets=()
while (($#)); do
  case "$1" in
    --seconds) seconds="$2"; shift 2 ;;
    --jobs) jobs="$2"; shift 2 ;;
    --smoke) seconds=10 jobs=2; shift ;;
    --seeds) seeds=1; shift ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "fuzz.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
[[ "$seconds" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --seconds needs a positive integer" >&2; exit 2; }
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "fuzz.sh: --jobs needs a positive integer" >&2; exit 2; }

if ! command -v clang++-14 >/dev/null ||
   ! ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a >/dev/null 2>&1; then
  scripts/setup.sh --packages-only
fi
[[ -f build/fuzz/build.ninja ]] || cmake --preset fuzz >/dev/null
echo "fuzz: building (build/fuzz)"
cmake --build build/fuzz -j "$(nproc)" >build/fuzz/build.log 2>&1 ||
  { tail -30 build/fuzz/build.log >&2; echo "fuzz: the build failed (build/fuzz/build.log)" >&2; exit 1; }

if ((seeds)); then
  rm -rf fuzz/corpus
  build/fuzz/fuzz/make_seeds fuzz/corpus
  echo "fuzz: wrote $(find fuzz/corpus -type f | wc -l) seeds into fuzz/corpus"
  exit 0
fi

if ((${#targets[@]} == 0)); then
  for f in fuzz/*_fuzz.cc; do t=$(basename "$f" _fuzz.cc); targets+=("$t"); done
fi
for t in "${targets[@]}"; do
  [[ -x build/fuzz/fuzz/${t}_fuzz ]] || { echo "fuzz.sh: no target $t (fuzz/${t}_fuzz.cc)" >&2; exit 2; }
done

# gRPC and protobuf keep process-wide state alive at exit: no leak reports.
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=0:${ASAN_OPTIONS:-}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1:${UBSAN_OPTIONS:-}"
out=build/fuzz/runs
mkdir -p "$out"

run_one() {
  local t="$1" work=build/fuzz/corpus/$1 crashes=build/fuzz/crashes/$1
  mkdir -p "$work" "$crashes"
  local extra=()
  [[ "$t" == config_toml ]] && extra+=(configs)
  local start=$SECONDS rc=0
  build/fuzz/fuzz/${t}_fuzz -max_total_time="$seconds" -print_final_stats=1 -rss_limit_mb=2048 \
    -max_len=65536 -timeout=30 -artifact_prefix="$crashes/" "$work" "fuzz/corpus/$t" "${extra[@]}" \
    >"$out/$t.log" 2>&1 || rc=$?
  echo "$rc $((SECONDS - start))" >"$out/$t.result"
}

printf 'fuzz: %d targets, %d s each, %d at a time\n' "${#targets[@]}" "$seconds" "$jobs"
running=0
for t in "${targets[@]}"; do
  run_one "$t" &
  running=$((running + 1))
  if ((running >= jobs)); then wait -n || true; running=$((running - 1)); fi
done
wait

failed=0
printf '%-16s %8s %12s %8s %8s %8s\n' target seconds runs cov corpus crashes
for t in "${targets[@]}"; do
  read -r rc secs <"$out/$t.result"
  runs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$out/$t.log" | grep -o '[0-9]*$' || echo '?')
  cov=$(grep -o 'cov: [0-9]*' "$out/$t.log" | tail -1 | grep -o '[0-9]*$' || echo '?')
  corpus=$(find "build/fuzz/corpus/$t" -type f | wc -l)
  crashes=$(find "build/fuzz/crashes/$t" -type f \( -name 'crash-*' -o -name 'timeout-*' -o -name 'oom-*' -o -name 'leak-*' \) | wc -l)
  printf '%-16s %8s %12s %8s %8s %8s\n' "$t" "$secs" "$runs" "$cov" "$corpus" "$crashes"
  if ((rc != 0 || crashes > 0)); then
    failed=1
    echo "fuzz: $t FAILED (exit $rc): see $out/$t.log and build/fuzz/crashes/$t/" >&2
    grep -m5 -E 'ERROR|property violated|runtime error' "$out/$t.log" >&2 || true
  fi
done
exit "$failed"
