#!/usr/bin/env bash
# A CUDA source's machine code (SASS) for sm_90, and its kernels' instruction counts, without a
# GPU: how many instructions a kernel's loops issue a trip, which is what a change to a kernel's
# arithmetic changes first.
#
#   scripts/sass.sh FILE.cu [KERNEL]     counts for the kernels whose mangled name contains KERNEL
#   scripts/sass.sh --dump FILE.cu       the whole disassembly
#
# CUDA 13 here has ptxas but neither nvdisasm nor cuobjdump. Debian's non-free
# nvidia-cuda-toolkit (11.8) has nvdisasm: the first run downloads that package (84 MB) into
# .cache/nvdisasm with a source list of its own (`apt-get download`: nothing is installed, the
# system's sources are untouched) and keeps nvdisasm alone. The source is compiled for sm_90 with
# the flags of ptxas's register report (`nvcc -O3 -std=c++17 --expt-relaxed-constexpr -I src`),
# and the cubin's ELF header is rewritten from CUDA 13's layout (ABI version 8, the architecture
# in e_flags' second byte) to 11.8's (ABI version 7, EF_CUDA_SM90 | EF_CUDA_VIRTUAL_SM(90)), which
# is all nvdisasm 11.8 needs to read it. For each kernel: its instructions, its HMMAs (tensor-core
# products), and each loop (a branch back) of 50 instructions or more: its length and its
# opcodes by count (a loop holding both sides of an if counts both; "?" is an instruction
# nvdisasm 11.8 cannot name). Exit 2 for bad arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
usage() { awk 'NR == 1 { next } /^#/ { sub(/^# ?/, ""); print; next } { exit }' "$0"; }
[[ ${1:-} == -h || ${1:-} == --help ]] && { usage; exit 0; }
dump=0
[[ ${1:-} == --dump ]] && { dump=1; shift; }
src=${1:-}
[[ -f $src && $src == *.cu ]] || { echo "sass.sh: a .cu file, not '${src}'" >&2; usage >&2; exit 2; }
kernel=${2:-}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
tools=.cache/nvdisasm
if [[ ! -x $tools/nvdisasm ]]; then
  echo "sass.sh: fetching nvdisasm (Debian's nvidia-cuda-toolkit, non-free) into $tools" >&2
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  mkdir -p "$tmp/lists/partial" "$tmp/archives/partial" "$tools"
  echo "deb http://deb.debian.org/debian bookworm non-free" >"$tmp/sources.list"
  opts=(-o Dir::Etc::sourcelist="$tmp/sources.list" -o Dir::Etc::sourceparts=-
        -o Dir::State::Lists="$tmp/lists" -o Dir::Cache::archives="$tmp/archives")
  if ! { apt-get "${opts[@]}" update && (cd "$tmp" && apt-get "${opts[@]}" download \
           nvidia-cuda-toolkit) && dpkg-deb -x "$tmp"/nvidia-cuda-toolkit_*.deb "$tmp/x"; } \
         >"$tmp/apt.log" 2>&1; then
    echo "sass.sh: could not fetch Debian's nvidia-cuda-toolkit (a Debian mirror and its key" \
      "are needed):" >&2
    tail -20 "$tmp/apt.log" >&2
    exit 1
  fi
  cp "$tmp/x/usr/bin/nvdisasm" "$tools/nvdisasm"
  rm -rf "$tmp"
  trap - EXIT
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$nvcc" -I src -O3 --generate-code=arch=compute_90,code=sm_90 --expt-relaxed-constexpr \
  -std=c++17 -cubin -x cu "$src" -o "$work/a.cubin"
python3 - "$work/a.cubin" <<'EOF'
import struct, sys
d = bytearray(open(sys.argv[1], "rb").read())
if d[:4] != b"\x7fELF" or d[4] != 2:
    sys.exit("sass.sh: not a 64-bit ELF cubin")
arch = (struct.unpack_from("<I", d, 48)[0] >> 8) & 0xFF if d[8] >= 8 else None
if arch not in (None, 90):
    sys.exit(f"sass.sh: cubin for sm_{arch}, not sm_90")
d[8] = 7
struct.pack_into("<I", d, 48, 0x005A055A)
open(sys.argv[1], "wb").write(d)
EOF
if [[ $dump == 1 ]]; then
  "$tools/nvdisasm" "$work/a.cubin"
  exit 0
fi
"$tools/nvdisasm" -hex "$work/a.cubin" >"$work/a.sass"
python3 - "$work/a.sass" "$kernel" <<'EOF'
import collections, re, sys
want = sys.argv[2]
funcs, cur = {}, None
for line in open(sys.argv[1]):
    m = re.match(r"^\.text\.(\S+):$", line)
    if m:
        cur = m.group(1)
        funcs[cur] = []
    elif cur:
        funcs[cur].append(line)

def opcode(inst):
    return re.sub(r"^@!?U?P[T0-9]+\s+", "", inst).split()[0].split(".")[0]

def target(addr, lo, hi):
    """A BRA's destination, from its encoding: a signed count of 4-byte words from the next
    instruction, in bits 16-23 and 34-63 of the low word and 0-17 of the high one (nvdisasm 11.8
    leaves some destinations without a label)."""
    w = ((lo >> 16) & 0xFF) | ((lo >> 34) << 8) | ((hi & 0x3FFFF) << 38)
    if w >= 1 << 55:
        w -= 1 << 56
    return addr + 16 + 4 * w

for name, lines in sorted(funcs.items()):
    if want not in name:
        continue
    # Every 16 bytes an instruction: its two encoding words, one a line; its text beside the
    # first where nvdisasm 11.8 knows it (not every one of CUDA 13's: "?" then).
    words, texts = [], {}
    for line in lines:
        m = re.search(r"/\* (0x[0-9a-f]{16}) \*/", line)
        if not m:
            continue
        t = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;", line)
        if t:
            texts[int(t.group(1), 16)] = t.group(2)
        words.append(int(m.group(1), 16))
    insts = [(16 * k, texts.get(16 * k, "?"), words[2 * k], words[2 * k + 1])
             for k in range(len(words) // 2)]
    ops = [opcode(t) for _, t, _, _ in insts]
    at_addr = {a: k for k, (a, _, _, _) in enumerate(insts)}
    print(f"{name}: {len(insts)} instructions, {ops.count('HMMA')} HMMA")
    for k, (addr, text, lo, hi) in enumerate(insts):
        if ops[k] != "BRA":
            continue
        start = at_addr.get(target(addr, lo, hi))
        if start is None or start > k or k - start + 1 < 50:
            continue
        counts = collections.Counter(ops[start : k + 1])
        print(f"  loop of {k - start + 1}: " +
              " ".join(f"{o} {v}" for o, v in counts.most_common(24)))
EOF
