#!/usr/bin/env python3
"""Peer benchmark on a GPU: trains atoll's GPT in PyTorch 2.x as fast as PyTorch reasonably goes,
and prints tokens/s and MFU (bench/gpu_bench.sh runs it next to atoll).

    python3 bench/torch_gpt_gpu.py --n-layer 12 --n-head 12 --n-embd 768 --seq-len 1024 \
        --vocab 50257 --batch 8 [--dtype bf16|fp32] [--no-compile] [--steps 20 --warmup 5] [--json]

The same model as atoll (GPT-2: learned positions, pre-LayerNorm, causal attention, tanh GELU,
biases, LM head tied to the token embedding), uniform random tokens (speed does not depend on
them), one micro-batch per step, global-norm clipping at 1.0 and AdamW(fused=True). Attention is
F.scaled_dot_product_attention(is_causal=True) (flash attention on the GPU); the model is
torch.compile'd unless --no-compile; bf16 is autocast (bf16 compute, fp32 master weights and
optimizer state) with TF32 allowed, fp32 keeps matmuls in full fp32 (no TF32), as atoll's fp32.

tokens/s = batch * seq_len * (steps - warmup) / wall time of the timed steps (CUDA-synchronized).
MFU = tokens/s * F_tok / peak, F_tok = 6 N + 12 L T C (N: matmul weights incl. the tied head),
peak = --peak-tflops (default: 989 for bf16, 67 for fp32: H100 SXM dense).
"""
import argparse
import json
import math
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, c, nh):
        super().__init__()
        self.nh = nh
        self.ln_1 = nn.LayerNorm(c)
        self.c_attn = nn.Linear(c, 3 * c)
        self.c_proj = nn.Linear(c, c)
        self.ln_2 = nn.LayerNorm(c)
        self.c_fc = nn.Linear(c, 4 * c)
        self.mlp_proj = nn.Linear(4 * c, c)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.nh, C // self.nh).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self, L, nh, c, T, V):
        super().__init__()
        self.wte = nn.Embedding(V, c)
        self.wpe = nn.Embedding(T, c)
        self.blocks = nn.ModuleList(Block(c, nh) for _ in range(L))
        self.ln_f = nn.LayerNorm(c)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.size(1), device=idx.device))
        for b in self.blocks:
            x = b(x)
        logits = F.linear(self.ln_f(x), self.wte.weight)
        return F.cross_entropy(logits.view(-1, logits.size(-1)).float(), targets.reshape(-1))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n-layer", type=int, default=12)
    ap.add_argument("--n-head", type=int, default=12)
    ap.add_argument("--n-embd", type=int, default=768)
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--peak-tflops", type=float, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        print("torch_gpt_gpu: no CUDA device", file=sys.stderr)
        return 2
    dev = "cuda"
    bf16 = a.dtype == "bf16"
    torch.backends.cuda.matmul.allow_tf32 = bf16
    torch.backends.cudnn.allow_tf32 = bf16
    torch.manual_seed(1)
    L, nh, C, T, V = a.n_layer, a.n_head, a.n_embd, a.seq_len, a.vocab
    model = GPT(L, nh, C, T, V).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1,
                            fused=True)
    step_fn = model if a.no_compile else torch.compile(model)
    g = torch.Generator(device=dev).manual_seed(2)

    def step():
        idx = torch.randint(0, V, (a.batch, T + 1), device=dev, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            loss = step_fn(idx[:, :-1], idx[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.steps - a.warmup):
        loss = step()
    torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    tps = a.batch * T * (a.steps - a.warmup) / dt
    N = L * 12 * C * C + V * C
    f_tok = 6 * N + 12 * L * T * C
    peak = a.peak_tflops or (989.0 if bf16 else 67.0)
    mfu = tps * f_tok / (peak * 1e12)
    out = {"peer": "pytorch", "torch": torch.__version__, "gpu": torch.cuda.get_device_name(),
           "dtype": a.dtype, "compile": not a.no_compile, "batch": a.batch, "seq_len": T,
           "n_layer": L, "n_embd": C, "tokens_per_s": tps, "mfu": mfu, "peak_tflops": peak,
           "loss": float(loss)}
    print(json.dumps(out) if a.json else
          f"pytorch {a.dtype}: {tps:,.0f} tokens/s, MFU {100 * mfu:.1f}% of {peak:.0f} TFLOP/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
