#!/usr/bin/env bash
# Speed of the planner's full frontier sweep (1e24..1e34 FLOP) per setting, as a table.
#   bench/plan_bench.sh [BUILD_DIR]      (default: build/plan-only, configured if missing)
# Uses BUILD_DIR/plan_bench when the top-level CMakeLists adds bench/plan; otherwise compiles
# bench/plan/plan_bench.cc against BUILD_DIR's atoll_plan and atoll_core libraries.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/plan-only}
if [[ ! -f "$BUILD/build.ninja" && ! -f "$BUILD/Makefile" ]]; then
  cmake --preset plan-only >/dev/null
  BUILD=build/plan-only
fi
if cmake --build "$BUILD" -j2 --target plan_bench >/dev/null 2>&1 && [[ -x "$BUILD/plan_bench" ]]; then
  BIN="$BUILD/plan_bench"
else
  cmake --build "$BUILD" -j2 --target atoll_plan atoll_core >/dev/null
  BIN="$BUILD/plan_bench_standalone"
  ${CXX:-g++} -std=c++20 -O3 -march=native -Isrc bench/plan/plan_bench.cc \
    "$BUILD/src/plan/libatoll_plan.a" "$BUILD/src/core/libatoll_core.a" \
    -lfmt -lxxhash -ltomlplusplus -o "$BIN"
fi
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
"$BIN" "${@:2}"
