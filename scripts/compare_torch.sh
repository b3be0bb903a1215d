#!/usr/bin/env bash
# Checks atoll's whole model (loss and every parameter gradient) against the PyTorch reference
# (scripts/torch_reference.py: the same GPT-2 in float64 on the CPU, from the same checkpoint).
#
#   scripts/compare_torch.sh [options] [CHECKPOINT [TOKENS]]
#
#   CHECKPOINT  a checkpoint directory (model.safetensors + config.json). Default: train one
#               (atoll train --config configs/PRESET.toml --set train.steps=STEPS) in a temp dir.
#   TOKENS      a token file (ATOLTOK1). Default: the first WINDOWS*(T+1)+T/2 tokens of the
#               prepared validation split (<data.dir>/val.bin), rewritten with a fresh header,
#               so the incomplete tail that eval must ignore is exercised too.
#   --preset P      tiny (default) or small, or any configs/P.toml
#   --steps N       training steps for the default checkpoint (default 3)
#   --windows N     windows of T+1 tokens in the default token file (default 32)
#   --keep          keep the work directory (always kept on FAIL)
#   ATOLL=path      the atoll binary (default build/release/atoll)
#   LOSS_RTOL, GRAD_RTOL   tolerances (default 1e-5 and 1e-4)
#
# Criteria (issue 2, item 5):
#   loss:   |L_atoll - L_torch| / |L_torch|            <= LOSS_RTOL
#   grads:  for every tensor, ||g_atoll - g_torch||_2 / ||g_torch||_2 <= GRAD_RTOL
#           (Frobenius norms over the whole tensor; the max |g_atoll - g_torch| is reported too)
#   and both files hold exactly the same tensor names and shapes.
# Prints a table per tensor and PASS or FAIL; exits 1 on FAIL, 2 on a usage or setup error.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=/usr/bin/python3   # Debian's python3 with python3-torch; the pyenv python3 on PATH lacks torch
ATOLL=${ATOLL:-build/release/atoll}
LOSS_RTOL=${LOSS_RTOL:-1e-5}
GRAD_RTOL=${GRAD_RTOL:-1e-4}
PRESET=tiny STEPS=3 WINDOWS=32 KEEP=0
ARGS=()
while (($#)); do
  case "$1" in
    --preset) PRESET=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --windows) WINDOWS=$2; shift 2 ;;
    --keep) KEEP=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "compare_torch: unknown option $1" >&2; exit 2 ;;
    *) ARGS+=("$1"); shift ;;
  esac
done
CKPT=${ARGS[0]:-}
TOKENS=${ARGS[1]:-}
[[ -x "$ATOLL" ]] || { echo "compare_torch: no atoll binary at $ATOLL (build it, or set ATOLL=...)" >&2; exit 2; }
"$PY" -c 'import torch, numpy' 2>/dev/null || { echo "compare_torch: $PY cannot import torch (apt install python3-torch)" >&2; exit 2; }

WORK=$(mktemp -d "${TMPDIR:-/tmp}/compare_torch.XXXXXX")
cleanup() { local rc=$?; if ((rc == 0 && !KEEP)); then rm -rf "$WORK"; else echo "compare_torch: files kept in $WORK"; fi; }
trap cleanup EXIT

CONFIG=configs/$PRESET.toml
[[ -f "$PRESET" ]] && CONFIG=$PRESET
if [[ -z "$CKPT" ]]; then
  [[ -f "$CONFIG" ]] || { echo "compare_torch: no config $CONFIG" >&2; exit 2; }
  echo "== training a $PRESET checkpoint for $STEPS steps: $ATOLL train --config $CONFIG --set train.steps=$STEPS --out $WORK/run"
  "$ATOLL" train --config "$CONFIG" --set "train.steps=$STEPS" --out "$WORK/run" </dev/null >"$WORK/train.log" 2>&1 ||
    { cat "$WORK/train.log" >&2; echo "compare_torch: atoll train failed" >&2; exit 2; }
  CKPT=$WORK/run/checkpoint
fi
[[ -f "$CKPT/model.safetensors" && -f "$CKPT/config.json" ]] ||
  { echo "compare_torch: $CKPT is not a checkpoint directory (model.safetensors + config.json)" >&2; exit 2; }

if [[ -z "$TOKENS" ]]; then
  # The data directory named by the config ([data] dir), else the default.
  DATA_DIR=$(sed -n 's/^[[:space:]]*dir[[:space:]]*=[[:space:]]*"\([^"]*\)".*/\1/p' "$CONFIG" 2>/dev/null | head -1)
  VAL=${DATA_DIR:-.cache/data/sotu}/val.bin
  [[ -f "$VAL" ]] || { echo "compare_torch: no $VAL: prepare the corpus first (scripts/setup.sh, then atoll data prepare)" >&2; exit 2; }
  TOKENS=$WORK/tokens.bin
  "$PY" - "$CKPT/config.json" "$VAL" "$TOKENS" "$WINDOWS" <<'EOF'
# Writes the first WINDOWS*(T+1) + T//2 tokens of VAL as a token file (header + XXH3-64 of the
# token bytes, computed with libxxhash through ctypes, as atoll's core/hash does).
import ctypes, json, struct, sys
cfg, val, out, windows = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
T = int(json.load(open(cfg))["n_positions"])
with open(val, "rb") as f:
    head = f.read(24)
    assert head[:8] == b"ATOLTOK1", f"{val}: not a token file"
    n_have = struct.unpack("<Q", head[8:16])[0]
    n = min(n_have, windows * (T + 1) + T // 2)
    data = f.read(2 * n)
xxh = ctypes.CDLL("libxxhash.so.0")
xxh.XXH3_64bits.restype = ctypes.c_uint64
xxh.XXH3_64bits.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
with open(out, "wb") as f:
    f.write(b"ATOLTOK1" + struct.pack("<QQ", n, xxh.XXH3_64bits(data, len(data))) + data)
print(f"== token file: {n} tokens from {val} ({n // (T + 1)} windows of {T}+1, tail {n % (T + 1)}) -> {out}")
EOF
fi

echo "== atoll:  $ATOLL eval --checkpoint $CKPT --tokens $TOKENS --grads-out $WORK/grads_atoll.safetensors"
T0=$(date +%s.%N)
"$ATOLL" eval --checkpoint "$CKPT" --tokens "$TOKENS" --grads-out "$WORK/grads_atoll.safetensors" \
  </dev/null >"$WORK/atoll.out" 2>"$WORK/atoll.err" ||
  { cat "$WORK/atoll.out" "$WORK/atoll.err" >&2; echo "compare_torch: atoll eval failed" >&2; exit 2; }
T1=$(date +%s.%N)
echo "== torch:  $PY scripts/torch_reference.py --checkpoint $CKPT --tokens $TOKENS --grads-out $WORK/grads_torch.safetensors"
"$PY" scripts/torch_reference.py --checkpoint "$CKPT" --tokens "$TOKENS" \
  --grads-out "$WORK/grads_torch.safetensors" >"$WORK/torch.out" 2>"$WORK/torch.err" ||
  { cat "$WORK/torch.out" "$WORK/torch.err" >&2; echo "compare_torch: torch_reference.py failed" >&2; exit 2; }
T2=$(date +%s.%N)
echo "   (atoll eval $(echo "$T1 - $T0" | bc) s, torch reference $(echo "$T2 - $T1" | bc) s)"

"$PY" - "$WORK" "$LOSS_RTOL" "$GRAD_RTOL" "$ROOT/scripts" <<'EOF'
import json, math, sys
work, loss_rtol, grad_rtol = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
sys.path.insert(0, sys.argv[4])
from torch_reference import load_safetensors

def last_json_loss(path):
    for line in reversed(open(path).read().splitlines()):
        line = line.strip()
        if line.startswith("{") and '"loss"' in line:
            return float(json.loads(line)["loss"])
    raise SystemExit(f"compare_torch: no {{\"loss\": ...}} line in {path}")

la, lt = last_json_loss(f"{work}/atoll.out"), last_json_loss(f"{work}/torch.out")
loss_rel = abs(la - lt) / abs(lt)
ok = loss_rel <= loss_rtol
print(f"\nloss: atoll {la:.10f}  torch(f64) {lt:.10f}  rel diff {loss_rel:.2e}  (tol {loss_rtol:g})  "
      f"{'ok' if loss_rel <= loss_rtol else 'FAIL'}")

ga, _ = load_safetensors(f"{work}/grads_atoll.safetensors")
gt, _ = load_safetensors(f"{work}/grads_torch.safetensors")
for name in sorted(set(gt) - set(ga)):
    print(f"FAIL missing in atoll's gradients: {name}"); ok = False
for name in sorted(set(ga) - set(gt)):
    print(f"FAIL atoll wrote a gradient the model does not have: {name}"); ok = False
w = max([len(n) for n in gt] + [6])
print(f"\n{'tensor':<{w}}  {'shape':>14}  {'||g_torch||':>11}  {'rel err':>9}  {'max|diff|':>9}  ")
worst_rel, worst_name = 0.0, ""
for name, t in gt.items():
    if name not in ga:
        continue
    a, t = ga[name].double(), t.double()
    if list(a.shape) != list(t.shape):
        print(f"{name:<{w}}  FAIL shape {list(a.shape)} != {list(t.shape)}"); ok = False
        continue
    nt = t.norm().item()
    d = (a - t)
    rel = d.norm().item() / nt if nt > 0 else d.norm().item()
    finite = bool(a.isfinite().all())
    good = finite and rel <= grad_rtol
    ok &= good
    if rel > worst_rel:
        worst_rel, worst_name = rel, name
    shape = "x".join(map(str, t.shape))
    print(f"{name:<{w}}  {shape:>14}  {nt:11.4e}  {rel:9.2e}  {d.abs().max().item():9.2e}  "
          f"{'' if good else ('FAIL (non-finite)' if not finite else 'FAIL')}")
print(f"\n{len(gt)} tensors; worst rel err {worst_rel:.2e} ({worst_name}), tol {grad_rtol:g}; "
      "rel err = ||g_atoll - g_torch||_2 / ||g_torch||_2 per tensor")
print("PASS" if ok else "FAIL")
sys.exit(0 if ok else 1)
EOF
