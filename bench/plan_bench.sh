#!/usr/bin/env bash
# Speed of the planner's full frontier sweep (1e24..1e34 FLOP) per setting, as a table.
#   bench/plan_bench.sh [BUILD_DIR]      (default: build/plan-only, configured if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build/plan-only}
if [[ ! -f "$BUILD/build.ninja" && ! -f "$BUILD/Makefile" ]]; then
  cmake --preset plan-only >/dev/null
  BUILD=build/plan-only
fi
cmake --build "$BUILD" -j2 --target plan_bench >/dev/null
BIN="$BUILD/plan_bench"
echo "machine: $(nproc) CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'))"
"$BIN" "${@:2}"
