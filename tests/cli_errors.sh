#!/usr/bin/env bash
# Bad input exits with 2 and a message that names what was wrong; --help works everywhere.
set -euo pipefail
source "$(dirname "$0")/e2e_lib.sh"

for cmd in train eval sample; do
  expect_exit 0 "$ATOLL" "$cmd" --help
  grep -q -- "--" "$T/out" || fail "$cmd --help printed nothing"
done

# Config errors name the key.
expect_exit 2 "$ATOLL" train --config /nonexistent.toml --out "$T/x"
expect_exit 2 "$ATOLL" train --out "$T/x"
expect_err "--config"
printf '[train]\nstepz = 3\n' >"$T/typo.toml"
expect_exit 2 "$ATOLL" train --config "$T/typo.toml" --out "$T/x"
expect_err "train.stepz"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set train.lr=fast --out "$T/x"
expect_err "train.lr"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set train.micro_batch_size=3 --out "$T/x"
expect_err "train.batch_size"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set model.n_head=3 --out "$T/x"
expect_err "model.n_embd"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set world.sites=2 --out "$T/x"
expect_err "world.sites"
# Faults and detectors: a bad spec, a fault outside the run, an unknown key, a bad value.
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --inject flip:step=1 --out "$T/x"
expect_err "unknown kind 'flip'"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --inject param:step=5,bit=40 --out "$T/x"
expect_err "bit: 40 is out of range"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --inject gemm_fwd:step=2,layer=99 --out "$T/x"
expect_err "faults.inject"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set faults.bits=3 --out "$T/x"
expect_err "faults.bits: unknown key"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set sdc.on_alarm=panic --out "$T/x"
expect_err "sdc.on_alarm"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set sdc.audit_every=-1 --out "$T/x"
expect_err "sdc.audit_every: must be >= 0"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set sdc.on_faulty=ignore --out "$T/x"
expect_err "sdc.on_faulty: must be stop or exclude"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set sdc.on_faulty=exclude --out "$T/x"
expect_err "exclude needs world.strategy"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --inject wan:step=2 --out "$T/x"
expect_err "a wan fault needs world.sites > 1"
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --inject wan:step=2,site=1,rank=1 \
  --set world.sites=2 --out "$T/x"
expect_err "rank must be 0"
# The campaign: a bad site, bit or step range.
expect_exit 2 "$ATOLL" sdc-campaign --config configs/tiny.toml --kinds gemm_fwd,cosmic --out "$T/c"
expect_err "unknown injection site 'cosmic'"
expect_exit 2 "$ATOLL" sdc-campaign --config configs/tiny.toml --bits 30-33 --out "$T/c"
expect_err "--bits: '30-33'"
expect_exit 2 "$ATOLL" sdc-campaign --config configs/tiny.toml --first-step 99 --out "$T/c"
expect_err "--first-step: 99 is outside"
expect_exit 2 "$ATOLL" sdc-campaign --config configs/tiny.toml --clean-steps -1 --out "$T/c"
expect_err "--clean-steps: -1 is negative"
# Missing data: a hint to prepare it.
expect_exit 2 "$ATOLL" train --config configs/tiny.toml --set data.dir="$T/none" --out "$T/x"
expect_err "atoll data prepare"

# A good checkpoint, then corrupted and truncated copies of it.
"$ATOLL" train --config configs/tiny.toml --set data.dir="$DATA" --set train.steps=2 \
  --out "$T/run" -q >/dev/null
CK=$T/run/checkpoint
expect_exit 0 "$ATOLL" eval --checkpoint "$CK" --tokens "$DATA/val.bin" --max-windows 4
cp -r "$CK" "$T/flipped"
# Flip one byte inside transformer.wpe.weight (right after wte in the data section).
python3 - "$T/flipped/model.safetensors" <<'PY'
import json, struct, sys
path = sys.argv[1]
blob = bytearray(open(path, "rb").read())
n = struct.unpack("<Q", blob[:8])[0]
begin, end = json.loads(blob[8:8 + n])["transformer.wpe.weight"]["data_offsets"]
blob[8 + n + (begin + end) // 2] ^= 0x10
open(path, "wb").write(bytes(blob))
PY
expect_exit 2 "$ATOLL" eval --checkpoint "$T/flipped" --tokens "$DATA/val.bin"
expect_err "transformer.wpe.weight"
expect_err "model.safetensors"
expect_exit 2 "$ATOLL" sample --checkpoint "$T/flipped" --prompt hi
expect_err "transformer.wpe.weight"
expect_exit 2 "$ATOLL" train --resume "$T/flipped" --out "$T/x"
expect_err "transformer.wpe.weight"

cp -r "$CK" "$T/truncated"
truncate -s -100 "$T/truncated/optimizer.safetensors"
expect_exit 2 "$ATOLL" train --resume "$T/truncated" --out "$T/x"
expect_err "optimizer.safetensors"
expect_err "exp_avg_sq.transformer.ln_f.bias"

cp -r "$CK" "$T/badmanifest"
sed -i 's/"step": 2/"step": 3/' "$T/badmanifest/manifest.json"
expect_exit 2 "$ATOLL" eval --checkpoint "$T/badmanifest" --tokens "$DATA/val.bin"
expect_err "manifest.json"

# Hugging Face weights (config.json + model.safetensors, no manifest): eval gives the checkpoint's
# loss; another model_type is refused by name; --init-from with --resume is refused.
mkdir -p "$T/hf" && cp "$CK/config.json" "$CK/model.safetensors" "$T/hf/"
expect_exit 0 "$ATOLL" eval --checkpoint "$CK" --tokens "$DATA/val.bin" --max-windows 4
cp "$T/out" "$T/loss_ck"
expect_exit 0 "$ATOLL" eval --checkpoint "$T/hf" --tokens "$DATA/val.bin" --max-windows 4
cmp -s "$T/out" "$T/loss_ck" || fail "eval of the HF copy: $(cat "$T/out"), not $(cat "$T/loss_ck")"
cp -r "$T/hf" "$T/hfbert"
sed -i 's/"model_type": "gpt2"/"model_type": "bert"/' "$T/hfbert/config.json"
expect_exit 2 "$ATOLL" sample --checkpoint "$T/hfbert" --prompt hi
expect_err "model_type"
expect_exit 2 "$ATOLL" train --resume "$CK" --init-from "$T/hf" --out "$T/x"
expect_err "--init-from and --resume"
expect_exit 2 "$ATOLL" train --resume "$CK" --set train.init_from="$T/hf" --out "$T/x"
expect_err "leave train.init_from as it was"
expect_exit 2 "$ATOLL" train --config configs/small.toml --set data.dir="$DATA" --init-from "$T/hf" \
  --out "$T/x"
expect_err "set [model] to the weights' shape"

expect_exit 2 "$ATOLL" eval --checkpoint "$T/nothing" --tokens "$DATA/val.bin"
expect_exit 2 "$ATOLL" eval --checkpoint "$CK" --tokens "$T/none.bin"
expect_err "none.bin"
expect_exit 2 "$ATOLL" eval --checkpoint "$CK"

# launch --resume of something that is not a checkpoint; plan goodput --startup of bad JSON.
expect_exit 2 "$ATOLL" launch --config configs/tiny.toml --set world.sites=2 --insecure \
  --resume "$T" --out "$T/w"
expect_err "not a checkpoint"
echo '{"fixed_s": 1}' >"$T/startup.json"
expect_exit 2 "$ATOLL" plan goodput --startup "$T/startup.json"
expect_err "per_rank_s"
echo 'not json' >"$T/startup.json"
expect_exit 2 "$ATOLL" plan goodput --startup "$T/startup.json"
expect_err "not JSON"

# certs: one more party's certificate from the CA directory; bad parties and arguments refused.
"$ATOLL" certs --out "$T/certs" --sites 2 >/dev/null 2>&1 || fail "atoll certs failed"
"$ATOLL" certs --ca "$T/certs-ca" --issue site-2 --out "$T/site2" >/dev/null 2>&1 ||
  fail "atoll certs --issue failed"
[[ -f $T/site2/site-2.key && -f $T/site2/token && ! -e $T/site2/ca.key ]] ||
  fail "certs --issue wrote: $(ls "$T/site2")"
expect_exit 2 "$ATOLL" certs --ca "$T/certs-ca" --issue site-02 --out "$T/bad"
expect_err "a party is"
expect_exit 2 "$ATOLL" certs --issue site-3 --out "$T/bad"
expect_err "--ca"
expect_exit 2 "$ATOLL" certs --out "$T/bad"
expect_err "--sites"
echo "PASS"
