#!/usr/bin/env bash
# atoll data import: the prepared token files rewritten as nanoGPT's raw .bin and as llm.c's
# headered shards import back to the same tokens, and a run trained on the import logs bitwise
# the losses of a run on the original (no re-tokenizing, nothing changed); a UTF-8 corpus of any
# file names imports; bad files are refused (exit 2) naming the file.
set -euo pipefail
source "$(dirname "$0")/e2e_lib.sh"

# The prepared tokens as nanoGPT and llm.c files (llm.c: train in 2 shards).
python3 - "$DATA" "$T" <<'PY'
import os, struct, sys
data, t = sys.argv[1], sys.argv[2]
def tokens(path):
    b = open(path, "rb").read()
    assert b[:8] == b"ATOLTOK1"
    n = struct.unpack("<Q", b[8:16])[0]
    return b[24:24 + 2 * n], n
def llmc(path, body, n):
    open(path, "wb").write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)) + body)
os.makedirs(f"{t}/nano"); os.makedirs(f"{t}/llmc")
train, n = tokens(f"{data}/train.bin")
val, m = tokens(f"{data}/val.bin")
open(f"{t}/nano/train.bin", "wb").write(train)
open(f"{t}/nano/val.bin", "wb").write(val)
half = n // 2
llmc(f"{t}/llmc/sotu_train_000001.bin", train[:2 * half], half)
llmc(f"{t}/llmc/sotu_train_000002.bin", train[2 * half:], n - half)
llmc(f"{t}/llmc/sotu_val_000000.bin", val, m)
PY
"$ATOLL" data import --format nanogpt "$T/nano" --out "$T/from_nano" >/dev/null
"$ATOLL" data import --format llmc "$T/llmc" --out "$T/from_llmc" >/dev/null
same_files "$T/from_nano/train.bin" "$T/from_llmc/train.bin"
same_files "$T/from_nano/val.bin" "$T/from_llmc/val.bin"
# atoll's own files back, header and checksum included.
same_files "$T/from_nano/train.bin" "$DATA/train.bin"
same_files "$T/from_nano/val.bin" "$DATA/val.bin"
grep -q '"imported_from": "llmc"' "$T/from_llmc/meta.json" || fail "meta.json: $(cat "$T/from_llmc/meta.json")"

# Files named one by one; then a run on the import logs the losses of a run on the original.
"$ATOLL" data import --format nanogpt --train "$T/nano/train.bin" --val "$T/nano/val.bin" \
  --out "$T/again" >/dev/null
same_files "$T/again/train.bin" "$DATA/train.bin"
for d in "$T/from_llmc" "$DATA"; do
  "$ATOLL" train --config configs/tiny.toml --set data.dir="$d" --set train.steps=6 \
    --set train.eval_every=3 --out "$T/run_$(basename "$d")" -q 2>/dev/null >/dev/null
done
[[ $(wc -l <"$T/run_from_llmc/metrics.jsonl") == 6 ]] || fail "the run on the import did not train"
[[ "$(loss_columns "$T/run_from_llmc/metrics.jsonl")" == "$(loss_columns "$T/run_$(basename "$DATA")/metrics.jsonl")" ]] ||
  fail "the run on the import differs from the run on the original"

# Text: any UTF-8 files, recursively.
mkdir -p "$T/corpus/notes/.git"
printf 'A note in markdown.\n' >"$T/corpus/a.md"
printf 'def f():\n    return 1\n' >"$T/corpus/notes/b.py"
printf 'Caf\xc3\xa9 \xe2\x82\xac\n' >"$T/corpus/notes/c"
printf 'hidden' >"$T/corpus/notes/.git/HEAD"
"$ATOLL" data import --format text "$T/corpus" --val-every 3 --out "$T/text" >"$T/text.out"
grep -q "3 UTF-8 files" "$T/text.out" || fail "text import: $(cat "$T/text.out")"

# Refusals: exit 2, naming the file.
printf '\x89PNG\r\n\x1a\n' >"$T/corpus/logo.png"
expect_exit 2 "$ATOLL" data import --format text "$T/corpus" --out "$T/bad_text"
expect_err "logo.png: not UTF-8 text"
head -c 1001 "$T/nano/val.bin" >"$T/odd.bin"
expect_exit 2 "$ATOLL" data import --format nanogpt --train "$T/odd.bin" --val "$T/nano/val.bin" --out "$T/bad"
expect_err "odd.bin: 1001 bytes, an odd number"
expect_exit 2 "$ATOLL" data import --format llmc --train "$T/nano/train.bin" --val "$T/nano/val.bin" --out "$T/bad"
expect_err "is not llm.c's token file magic 20240520"
expect_exit 2 "$ATOLL" data import --format nanogpt "$T/nano" --vocab-size 100 --out "$T/bad"
expect_err "outside the vocabulary [0, 100)"
expect_exit 2 "$ATOLL" data import --format csv "$T/nano" --out "$T/bad"
expect_err "expected nanogpt, llmc or text"
[[ ! -e $T/bad && ! -e $T/bad_text ]] || fail "a refused import left files behind"
echo PASS
