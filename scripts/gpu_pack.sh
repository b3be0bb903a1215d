#!/usr/bin/env bash
# Packs programs built here for a GPU machine that has the CUDA driver and libraries but not
# atoll's other dependencies (OpenBLAS, fmt, gRPC, MPI, ...): the programs and the shared libraries
# they need, except the C/C++ runtimes and CUDA's own, into .gpu/pack.tar.xz (compressed: the
# device tool carries at most 64 MiB), with the revision packed. On the GPU machine (the device
# tool's `run` with carry [".gpu/pack.tar.xz"]): scripts/gpu_session.sh runs every check in one
# call; scripts/gpu_test.sh runs the CUDA tests; `source scripts/gpu_env.sh` sets up PATH and
# LD_LIBRARY_PATH for anything else (atoll itself with --atoll).
#
# Usage: scripts/gpu_pack.sh [--atoll] [--baseline FILE] [PROGRAM...]
#   (build/release is brought up to date first; default: every CUDA test program of
#   build/release; --atoll adds build/release/atoll and the model-step and attention benchmarks,
#   build/release/bench/kernels_model_step and kernels_attention; --baseline adds FILE, a
#   kernels_model_step built from another revision, as kernels_model_step_base, for
#   bench/gpu_bench.sh's part ab)
set -euo pipefail
cd "$(dirname "$0")/.."
progs=()
baseline=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --atoll) progs+=(build/release/atoll build/release/bench/kernels_model_step
                     build/release/bench/kernels_attention) ;;
    --baseline)
      [[ -x "${2:-}" ]] || { echo "gpu_pack: --baseline needs a program" >&2; exit 2; }
      baseline=$2
      shift ;;
    *) progs+=("$1") ;;
  esac
  shift
done
if [[ -n "$baseline" ]]; then
  for p in "${progs[@]}"; do
    [[ "$(realpath "$p")" != "$(realpath "$baseline")" ]] ||
      { echo "gpu_pack: --baseline $baseline is also packed as itself (build it elsewhere)" >&2; exit 2; }
  done
  progs+=("$baseline")
fi
# What is packed is what the sources say now: build/release brought up to date first.
[[ -f build/release/build.ninja ]] ||
  { echo "gpu_pack: no build/release (run scripts/setup.sh first)" >&2; exit 2; }
mkdir -p .gpu
if ! cmake --build build/release -j "$(nproc)" >.gpu/build.log 2>&1; then
  tail -30 .gpu/build.log >&2
  echo "gpu_pack: building build/release failed (cmake --build build/release; .gpu/build.log)" >&2
  exit 1
fi
mapfile -t tests < <(find build/release -type f -name 'cuda_*_test' -not -name '*emu*' -perm -u+x | sort)
if [[ ${#tests[@]} -eq 0 ]]; then
  echo "gpu_pack: no CUDA test programs in build/release (is nvcc installed? run scripts/setup.sh)" >&2
  exit 2
fi
progs+=("${tests[@]}")
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for p in "${progs[@]}"; do
  [[ -x "$p" ]] || { echo "gpu_pack: not a program: $p" >&2; exit 2; }
  if [[ "$p" == "$baseline" ]]; then cp "$p" "$stage/bin/kernels_model_step_base"; else cp "$p" "$stage/bin/"; fi
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnv|/libnccl' |
    while read -r lib; do cp -L -n "$lib" "$stage/lib/"; done
done
# The revision packed, for the GPU session's summary (scripts/gpu_session.sh): the commit, and
# a hash of the uncommitted change when there is one.
rev=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
if [[ -n "$(git status --porcelain 2>/dev/null)" ]]; then
  rev+=" + uncommitted change $( (git diff HEAD; git ls-files --others --exclude-standard |
    xargs -r cat) | sha1sum | cut -c1-10)"
fi
echo "$rev, packed $(date -u '+%F %H:%M') UTC" >"$stage/rev"
mkdir -p .gpu
tar -C "$stage" -cf - bin lib rev | xz -T2 -6 > .gpu/pack.tar.xz
echo "gpu_pack: $(ls "$stage/bin" | wc -l) programs, $(ls "$stage/lib" | wc -l) libraries:" \
  "$(du -sh .gpu/pack.tar.xz | cut -f1) in .gpu/pack.tar.xz"
