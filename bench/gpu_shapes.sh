# The GPT-2 shapes the GPU benchmarks take (sourced by bench/gpu_bench.sh and
# scripts/gpu_session.sh): 124m (12 layers, 12 heads, width 768), 350m (24, 16, 1024), or LxHxC.

# shape_args SHAPE: "L H C".
shape_args() {
  case $1 in
    124m) echo "12 12 768" ;;
    350m) echo "24 16 1024" ;;
    *) echo "${1//x/ }" ;;
  esac
}

# check_shapes WHO SHAPES: exits 2, saying so as WHO, unless SHAPES (a space-separated list)
# names at least one shape and each is one.
check_shapes() {
  local s
  [[ -n ${2// /} ]] || { echo "$1: SHAPES is empty (124m, 350m, LxHxC)" >&2; exit 2; }
  for s in $2; do
    [[ $s == 124m || $s == 350m || $s =~ ^[1-9][0-9]*x[1-9][0-9]*x[1-9][0-9]*$ ]] ||
      { echo "$1: unknown shape $s (124m, 350m, LxHxC)" >&2; exit 2; }
  done
}
