"""A stand-in for Hugging Face transformers where it is not installed (the CPU machines): just
GPT2LMHeadModel.from_pretrained(dir) -> .double() -> .eval() -> model(idx).logits, computed by
scripts/torch_reference.py's float64 GPT-2 from the same files. It lets tests/eval_sample.sh run
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
        return m

    def double(self):
        return self

    def eval(self):
        return self

    def __call__(self, idx):
        return types.SimpleNamespace(logits=R.gpt2_logits(self.p, self.cfg, idx))
