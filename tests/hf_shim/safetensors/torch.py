"""safetensors.torch.load_file for tests/hf_shim (scripts/torch_reference.py's reader)."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "scripts"))
import torch_reference as R  # noqa: E402


def load_file(path):
    return dict(R.load_safetensors(path)[0])
