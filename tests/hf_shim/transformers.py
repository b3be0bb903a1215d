"""A stand-in for Hugging Face transformers where it is not installed (the CPU machines): just
GPT2LMHeadModel.from_pretrained(dir) -> .double() -> .eval() -> model(idx).logits, computed by
scripts/torch_reference.py's float64 GPT-2 from the same files, and .float().save_pretrained(out)
as older transformers wrote GPT-2 (GPT2Model's names without "transformer.", the attention's mask
buffers beside them, the tied head stored again as lm_head.weight; float32). It lets tests/eval_sample.sh run
scripts/hf_check.py (its windows, its logits comparison) everywhere; the GPU machines run that
script with the real transformers (scripts/gpu_check.sh)."""
import os
import sys
import types

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "scripts"))
import torch_reference as R  # noqa: E402


class GPT2LMHeadModel:
    @staticmethod
    def from_pretrained(path):
        m = GPT2LMHeadModel()
        m.cfg, m.p, _ = R.load_checkpoint(path)
        m.config = types.SimpleNamespace(n_positions=m.cfg.n_positions)
        with open(os.path.join(path, "config.json")) as f:
            m.config_json = f.read()
        return m

    def double(self):
        return self

    def float(self):
        return self

    def save_pretrained(self, out, safe_serialization=True):
        import collections
        import torch
        os.makedirs(out, exist_ok=True)
        with open(os.path.join(out, "config.json"), "w") as f:
            f.write(self.config_json)
        T = self.cfg.n_positions
        tensors = collections.OrderedDict()
        for name, t in self.p.items():
            bare = name[len("transformer."):]
            tensors[bare] = t
            if bare.endswith(".ln_1.weight"):  # each block's mask buffer, as GPT2Attention had
                tensors[bare.replace(".ln_1.weight", ".attn.bias")] = torch.tril(
                    torch.ones(T, T)).view(1, 1, T, T)
        tensors["lm_head.weight"] = self.p["transformer.wte.weight"]
        R.save_safetensors(os.path.join(out, "model.safetensors"), tensors, {"format": "pt"},
                           dtype="F32")

    def eval(self):
        return self

    def __call__(self, idx):
        return types.SimpleNamespace(logits=R.gpt2_logits(self.p, self.cfg, idx))
