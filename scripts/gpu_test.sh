#!/usr/bin/env bash
# Runs on a GPU machine: every program scripts/gpu_pack.sh put in .gpu/bin, with the packed
# libraries and the machine's own CUDA libraries (cuBLASLt from the CUDA toolkit or from
# PyTorch's wheels). Writes each program's output to $OUT (when set) and exits non-zero if any
# program failed.
#
# Usage: scripts/gpu_test.sh [GTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
[[ -d .gpu/bin ]] || { echo "gpu_test: no .gpu/bin (run scripts/gpu_pack.sh first, carry .gpu)" >&2; exit 2; }
libdirs=$PWD/.gpu/lib
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $d ]] && libdirs+=":$d"
done
cublas=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1 || true)
[[ -n "$cublas" ]] && libdirs+=":$(dirname "$cublas")"
export LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
status=0
for p in .gpu/bin/*; do
  name=$(basename "$p")
  echo "== $name"
  if "$p" "$@" 2>&1 | tee "${OUT:-/tmp}/$name.log"; then :; else status=1; fi
done
exit $status
