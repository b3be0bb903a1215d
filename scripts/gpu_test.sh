#!/usr/bin/env bash
# Runs on a GPU machine: every CUDA test program that scripts/gpu_pack.sh packed (cuda_*_test),
# each one's output also in $OUT/<name>.log when OUT is set. Exits non-zero if any failed.
#
# Usage: scripts/gpu_test.sh [GTEST_ARGS...]
set -uo pipefail
cd "$(dirname "$0")/.."
if [[ "${1:-}" == "-h" || "${1:-}" == "--help" ]]; then
  sed -n '2,5p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
source scripts/gpu_env.sh || exit 2
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null || true
status=0
for p in /tmp/atoll-gpu/bin/cuda_*_test; do
  name=$(basename "$p")
  echo "== $name"
  "$p" "$@" 2>&1 | tee "${OUT:-/tmp}/$name.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
done
exit $status
