#!/usr/bin/env python3
"""An atoll checkpoint in Hugging Face transformers, with no conversion: the check of issue 18.

    python3 scripts/hf_check.py --checkpoint DIR --tokens FILE --atoll-loss L \
        --atoll-logits FILE [--max-windows N] [--rtol 1e-5]

Loads DIR with transformers' GPT2LMHeadModel.from_pretrained (model.safetensors + config.json as
atoll writes them), in float64 on the CPU, and compares with `atoll eval` on the same checkpoint:
  - the mean next-token loss over the first N windows of FILE (atoll eval's windows: consecutive,
    non-overlapping, seq_len + 1 tokens each), against --atoll-loss: relative error <= rtol;
  - the logits of the first window, against --atoll-logits (atoll eval --logits-out): normalized
    error ||hf - atoll||_2 / ||hf||_2 <= rtol.
With --save-pretrained OUT, the model transformers loaded is also written back by its own
save_pretrained (float32, safetensors) into OUT, for `atoll eval --checkpoint OUT` to read: the
other direction (train/hf_import.h; scripts/gpu_check.sh compares the two losses).
Prints one JSON line with both errors and exits 0 on PASS, 1 on FAIL, 2 on a usage error. Needs
torch, transformers and safetensors: the GPU machines have them (scripts/gpu_check.sh runs this).
"""
import argparse
import json
import struct
import sys

import numpy as np


def read_tokens(path):
    with open(path, "rb") as f:
        head = f.read(24)
        if len(head) != 24 or head[:8] != b"ATOLTOK1":
            sys.exit(f"hf_check: {path}: not an atoll token file (ATOLTOK1)")
        (n,) = struct.unpack("<Q", head[8:16])
        data = np.frombuffer(f.read(2 * n), dtype="<u2")
    if data.size != n:
        sys.exit(f"hf_check: {path}: truncated ({data.size} of {n} tokens)")
    return data.astype(np.int64)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--atoll-loss", type=float, required=True)
    ap.add_argument("--atoll-logits", required=True)
    ap.add_argument("--max-windows", type=int, default=16)
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--save-pretrained", metavar="OUT", default="")
    a = ap.parse_args()

    import torch
    from safetensors.torch import load_file
    from transformers import GPT2LMHeadModel

    model = GPT2LMHeadModel.from_pretrained(a.checkpoint).double().eval()
    T = model.config.n_positions
    tokens = read_tokens(a.tokens)
    windows = min(a.max_windows, (tokens.size) // (T + 1)) if a.max_windows > 0 else tokens.size // (T + 1)
    if windows < 1:
        sys.exit(2)
    w = torch.from_numpy(tokens[: windows * (T + 1)].reshape(windows, T + 1))
    with torch.no_grad():
        logits = model(w[:, :T]).logits  # [windows, T, V], float64
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, logits.size(-1)), w[:, 1:].reshape(-1)).item()
    theirs = load_file(a.atoll_logits)["logits"].to(torch.float64)[0]
    mine = logits[0]
    if theirs.shape != mine.shape:
        print(f"hf_check: logits shapes differ: atoll {tuple(theirs.shape)}, hf {tuple(mine.shape)}")
        return 1
    logit_err = (torch.linalg.norm(mine - theirs) / torch.linalg.norm(mine)).item()
    loss_err = abs(loss - a.atoll_loss) / abs(loss)
    ok = loss_err <= a.rtol and logit_err <= a.rtol
    result = {"windows": windows, "hf_loss": loss, "atoll_loss": a.atoll_loss,
              "loss_rel_err": loss_err, "logits_norm_err": logit_err,
              "rtol": a.rtol, "result": "PASS" if ok else "FAIL"}
    if a.save_pretrained:
        # Back to the checkpoint's float32 (exact: every value came from a float).
        model.float().save_pretrained(a.save_pretrained, safe_serialization=True)
        result["saved"] = a.save_pretrained
    print(json.dumps(result))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
