#!/usr/bin/python3
"""GPT-2 in PyTorch (float64, CPU): the reference that `atoll eval` is checked against.

    /usr/bin/python3 scripts/torch_reference.py --checkpoint DIR --tokens FILE \
        [--grads-out FILE] [--seq-len T] [--max-windows N]
    /usr/bin/python3 scripts/torch_reference.py --self-test

Reads DIR/model.safetensors (Hugging Face GPT2LMHeadModel names, LM head tied to
transformer.wte.weight) and DIR/config.json (HF GPT-2 config), and a token file
("ATOLTOK1" | uint64 n | uint64 xxh3 | n x uint16, all little-endian).

Loss, as `atoll eval` defines it: window i is tokens[i*(T+1) : (i+1)*(T+1)] (consecutive,
non-overlapping; the incomplete tail is ignored), inputs are its first T tokens, targets its
last T; the loss is the mean next-token cross-entropy over all windows x positions.
T = --seq-len, else config.json's n_positions.

--grads-out writes d(loss)/d(param) for every parameter of the checkpoint as safetensors with
the checkpoint's tensor names (float64 by default: the comparison should not be limited by
the reference's own rounding; --grads-dtype F32 for float32). Prints {"loss": ...} on stdout.

Needs only python3-torch and python3-numpy (Debian); safetensors is parsed here by hand.
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np
import torch
import torch.nn.functional as F

# ----------------------------------------------------------------------------------------------
# safetensors (https://github.com/huggingface/safetensors#format), written by hand.

_DTYPES = {
    "F64": (np.float64, torch.float64), "F32": (np.float32, torch.float32),
    "F16": (np.float16, torch.float16), "BF16": (None, torch.bfloat16),
    "I64": (np.int64, torch.int64), "I32": (np.int32, torch.int32),
    "I16": (np.int16, torch.int16), "I8": (np.int8, torch.int8), "U8": (np.uint8, torch.uint8),
}


def load_safetensors(path):
    """Returns (ordered dict name -> torch tensor (copy), metadata dict)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if 8 + hlen > len(blob):
        raise ValueError(f"{path}: header length {hlen} exceeds file size {len(blob)}")
    header = json.loads(blob[8:8 + hlen].decode("utf-8"))
    data = memoryview(blob)[8 + hlen:]
    meta = header.pop("__metadata__", {}) or {}
    out = {}
    # Keep file order (by data offset): it is the order parameters sit in the flat buffer.
    for name, info in sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0]):
        dtype, shape, (b, e) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in _DTYPES:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {dtype}")
        if e > len(data) or b > e:
            raise ValueError(f"{path}: tensor {name}: data_offsets [{b},{e}) outside data ({len(data)} bytes)")
        npdt, tdt = _DTYPES[dtype]
        count = int(np.prod(shape)) if shape else 1
        if npdt is None:  # bf16: widen via int16 bits
            raw = np.frombuffer(data[b:e], dtype="<u2").astype(np.uint32) << 16
            t = torch.from_numpy(raw.view(np.float32).copy()).reshape(shape)
        else:
            itemsize = np.dtype(npdt).itemsize
            if (e - b) != count * itemsize:
                raise ValueError(f"{path}: tensor {name}: {e - b} bytes for shape {shape} {dtype}")
            arr = np.frombuffer(data[b:e], dtype=np.dtype(npdt).newbyteorder("<"))
            t = torch.from_numpy(arr.astype(npdt, copy=True)).reshape(shape)
        out[name] = t
    return out, meta


def save_safetensors(path, tensors, metadata=None, dtype="F64"):
    """tensors: ordered dict name -> torch tensor. Written as `dtype` (F64 or F32)."""
    npdt = {"F64": "<f8", "F32": "<f4"}[dtype]
    header, chunks, off = {}, [], 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, t in tensors.items():
        buf = t.detach().cpu().double().numpy().astype(npdt).tobytes()
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [off, off + len(buf)]}
        chunks.append(buf)
        off += len(buf)
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((8 - len(hjson) % 8) % 8)  # align the data to 8 bytes
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for c in chunks:
            f.write(c)
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------
# token files

TOKEN_MAGIC = b"ATOLTOK1"


def load_tokens(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 24 or blob[:8] != TOKEN_MAGIC:
        raise ValueError(f"{path}: not a token file (magic {blob[:8]!r})")
    n, _checksum = struct.unpack("<QQ", blob[8:24])
    if len(blob) != 24 + 2 * n:
        raise ValueError(f"{path}: header says {n} tokens but the file holds {(len(blob) - 24) / 2}")
    return np.frombuffer(blob, dtype="<u2", count=n, offset=24).astype(np.int64)


# ----------------------------------------------------------------------------------------------
# the model

class GPT2Config:
    def __init__(self, n_layer, n_head, n_embd, n_positions, vocab_size, eps=1e-5):
        self.n_layer, self.n_head, self.n_embd = n_layer, n_head, n_embd
        self.n_positions, self.vocab_size, self.eps = n_positions, vocab_size, eps

    @staticmethod
    def from_json(path):
        with open(path) as f:
            c = json.load(f)
        act = c.get("activation_function", "gelu_new")
        if act not in ("gelu_new", "gelu_pytorch_tanh"):
            raise ValueError(f"{path}: activation_function {act!r}: only tanh GELU (gelu_new) is supported")
        return GPT2Config(int(c["n_layer"]), int(c["n_head"]), int(c["n_embd"]),
                          int(c.get("n_positions", c.get("n_ctx"))), int(c["vocab_size"]),
                          float(c.get("layer_norm_epsilon", 1e-5)))


def param_shapes(cfg):
    """HF GPT2LMHeadModel names and shapes (Conv1D layout: y = x @ W + b), in llm.c order."""
    C, V, P = cfg.n_embd, cfg.vocab_size, cfg.n_positions
    shapes = {"transformer.wte.weight": [V, C], "transformer.wpe.weight": [P, C]}
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        shapes.update({
            h + "ln_1.weight": [C], h + "ln_1.bias": [C],
            h + "attn.c_attn.weight": [C, 3 * C], h + "attn.c_attn.bias": [3 * C],
            h + "attn.c_proj.weight": [C, C], h + "attn.c_proj.bias": [C],
            h + "ln_2.weight": [C], h + "ln_2.bias": [C],
            h + "mlp.c_fc.weight": [C, 4 * C], h + "mlp.c_fc.bias": [4 * C],
            h + "mlp.c_proj.weight": [4 * C, C], h + "mlp.c_proj.bias": [C],
        })
    shapes.update({"transformer.ln_f.weight": [C], "transformer.ln_f.bias": [C]})
    return shapes


def canonical(name):
    """Accepts GPT2Model names (no 'transformer.' prefix) as well."""
    return name if name.startswith("transformer.") or name.startswith("lm_head.") else "transformer." + name


def gpt2_logits(p, cfg, idx):
    """p: dict canonical name -> tensor; idx: [B, T] int64. Returns logits [B, T, V]."""
    B, T = idx.shape
    C, H = cfg.n_embd, cfg.n_head
    hd = C // H
    x = p["transformer.wte.weight"][idx] + p["transformer.wpe.weight"][:T].unsqueeze(0)
    causal = torch.ones(T, T, dtype=torch.bool).tril()
    for i in range(cfg.n_layer):
        h = f"transformer.h.{i}."
        a = F.layer_norm(x, (C,), p[h + "ln_1.weight"], p[h + "ln_1.bias"], cfg.eps)
        qkv = a @ p[h + "attn.c_attn.weight"] + p[h + "attn.c_attn.bias"]
        q, k, v = qkv.split(C, dim=-1)
        q = q.view(B, T, H, hd).transpose(1, 2)
        k = k.view(B, T, H, hd).transpose(1, 2)
        v = v.view(B, T, H, hd).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(hd))
        att = att.masked_fill(~causal, float("-inf")).softmax(dim=-1)
        y = (att @ v).transpose(1, 2).reshape(B, T, C)
        x = x + (y @ p[h + "attn.c_proj.weight"] + p[h + "attn.c_proj.bias"])
        m = F.layer_norm(x, (C,), p[h + "ln_2.weight"], p[h + "ln_2.bias"], cfg.eps)
        m = F.gelu(m @ p[h + "mlp.c_fc.weight"] + p[h + "mlp.c_fc.bias"], approximate="tanh")
        x = x + (m @ p[h + "mlp.c_proj.weight"] + p[h + "mlp.c_proj.bias"])
    x = F.layer_norm(x, (C,), p["transformer.ln_f.weight"], p["transformer.ln_f.bias"], cfg.eps)
    head = p.get("lm_head.weight", p["transformer.wte.weight"])  # tied unless given
    return x @ head.t()


def windows(tokens, T):
    n = len(tokens) // (T + 1)
    if n == 0:
        raise ValueError(f"token file holds {len(tokens)} tokens: fewer than one window of {T + 1}")
    w = torch.from_numpy(tokens[: n * (T + 1)].reshape(n, T + 1).copy())
    return w[:, :T], w[:, 1:]


def loss_and_grads(params, cfg, inputs, targets, want_grads, chunk=None):
    """Mean cross-entropy over all windows x positions, and its gradient (float64).

    Windows are processed in chunks (sum of per-chunk summed losses / total count), so memory
    stays bounded; chunking does not change the mathematical result."""
    N, T = inputs.shape
    V = cfg.vocab_size
    if chunk is None:  # keep logits + softmax grad around ~256 MB of float64
        chunk = max(1, int(256e6 // (T * V * 8 * 3)))
    total = N * T
    p = {k: v.detach().clone().requires_grad_(want_grads) for k, v in params.items()}
    loss_sum = 0.0
    for s in range(0, N, chunk):
        logits = gpt2_logits(p, cfg, inputs[s:s + chunk])
        l = F.cross_entropy(logits.reshape(-1, V), targets[s:s + chunk].reshape(-1), reduction="sum")
        if want_grads:
            (l / total).backward()
        loss_sum += l.item()
    grads = {k: (v.grad if v.grad is not None else torch.zeros_like(v)) for k, v in p.items()} if want_grads else None
    return loss_sum / total, grads


def load_checkpoint(ckpt_dir):
    cfg = GPT2Config.from_json(os.path.join(ckpt_dir, "config.json"))
    raw, _ = load_safetensors(os.path.join(ckpt_dir, "model.safetensors"))
    shapes = param_shapes(cfg)
    params, names = {}, {}  # canonical -> tensor, canonical -> name as in the file
    for name, t in raw.items():
        c = canonical(name)
        if c in shapes or c == "lm_head.weight":
            params[c] = t.double()
            names[c] = name
        elif name.endswith(".attn.bias") or name.endswith(".attn.masked_bias"):
            continue  # HF's causal-mask buffers, not parameters
        else:
            raise ValueError(f"model.safetensors: unexpected tensor {name}")
    for c, shp in shapes.items():
        if c not in params:
            raise ValueError(f"model.safetensors: missing tensor {c}")
        if list(params[c].shape) != shp:
            raise ValueError(f"model.safetensors: tensor {names[c]} has shape {list(params[c].shape)}, config says {shp}")
    if "lm_head.weight" in params and torch.equal(params["lm_head.weight"], params["transformer.wte.weight"]):
        # A stored copy of the tied head: the gradient of the tied weight is what atoll reports.
        del params["lm_head.weight"]
        del names["lm_head.weight"]
    order = sorted(params, key=lambda c: list(raw).index(names[c]))
    return cfg, {c: params[c] for c in order}, names


# ----------------------------------------------------------------------------------------------
# self-test: finite differences, an independent numpy forward, causality, file round trips

def _random_model(cfg, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = {}
    for name, shp in param_shapes(cfg).items():
        if name.endswith("ln_1.weight") or name.endswith("ln_2.weight") or name.endswith("ln_f.weight"):
            p[name] = 1.0 + 0.1 * torch.randn(shp, generator=g, dtype=torch.float64)
        else:
            p[name] = 0.3 * torch.randn(shp, generator=g, dtype=torch.float64)
    return p


def _numpy_logits(p, cfg, idx):
    """Independent forward: per-head loops, explicit softmax and tanh-GELU formulas."""
    P = {k: v.detach().numpy() for k, v in p.items()}
    C, H = cfg.n_embd, cfg.n_head
    hd = C // H
    out = []
    for seq in idx.numpy():
        T = len(seq)
        x = P["transformer.wte.weight"][seq] + P["transformer.wpe.weight"][:T]

        def ln(z, w, b):
            mu = z.mean(-1, keepdims=True)
            var = ((z - mu) ** 2).mean(-1, keepdims=True)
            return (z - mu) / np.sqrt(var + cfg.eps) * w + b

        for i in range(cfg.n_layer):
            h = f"transformer.h.{i}."
            a = ln(x, P[h + "ln_1.weight"], P[h + "ln_1.bias"])
            qkv = a @ P[h + "attn.c_attn.weight"] + P[h + "attn.c_attn.bias"]
            y = np.zeros((T, C))
            for head in range(H):
                q = qkv[:, head * hd:(head + 1) * hd]
                k = qkv[:, C + head * hd:C + (head + 1) * hd]
                v = qkv[:, 2 * C + head * hd:2 * C + (head + 1) * hd]
                for t in range(T):
                    s = np.array([q[t] @ k[u] for u in range(t + 1)]) / math.sqrt(hd)
                    e = np.exp(s - s.max())
                    w = e / e.sum()
                    y[t, head * hd:(head + 1) * hd] = w @ v[: t + 1]
            x = x + y @ P[h + "attn.c_proj.weight"] + P[h + "attn.c_proj.bias"]
            m = ln(x, P[h + "ln_2.weight"], P[h + "ln_2.bias"])
            u = m @ P[h + "mlp.c_fc.weight"] + P[h + "mlp.c_fc.bias"]
            u = 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u ** 3)))
            x = x + u @ P[h + "mlp.c_proj.weight"] + P[h + "mlp.c_proj.bias"]
        x = ln(x, P["transformer.ln_f.weight"], P["transformer.ln_f.bias"])
        out.append(x @ P["transformer.wte.weight"].T)
    return np.stack(out)


def self_test():
    import tempfile
    torch.manual_seed(0)
    ok = True

    def check(what, cond, detail=""):
        nonlocal ok
        ok &= bool(cond)
        print(f"  {'ok  ' if cond else 'FAIL'} {what} {detail}")

    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=8, n_positions=6, vocab_size=11)
    p = _random_model(cfg, seed=1)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, cfg.vocab_size, size=3 * (cfg.n_positions + 1) + 4)  # 3 windows + tail
    inputs, targets = windows(tokens, cfg.n_positions)
    check("windows", inputs.shape == (3, 6) and torch.equal(inputs[1, 1:], targets[1, :-1])
          and int(inputs[1, 0]) == int(tokens[7]))

    # 1. forward against an independent numpy implementation
    ref = _numpy_logits(p, cfg, inputs)
    got = gpt2_logits(p, cfg, inputs).detach().numpy()
    err = np.abs(ref - got).max()
    check("forward == independent numpy forward", err < 1e-12, f"(max abs diff {err:.2e})")
    lref = np.mean([-(ref[b, t, targets[b, t]] - np.log(np.exp(ref[b, t]).sum()))
                    for b in range(3) for t in range(6)])
    loss, grads = loss_and_grads(p, cfg, inputs, targets, want_grads=True, chunk=2)
    check("loss == numpy cross-entropy (chunked)", abs(loss - lref) < 1e-12, f"({loss:.12f} vs {lref:.12f})")
    loss1, grads1 = loss_and_grads(p, cfg, inputs, targets, want_grads=True, chunk=100)
    gd = max((grads[k] - grads1[k]).abs().max().item() for k in grads)
    check("chunking does not change loss or grads", abs(loss - loss1) < 1e-13 and gd < 1e-14, f"(grad diff {gd:.1e})")

    # 2. causality: changing a later token changes no earlier logit
    alt = inputs.clone()
    alt[0, 4] = (alt[0, 4] + 1) % cfg.vocab_size
    d = (gpt2_logits(p, cfg, alt) - gpt2_logits(p, cfg, inputs)).detach().abs()
    check("causal", d[0, :4].max() == 0 and d[0, 4:].max() > 0)

    # 3. central finite differences (float64) on a sample of entries of every tensor.
    # Accept |fd - grad| <= 1e-9 + 1e-6 |grad| (the truncation + rounding error of fd at this eps
    # is ~1e-11; the key bias's gradient is exactly 0: softmax ignores a per-row shift).
    eps, worst = 1e-5, 0.0
    g = torch.Generator().manual_seed(3)
    for name, t in p.items():
        flat = t.view(-1)
        for j in torch.randint(0, flat.numel(), (4,), generator=g).tolist():
            orig = flat[j].item()
            flat[j] = orig + eps
            lp, _ = loss_and_grads(p, cfg, inputs, targets, want_grads=False)
            flat[j] = orig - eps
            lm, _ = loss_and_grads(p, cfg, inputs, targets, want_grads=False)
            flat[j] = orig
            fd = (lp - lm) / (2 * eps)
            an = grads[name].view(-1)[j].item()
            worst = max(worst, abs(fd - an) / (1e-9 + 1e-6 * abs(an)))
    check("gradients == central finite differences", worst <= 1.0,
          f"(worst |fd-grad| / (1e-9 + 1e-6|grad|) = {worst:.2f}; 4 entries per tensor)")

    # 4. file round trips (checkpoint dir, token file, grads file)
    with tempfile.TemporaryDirectory() as d:
        save_safetensors(os.path.join(d, "model.safetensors"), p, dtype="F32",
                         metadata={"format": "pt"})
        with open(os.path.join(d, "config.json"), "w") as f:
            json.dump({"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 8, "n_positions": 6,
                       "n_ctx": 6, "vocab_size": 11, "layer_norm_epsilon": 1e-5,
                       "activation_function": "gelu_new", "tie_word_embeddings": True}, f)
        tf = os.path.join(d, "t.bin")
        with open(tf, "wb") as f:
            f.write(TOKEN_MAGIC + struct.pack("<QQ", len(tokens), 0) + tokens.astype("<u2").tobytes())
        check("token file round trip", np.array_equal(load_tokens(tf), tokens))
        cfg2, p2, names = load_checkpoint(d)
        check("checkpoint round trip (F32)", all(torch.equal(p2[k], p[k].float().double()) for k in p)
              and list(p2) == list(p))
        gf = os.path.join(d, "g.safetensors")
        save_safetensors(gf, grads)
        g2, _ = load_safetensors(gf)
        check("grads file round trip (F64, exact)", all(torch.equal(g2[k], grads[k]) for k in grads))
        # And through the command line.
        import subprocess
        r = subprocess.run([sys.executable, os.path.abspath(__file__), "--checkpoint", d, "--tokens", tf,
                            "--grads-out", gf], capture_output=True, text=True)
        cl = json.loads(r.stdout)["loss"] if r.returncode == 0 else float("nan")
        l2, g2r = loss_and_grads(p2, cfg2, inputs, targets, want_grads=True)
        g3, _ = load_safetensors(gf)
        check("command line (loss, grads file)", r.returncode == 0 and abs(cl - l2) < 1e-12
              and all(torch.equal(g3[k], g2r[k]) for k in g2r), r.stderr.strip()[-300:])

    # 5. transformers, if it happens to be importable (it is not a dependency)
    try:
        import transformers  # noqa: F401
        from transformers import GPT2Config as HFConfig, GPT2LMHeadModel
        hf = GPT2LMHeadModel(HFConfig(n_layer=2, n_head=2, n_embd=8, n_positions=6, vocab_size=11,
                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)).double().eval()
        sd = hf.state_dict()
        with torch.no_grad():
            for k in p:
                sd[k].copy_(p[k])
        hl = hf(inputs).logits.detach().numpy()
        check("forward == transformers GPT2LMHeadModel", np.abs(hl - got).max() < 1e-10)
    except ImportError:
        print("  skip transformers not importable: compared with the numpy forward instead")

    print("self-test:", "PASS" if ok else "FAIL")
    return 0 if ok else 1


# ----------------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--checkpoint", help="checkpoint directory (model.safetensors + config.json)")
    ap.add_argument("--tokens", help="token file (ATOLTOK1)")
    ap.add_argument("--grads-out", help="write d(loss)/d(param) here (safetensors)")
    ap.add_argument("--grads-dtype", default="F64", choices=["F64", "F32"])
    ap.add_argument("--seq-len", type=int, help="window length T (default: config.json n_positions)")
    ap.add_argument("--max-windows", type=int, help="use only the first N windows")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    ap.add_argument("--self-test", action="store_true", help="check this implementation and exit")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    if a.self_test:
        return self_test()
    if not a.checkpoint or not a.tokens:
        ap.error("--checkpoint and --tokens are required (or --self-test)")
    cfg, params, names = load_checkpoint(a.checkpoint)
    T = a.seq_len or cfg.n_positions
    if T > cfg.n_positions:
        ap.error(f"--seq-len {T} exceeds n_positions {cfg.n_positions}")
    inputs, targets = windows(load_tokens(a.tokens), T)
    if a.max_windows:
        inputs, targets = inputs[:a.max_windows], targets[:a.max_windows]
    if int(max(inputs.max(), targets.max())) >= cfg.vocab_size:
        raise ValueError(f"{a.tokens}: token id >= vocab_size {cfg.vocab_size}")
    loss, grads = loss_and_grads(params, cfg, inputs, targets, want_grads=bool(a.grads_out))
    if a.grads_out:
        save_safetensors(a.grads_out, {names[c]: g for c, g in grads.items()}, dtype=a.grads_dtype,
                         metadata={"producer": "scripts/torch_reference.py", "loss": repr(loss),
                                   "windows": str(len(inputs)), "seq_len": str(T)})
    print(json.dumps({"loss": loss, "windows": len(inputs), "seq_len": T}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
