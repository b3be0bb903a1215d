# Shared by the world benches (strategies_bench.sh, diloco_gap.sh); source it after setting
# ATOLL (the atoll binary), T (the scratch directory) and BENCH (the name for messages).
source "$(dirname "${BASH_SOURCE[0]}")/bench_lib.sh"

# world_run NAME ARGS...: `atoll launch` of configs/small.toml (one rank per site, global batch
# of 16, no jitter, --insecure, quiet) with ARGS into $T/NAME; output in $T/NAME.out/.err.
world_run() {
  local name=$1
  shift
  local try
  for try in 1 2; do
    echo "$BENCH: $name" >&2
    rm -rf "${T:?}/$name"
    "$ATOLL" launch --config configs/small.toml --insecure -q --out "$T/$name" \
      --set world.ranks_per_site=1 --set train.batch_size=16 --set world.link.jitter_ms=0 "$@" \
      >"$T/$name.out" 2>"$T/$name.err" && return 0
    # Seen once in 20 runs: OpenMPI failing to make its session directory at start; try again.
    echo "$BENCH: $name failed (try $try): $(tail -3 "$T/$name.err")" >&2
  done
  return 1
}
