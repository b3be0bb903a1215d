#!/usr/bin/python3
"""Peer benchmark: trains atoll's GPT in PyTorch on the CPU and prints tokens/s.

    /usr/bin/python3 bench/torch_gpt.py --config configs/small.toml [--set section.key=value ...]
        [--steps N] [--warmup W] [--threads K] [--mode eager|script|script-fuse|best] [--json]

The same model as atoll (GPT-2: learned positions, pre-LayerNorm, causal attention, tanh GELU,
biases, LM head tied to the token embedding), the same shape, batch (train.batch_size sequences
per step in micro-batches of train.micro_batch_size, gradients accumulated), sequence length,
fp32, global-norm clipping and AdamW with warmup + cosine lr, on train.threads threads
(torch.set_num_threads; also set OMP_NUM_THREADS / OPENBLAS_NUM_THREADS to the same number
before starting python so OpenBLAS, which torch uses for fp32 GEMM here, agrees, and with more
than one thread OMP_WAIT_POLICY=PASSIVE, so torch's idle OpenMP workers do not spin against
OpenBLAS's threads (~1.5x faster at 2 threads here): bench/bench_vs_torch.sh does all that). Trains on random windows of <data.dir>/train.bin if it exists, else on uniform
random tokens (the speed does not depend on which).

tokens/s = batch_size * seq_len * (steps - warmup) / wall time of those steps (the first
`warmup` steps are excluded: allocator, OpenBLAS buffers and, with TorchScript, the profiling
runs happen there).

Written the fastest reasonable way PyTorch 1.13 allows on a CPU: fused QKV projection, the
causal mask folded into one baddbmm (scale and additive -inf mask), F.gelu(approximate="tanh"),
foreach AdamW, set_to_none zero_grad. 1.13 has no scaled_dot_product_attention and no
torch.compile. --mode picks eager, TorchScript (torch.jit.script), or TorchScript with the
NNC CPU fuser enabled; --mode best times each for a few steps and runs the fastest.
Prints a human line, or with --json one JSON object on the last line.
"""
import argparse
import json
import math
import os
import struct
import sys
import time
import tomllib

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C: int, H: int, T: int):
        super().__init__()
        self.n_head = H
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)
        # additive causal mask: 0 on and below the diagonal, -inf above
        self.register_buffer("mask", torch.full((T, T), float("-inf")).triu(1), persistent=False)
        self.scale = 1.0 / math.sqrt(C // H)

    def forward(self, x):
        B, T, C = x.shape
        H = self.n_head
        hd = C // H
        qkv = self.c_attn(self.ln_1(x))
        q, k, v = qkv.split(C, dim=2)
        q = q.reshape(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd)
        k = k.reshape(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd)
        v = v.reshape(B, T, H, hd).transpose(1, 2).reshape(B * H, T, hd)
        att = torch.baddbmm(self.mask[:T, :T], q, k.transpose(1, 2), beta=1.0, alpha=self.scale)
        att = att.softmax(dim=-1)
        y = torch.bmm(att, v).reshape(B, H, T, hd).transpose(1, 2).reshape(B, T, C)
        x = x + self.c_proj(y)
        x = x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))
        return x


class GPT(nn.Module):
    def __init__(self, L: int, H: int, C: int, T: int, V: int):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList([Block(C, H, T) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        for name, p in self.named_parameters():  # GPT-2 init
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                nn.init.normal_(p, 0.0, 0.02 / (math.sqrt(2 * L) if name.endswith("proj.weight") else 1.0))

    def forward(self, idx, targets):
        B, T = idx.shape
        pos = torch.arange(T, dtype=torch.long)
        x = self.wte(idx) + self.wpe(pos)
        for blk in self.h:
            x = blk(x)
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.weight)  # tied LM head
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(B * T))


def load_config(path, sets):
    with open(path, "rb") as f:
        cfg = tomllib.load(f)
    for s in sets:
        key, _, val = s.partition("=")
        sec, _, k = key.partition(".")
        if not k or sec not in cfg or k not in cfg[sec]:
            raise SystemExit(f"torch_gpt: unknown config key {key!r}")
        old = cfg[sec][k]
        cfg[sec][k] = type(old)(float(val)) if isinstance(old, (int, float)) and not isinstance(old, bool) else val
    return cfg


def lr_at(step, t):
    warm, total = t.get("warmup_steps", 0), t["steps"]
    if step < warm:
        return t["lr"] * (step + 1) / warm
    frac = min(1.0, (step - warm) / max(1, total - warm))
    return t["min_lr"] + 0.5 * (1 + math.cos(math.pi * frac)) * (t["lr"] - t["min_lr"])


def batches(cfg, seed):
    m, t = cfg["model"], cfg["train"]
    T, B, V = m["seq_len"], t["micro_batch_size"], m["vocab_size"]
    path = os.path.join(cfg.get("data", {}).get("dir", ""), "train.bin")
    rng = np.random.default_rng(seed)
    toks = None
    if os.path.exists(path):
        with open(path, "rb") as f:
            head = f.read(24)
        if head[:8] == b"ATOLTOK1":
            n = struct.unpack("<Q", head[8:16])[0]
            toks = np.memmap(path, dtype="<u2", mode="r", offset=24, shape=(n,))
    source = path if toks is not None else "random tokens"
    def gen():
        while True:
            if toks is not None:
                starts = rng.integers(0, len(toks) - T - 1, size=B)
                w = np.stack([np.asarray(toks[s:s + T + 1], dtype=np.int64) for s in starts])
            else:
                w = rng.integers(0, V, size=(B, T + 1), dtype=np.int64)
            w = torch.from_numpy(w)
            yield w[:, :T].contiguous(), w[:, 1:].contiguous()
    return gen(), source


def build(cfg, mode):
    m = cfg["model"]
    torch.manual_seed(cfg["train"]["seed"])
    model = GPT(m["n_layer"], m["n_head"], m["n_embd"], m["seq_len"], m["vocab_size"])
    t = cfg["train"]
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": t["weight_decay"]},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=t["lr"], betas=(t["beta1"], t["beta2"]), eps=t["eps"], foreach=True)
    torch._C._jit_override_can_fuse_on_cpu(mode == "script-fuse")
    torch._C._jit_set_texpr_fuser_enabled(mode == "script-fuse")
    run = torch.jit.script(model) if mode.startswith("script") else model
    return model, run, opt


def train(cfg, mode, steps, warmup, data, quiet=False):
    t = cfg["train"]
    model, run, opt = build(cfg, mode)
    accum = t["batch_size"] // t["micro_batch_size"]
    params = list(model.parameters())
    tokens_per_step = t["batch_size"] * cfg["model"]["seq_len"]
    times, losses = [], []
    for step in range(steps):
        t0 = time.perf_counter()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, t)
        total = 0.0
        for _ in range(accum):
            x, y = next(data)
            loss = run(x, y) / accum
            loss.backward()
            total += loss.item()
        if t.get("grad_clip", 0) > 0:
            torch.nn.utils.clip_grad_norm_(params, t["grad_clip"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
        losses.append(total)
        if not quiet:
            print(f"  [{mode}] step {step:4d}  loss {total:.4f}  {times[-1] * 1e3:8.1f} ms"
                  f"  {tokens_per_step / times[-1]:9.0f} tok/s{'  (warm-up)' if step < warmup else ''}",
                  file=sys.stderr, flush=True)
    measured = times[warmup:]
    tps = tokens_per_step * len(measured) / sum(measured)
    return tps, sum(measured) / len(measured), losses


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", default="configs/small.toml")
    ap.add_argument("--set", action="append", default=[], metavar="section.key=value")
    ap.add_argument("--steps", type=int, default=10, help="steps to run (default 10)")
    ap.add_argument("--warmup", type=int, default=2, help="first steps not timed (default 2)")
    ap.add_argument("--threads", type=int, default=None, help="default: train.threads (0: all cores)")
    ap.add_argument("--mode", default="eager", choices=["eager", "script", "script-fuse", "best"])
    ap.add_argument("--probe-steps", type=int, default=4, help="steps per mode for --mode best")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.steps <= a.warmup:
        ap.error("--steps must exceed --warmup")
    cfg = load_config(a.config, a.set)
    t = cfg["train"]
    if t["batch_size"] % t["micro_batch_size"]:
        raise SystemExit("torch_gpt: train.batch_size must be a multiple of train.micro_batch_size")
    threads = a.threads if a.threads is not None else t.get("threads", 0)
    if threads <= 0:
        threads = int(os.environ.get("OMP_NUM_THREADS", 0)) or os.cpu_count()
    torch.set_num_threads(threads)
    t["steps"] = a.steps  # the lr schedule spans the run, as atoll's does with --set train.steps
    data, source = batches(cfg, t["seed"])

    mode, probe = a.mode, {}
    if mode == "best":
        for m in ("eager", "script", "script-fuse"):
            probe[m], _, _ = train(cfg, m, a.probe_steps, min(2, a.probe_steps - 1), data, quiet=True)
            print(f"  probe {m:12s} {probe[m]:9.0f} tok/s", file=sys.stderr, flush=True)
        mode = max(probe, key=probe.get)
    tps, step_s, losses = train(cfg, mode, a.steps, a.warmup, data)
    m = cfg["model"]
    res = {"tokens_per_s": tps, "step_ms": step_s * 1e3, "mode": mode, "threads": threads,
           "torch": torch.__version__, "steps": a.steps, "warmup": a.warmup,
           "n_layer": m["n_layer"], "n_head": m["n_head"], "n_embd": m["n_embd"],
           "seq_len": m["seq_len"], "vocab_size": m["vocab_size"], "batch_size": t["batch_size"],
           "micro_batch_size": t["micro_batch_size"], "data": source,
           "first_loss": losses[0], "last_loss": losses[-1], "probe_tokens_per_s": probe}
    if a.json:
        print(json.dumps(res))
    else:
        print(f"torch {torch.__version__} [{mode}] {threads} threads: {tps:.0f} tokens/s "
              f"({step_s * 1e3:.1f} ms/step over steps {a.warmup}..{a.steps - 1}); "
              f"loss {losses[0]:.3f} -> {losses[-1]:.3f}")


if __name__ == "__main__":
    main()
