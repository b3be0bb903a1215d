#!/usr/bin/env bash
# Packs test programs built here for a GPU machine that has the CUDA driver and libraries but not
# atoll's other dependencies (OpenBLAS, fmt, ...): copies each program to .gpu/bin and the shared
# libraries it needs, except the C/C++ runtimes and CUDA's own, to .gpu/lib. Then, on the GPU machine (the
# device tool's `run` with carry [".gpu"]): scripts/gpu_test.sh.
#
# Usage: scripts/gpu_pack.sh [PROGRAM...]   (default: every CUDA test program of build/release)
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
progs=("$@")
if [[ ${#progs[@]} -eq 0 ]]; then
  mapfile -t progs < <(find build/release -type f -name 'cuda_*_test' -perm -u+x | sort)
fi
if [[ ${#progs[@]} -eq 0 ]]; then
  echo "gpu_pack: no CUDA test programs in build/release (is nvcc installed? run scripts/setup.sh)" >&2
  exit 2
fi
rm -rf .gpu
mkdir -p .gpu/bin .gpu/lib
for p in "${progs[@]}"; do
  [[ -x "$p" ]] || { echo "gpu_pack: not a program: $p" >&2; exit 2; }
  cp "$p" .gpu/bin/
  # Libraries resolved outside glibc and CUDA (the GPU machine brings its own of those).
  ldd "$p" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -v -E '/(libc|libm|libpthread|libdl|librt|libstdc\+\+|libgcc_s|ld-linux[^/]*)\.so|/libcu|/libnv|/libnccl' |
    while read -r lib; do cp -L -n "$lib" .gpu/lib/; done
done
echo "gpu_pack: $(ls .gpu/bin | wc -l) programs, $(du -sh .gpu | cut -f1) in .gpu/"
