# Shared by the benchmark scripts: the environment they run in, and their command line. Source it
# from the repository root.
grep -qw avx512f /proc/cpuinfo && export OPENBLAS_CORETYPE=SkylakeX
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1

# bench_help FILE: the comment block at the top of FILE, without the leading "# ".
bench_help() {
  awk 'NR > 1 && !/^#/ { exit } NR > 1' "$1" | sed 's/^# \{0,1\}//'
}

# bench_args SCRIPT ARGS...: a benchmark's command line, `--out DIR` (sets OUT, "" without it) or
# `--help` (prints SCRIPT's header and exits); anything else exits 2.
bench_args() {
  local script=$1
  shift
  OUT=""
  while (($#)); do
    case $1 in
      --out) OUT=$2; shift 2 ;;
      -h|--help) bench_help "$script"; exit 0 ;;
      *) echo "$(basename "$script" .sh): unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
  done
}
