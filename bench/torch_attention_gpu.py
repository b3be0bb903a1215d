#!/usr/bin/env python3
"""Peer for bench/kernels/attention.cc on a GPU: PyTorch's causal scaled_dot_product_attention
alone, forward and backward, at one shape, for each SDPA backend that runs it, timed as atoll's.

    python3 bench/torch_attention_gpu.py --batch 8 --seq 1024 --heads 12 --width 768 \
        [--steps 20] [--warmup 3] [--backends default,flash,cudnn,efficient]

q, k and v are views of one (B, T, 3C) bf16 tensor, as bench/torch_gpt_gpu.py's model makes
them (split, view, transpose: no copy). A forward is SDPA(q, k, v, is_causal=True); a backward
is out.backward(dout) on a graph kept across calls (retain_graph), the gradients written into
qkv's. Each is called `steps` times back to back after `warmup`, timed by CUDA events: the time
a call is their mean. FLOPs as FlashAttention counts them for a causal attention (as atoll's
bench): forward 4 B NH T^2 D / 2, backward 2.5 times that. A backend that refuses the shape is
reported as such. Prints a markdown table.
"""
import argparse
import contextlib
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

BACKENDS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
}


def timed(fn, steps, warmup):
    """Mean seconds of fn() over steps calls after warmup, by CUDA events."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1e3 / steps


def run(name, args):
    B, T, NH, C = args.batch, args.seq, args.heads, args.width
    D = C // NH
    gen = torch.Generator(device="cuda").manual_seed(7)
    qkv = torch.randn(B, T, 3 * C, device="cuda", dtype=torch.bfloat16, generator=gen)
    qkv.requires_grad_(True)
    dout = 0.1 * torch.randn(B, NH, T, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    q, k, v = (t.view(B, T, NH, D).transpose(1, 2) for t in qkv.split(C, dim=2))

    def forward():
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    ctx = sdpa_kernel(BACKENDS[name]) if name in BACKENDS else contextlib.nullcontext()
    with ctx:
        fwd = timed(forward, args.steps, args.warmup)
        out = forward()

        def backward():
            qkv.grad = None
            out.backward(dout, retain_graph=True)

        bwd = timed(backward, args.steps, args.warmup)
    return fwd, bwd


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--width", type=int, default=768)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--backends", default="default,flash,cudnn,efficient")
    args = p.parse_args()
    if min(args.batch, args.seq, args.heads, args.width, args.steps) <= 0 or args.warmup < 0:
        p.error("shape, steps: positive; warmup: not negative")
    if args.width % args.heads:
        p.error("--width must be a multiple of --heads")
    names = [n for n in args.backends.split(",") if n]
    for n in names:
        if n != "default" and n not in BACKENDS:
            p.error(f"unknown backend {n} (default, {', '.join(BACKENDS)})")
    if not torch.cuda.is_available():
        print("torch_attention_gpu: no GPU", file=sys.stderr)
        return 2
    B, T, NH, C = args.batch, args.seq, args.heads, args.width
    flop = 4.0 * B * NH * T * T * (C // NH) / 2
    print(f"PyTorch {torch.__version__} on {torch.cuda.get_device_name()}; SDPA B={B} T={T} "
          f"NH={NH} C={C} (head {C // NH}), bf16, causal; a call: the mean of {args.steps} "
          f"after {args.warmup} warm-up")
    print("| SDPA backend | forward ms | backward ms | forward TFLOP/s | backward TFLOP/s | "
          "both TFLOP/s |\n|---|---:|---:|---:|---:|---:|")
    status = 0
    for n in names:
        try:
            fwd, bwd = run(n, args)
        except RuntimeError as e:  # the backend refuses the shape or this GPU
            print(f"| {n} | refused: {str(e).splitlines()[0][:80]} | | | | |")
            status = status if n != "default" else 1
            continue
        print(f"| {n} | {1e3 * fwd:.3f} | {1e3 * bwd:.3f} | {flop / fwd / 1e12:.1f} | "
              f"{2.5 * flop / bwd / 1e12:.1f} | {3.5 * flop / (fwd + bwd) / 1e12:.1f} |",
              flush=True)
    return status


if __name__ == "__main__":
    sys.exit(main())
