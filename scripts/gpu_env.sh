# Sourced on a GPU machine (bash): unpacks .gpu/pack.tar.xz (scripts/gpu_pack.sh) into
# /tmp/atoll-gpu (again whenever the pack differs from the one unpacked there: a warm machine
# keeps /tmp between calls), and puts its programs on PATH and its libraries, with the machine's
# own CUDA libraries (the toolkit's, or the ones PyTorch's wheels bring), on LD_LIBRARY_PATH.
_atoll_root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [[ ! -f "$_atoll_root/.gpu/pack.tar.xz" ]]; then
  echo "gpu_env: no .gpu/pack.tar.xz (run scripts/gpu_pack.sh here first, then carry .gpu)" >&2
  return 2
fi
_sum=$(cksum <"$_atoll_root/.gpu/pack.tar.xz")
if [[ ! -d /tmp/atoll-gpu/bin || "$(cat /tmp/atoll-gpu/.pack 2>/dev/null)" != "$_sum" ]]; then
  rm -rf /tmp/atoll-gpu
  if ! { mkdir -p /tmp/atoll-gpu && xz -dc "$_atoll_root/.gpu/pack.tar.xz" |
           tar -C /tmp/atoll-gpu -xf - && echo "$_sum" >/tmp/atoll-gpu/.pack; }; then
    echo "gpu_env: unpacking $_atoll_root/.gpu/pack.tar.xz into /tmp/atoll-gpu failed" >&2
    rm -rf /tmp/atoll-gpu
    return 2
  fi
fi
_libs=/tmp/atoll-gpu/lib
for _d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib; do
  [[ -d $_d ]] && _libs+=":$_d"
done
_cublas=$(find /usr/local /opt /usr/lib -name 'libcublasLt.so.13*' 2>/dev/null | head -1)
[[ -n "$_cublas" ]] && _libs+=":$(dirname "$_cublas")"
# NCCL (comm/nccl/): the toolkit's, or the one PyTorch's wheels bring (nvidia/nccl/lib).
_nccl=$(find /usr/local /opt /usr/lib -name 'libnccl.so.2*' 2>/dev/null | head -1)
[[ -n "$_nccl" ]] && _libs+=":$(dirname "$_nccl")"
export LD_LIBRARY_PATH="$_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PATH="/tmp/atoll-gpu/bin:$PATH"
export ATOLL_GPU_ENV=1  # what gpu_check.sh looks for before sourcing this again
unset _atoll_root _libs _d _cublas _nccl _sum
