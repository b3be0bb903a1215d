#!/usr/bin/env bash
# python3 for scripts/gpu_session.sh --rehearse, where there is no GPU: PyTorch's GPU peers
# (bench/torch_gpt_gpu.py, bench/torch_attention_gpu.py) are answered by a stand-in that says
# what it is, so that the session's parsing and tables run; everything else (the inline Python of
# the bench scripts, scripts/hf_check.py with tests/hf_shim's transformers) runs in Debian's
# python3 (/usr/bin/python3: python3-torch, numpy), or python3 where that is missing. Nothing here
# is a measurement.
here=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
  bench/torch_gpt_gpu.py)
    echo "torch_gpt_gpu: rehearsal stand-in, not PyTorch" >&2
    echo '{"peer": "rehearsal stand-in", "tokens_per_s": 1000.0, "mfu": 0.0}'
    exit 0 ;;
  bench/torch_attention_gpu.py)
    echo "PyTorch's scaled_dot_product_attention: rehearsal stand-in (no GPU here), not timed"
    exit 0 ;;
esac
py=/usr/bin/python3
[[ -x $py ]] || py=python3
PYTHONPATH="$here/hf_shim${PYTHONPATH:+:$PYTHONPATH}" exec "$py" "$@"
