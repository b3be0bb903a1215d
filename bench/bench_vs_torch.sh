#!/usr/bin/env bash
# Peer benchmark (issue 2, item 9): trains the same GPT in atoll and in PyTorch (Debian's
# python3-torch, CPU) with the same config, shape, batch, sequence length, fp32, AdamW, clipping
# and thread count, and prints tokens/s for both, their ratio, and MFU against the SGEMM rate
# measured on this machine with the same thread count.
#
#   bench/bench_vs_torch.sh [CONFIG] [THREADS]        (defaults: configs/small.toml, 2)
#
# Environment:
#   STEPS=12 WARMUP=2   steps per run; the first WARMUP steps of each run are not timed
#   REPEAT=1            run atoll and torch alternately REPEAT times; report each one's best run
#                       (on a shared machine the best run is the least disturbed one)
#   TORCH_MODE=best     eager | script | script-fuse | best (times each briefly, keeps the fastest)
#   CORETYPE=SkylakeX   OPENBLAS_CORETYPE for atoll AND torch (both use OpenBLAS for fp32 GEMM;
#                       SkylakeX is also torch's faster choice here: 1,101 vs 759 tokens/s, 1 thread)
#   TORCH_OMP_WAIT_POLICY=PASSIVE   for torch only (empty: libgomp's default). Debian's torch 1.13
#                       runs GEMMs on OpenBLAS's own pthreads, which then compete with torch's
#                       spinning OpenMP workers: PASSIVE made torch ~1.5x faster at 2 threads
#                       (1,631-1,795 vs 1,125-1,143 tokens/s on small), so the peer gets it.
#   ATOLL=build/release/atoll   SGEMM_RATE=<binary>   (default: bench/sgemm_rate of $ATOLL's build)
#   MD=FILE             also append the result table, in markdown, to FILE
#
# Definitions (the same for both programs):
#   tokens/s  = batch_size * seq_len * timed steps / their wall time
#               atoll: from DIR/metrics.jsonl step_ms; torch: bench/torch_gpt.py's own timer
#   FLOPs per token (fwd + bwd; bwd = 2 x fwd), with N = matmul weights incl. the tied LM head:
#       N     = L * 12 * C^2  +  V * C        (qkv 3C^2, attn proj C^2, fc 4C^2, mlp proj 4C^2; head VC)
#       F_tok = 6 * N  +  12 * L * T * C      (attention: QK^T and AV are 2*T*C FLOPs each per token
#                                              per layer forward = 4LTC, x3 for fwd+bwd = 12LTC;
#                                              counted over all T keys as in PaLM/nanoGPT MFU,
#                                              although causal masking could skip half)
#       (embedding lookups, LayerNorm, GELU, softmax, AdamW: not counted)
#   MFU = F_tok * tokens/s / SGEMM rate (FLOP/s of OpenBLAS sgemm at the same thread count)
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:-configs/small.toml}
THREADS=${2:-2}
STEPS=${STEPS:-12}
WARMUP=${WARMUP:-2}
REPEAT=${REPEAT:-1}
TORCH_MODE=${TORCH_MODE:-best}
CORETYPE=${CORETYPE:-SkylakeX}
TORCH_OMP_WAIT_POLICY=${TORCH_OMP_WAIT_POLICY-PASSIVE}
ATOLL=${ATOLL:-build/release/atoll}
PY=/usr/bin/python3   # Debian's python3 with python3-torch; the pyenv python3 on PATH lacks torch
[[ -f "$CONFIG" ]] || { echo "bench_vs_torch: no config $CONFIG" >&2; exit 2; }
[[ -x "$ATOLL" ]] || { echo "bench_vs_torch: no atoll binary at $ATOLL (build it or set ATOLL=)" >&2; exit 2; }
((STEPS > WARMUP)) || { echo "bench_vs_torch: STEPS must exceed WARMUP" >&2; exit 2; }
WORK=$(mktemp -d "${TMPDIR:-/tmp}/bench_vs_torch.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
export OPENBLAS_CORETYPE=$CORETYPE OMP_NUM_THREADS=$THREADS OPENBLAS_NUM_THREADS=$THREADS

# --- SGEMM rate -------------------------------------------------------------------------------
# bench/sgemm_rate from the same build as $ATOLL, else from any build under build/.
if [[ -z "${SGEMM_RATE:-}" ]]; then
  SGEMM_RATE=$(dirname "$ATOLL")/bench/sgemm_rate
  [[ -x "$SGEMM_RATE" ]] || SGEMM_RATE=$(find build -type f -name sgemm_rate -perm -u+x 2>/dev/null | sort | head -1 || true)
fi
SGEMM_SRC="bench/sgemm_rate ($SGEMM_RATE)"
if [[ -z "$SGEMM_RATE" ]]; then
  # Fallback (no numpy, no torch): OpenBLAS cblas_sgemm timed in C, best of 5 over square shapes.
  SGEMM_SRC="fallback: cblas_sgemm in C (bench/bench_vs_torch.sh), best of 512..2048 square"
  cat >"$WORK/sgemm.c" <<'EOF'
#include <cblas.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(void) {
  double best = 0;
  for (int n = 512; n <= 2048; n *= 2) {
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) { a[i] = (float)(i % 7) * 0.1f; b[i] = (float)(i % 5) * 0.1f; c[i] = 0; }
    int reps = n == 512 ? 40 : n == 1024 ? 8 : 2;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
    for (int r = 0; r < 5; r++) {
      double t0 = now();
      for (int k = 0; k < reps; k++) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1, a, n, b, n, 0, c, n);
      double g = 2.0 * n * n * n * reps / (now() - t0);
      if (g > best) best = g;
    }
    free(a); free(b); free(c);
  }
  printf("{\"gflops\": %.3f}\n", best / 1e9);
  return 0;
}
EOF
  cc -O2 -o "$WORK/sgemm" "$WORK/sgemm.c" -I/usr/include/x86_64-linux-gnu/openblas-pthread -lopenblas ||
    { echo "bench_vs_torch: cannot build the fallback SGEMM timer (libopenblas-dev?)" >&2; exit 2; }
  SGEMM_RATE=$WORK/sgemm
fi

# --- runs -------------------------------------------------------------------------------------
echo "bench_vs_torch: $CONFIG, $THREADS threads, $STEPS steps ($WARMUP warm-up), REPEAT=$REPEAT, OPENBLAS_CORETYPE=$CORETYPE; load average: $(cut -d' ' -f1-3 /proc/loadavg)"
for ((r = 0; r < REPEAT; r++)); do
  echo "  run $((r + 1))/$REPEAT: $ATOLL train --config $CONFIG --set train.threads=$THREADS --set train.steps=$STEPS --out <tmp>"
  "$ATOLL" train --config "$CONFIG" --set "train.threads=$THREADS" --set "train.steps=$STEPS" \
    --out "$WORK/atoll$r" </dev/null >"$WORK/atoll$r.log" 2>&1 ||
    { tail -20 "$WORK/atoll$r.log" >&2; echo "bench_vs_torch: atoll train failed" >&2; exit 1; }
  echo "  run $((r + 1))/$REPEAT: ${TORCH_OMP_WAIT_POLICY:+OMP_WAIT_POLICY=$TORCH_OMP_WAIT_POLICY }$PY bench/torch_gpt.py --config $CONFIG --threads $THREADS --steps $STEPS --warmup $WARMUP --mode $TORCH_MODE"
  env ${TORCH_OMP_WAIT_POLICY:+OMP_WAIT_POLICY=$TORCH_OMP_WAIT_POLICY} \
    "$PY" bench/torch_gpt.py --config "$CONFIG" --threads "$THREADS" --steps "$STEPS" --warmup "$WARMUP" \
    --mode "$TORCH_MODE" --json >"$WORK/torch$r.json" 2>"$WORK/torch$r.log" ||
    { tail -20 "$WORK/torch$r.log" >&2; echo "bench_vs_torch: torch_gpt.py failed" >&2; exit 1; }
done
echo "  $SGEMM_RATE --threads $THREADS"
SGEMM_ARGS=()
[[ "$SGEMM_RATE" == "$WORK/sgemm" ]] || SGEMM_ARGS=(--threads "$THREADS")
"$SGEMM_RATE" "${SGEMM_ARGS[@]}" >"$WORK/sgemm.out" 2>&1 || { cat "$WORK/sgemm.out" >&2; echo "bench_vs_torch: SGEMM timer failed" >&2; exit 1; }

TORCH_OMP_WAIT_POLICY=$TORCH_OMP_WAIT_POLICY "$PY" - "$WORK" "$CONFIG" "$THREADS" "$STEPS" "$WARMUP" "$REPEAT" "$SGEMM_SRC" "${MD:-}" <<'EOF'
import json, os, re, sys, tomllib
work, config, threads, steps, warmup, repeat, sgemm_src, md = sys.argv[1:9]
threads, steps, warmup, repeat = int(threads), int(steps), int(warmup), int(repeat)
cfg = tomllib.load(open(config, "rb"))
m, t = cfg["model"], cfg["train"]
L, C, T, V, B = m["n_layer"], m["n_embd"], m["seq_len"], m["vocab_size"], t["batch_size"]
tok_step = B * T

def atoll_tps(run):
    rows = [json.loads(l) for l in open(f"{work}/atoll{run}/metrics.jsonl") if l.strip().startswith("{")]
    rows = [r for r in rows if "step_ms" in r]
    timed = rows[warmup:]
    if not timed:
        raise SystemExit(f"bench_vs_torch: atoll wrote {len(rows)} steps, all inside the warm-up")
    return tok_step * len(timed) / (sum(r["step_ms"] for r in timed) / 1e3), rows[-1].get("loss")

atoll = [atoll_tps(r) for r in range(repeat)]
torch_runs = [json.loads(open(f"{work}/torch{r}.json").read().strip().splitlines()[-1]) for r in range(repeat)]
a_tps, a_loss = max(atoll)
tr = max(torch_runs, key=lambda j: j["tokens_per_s"])
t_tps = tr["tokens_per_s"]

# SGEMM rate: bench/sgemm_rate's last line is JSON {"gflops": R, ...} (R: its best square rate at
# OMP_NUM_THREADS threads); the fallback timer prints the same.
out = open(f"{work}/sgemm.out").read()
last = [l for l in out.splitlines() if l.strip().startswith("{")]
try:
    sgemm = float(json.loads(last[-1])["gflops"]) * 1e9
except (IndexError, KeyError, ValueError):
    raise SystemExit(f"bench_vs_torch: no {{\"gflops\": ...}} line in the SGEMM timer's output:\n{out}")

N = L * 12 * C * C + V * C
f_tok = 6 * N + 12 * L * T * C
a_runs = ", ".join(f"{x:,.0f}" for x, _ in atoll)
t_runs = ", ".join(f"{j['tokens_per_s']:,.0f}" for j in torch_runs)
probe = ", ".join(f"{k} {v:,.0f}" for k, v in (tr.get("probe_tokens_per_s") or {}).items())
rows = [
    ("config", f"{config}: L={L} H={m['n_head']} C={C} T={T} V={V}, batch {B} (micro {t['micro_batch_size']})"),
    ("threads", f"{threads} (OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE')}; torch: "
                f"OMP_WAIT_POLICY={os.environ.get('TORCH_OMP_WAIT_POLICY') or 'default'})"),
    ("steps", f"{steps}, first {warmup} untimed, best of {repeat} run(s)"),
    ("atoll tokens/s", f"{a_tps:,.0f}" + (f"   (runs: {a_runs})" if repeat > 1 else "")),
    (f"torch {tr['torch']} tokens/s", f"{t_tps:,.0f}  [{tr['mode']}]" + (f"   (runs: {t_runs})" if repeat > 1 else "") +
        (f"   (mode probe: {probe})" if probe else "")),
    ("atoll / torch", f"{a_tps / t_tps:.2f}x"),
    ("FLOPs per token", f"{f_tok / 1e6:.2f} M  (6N + 12LTC, N = {N / 1e6:.2f} M matmul weights incl. tied head)"),
    ("SGEMM rate", f"{sgemm / 1e9:.1f} GFLOP/s  ({sgemm_src})"),
    ("atoll MFU", f"{100 * f_tok * a_tps / sgemm:.1f} % of SGEMM  ({f_tok * a_tps / 1e9:.1f} GFLOP/s)"),
    ("torch MFU", f"{100 * f_tok * t_tps / sgemm:.1f} % of SGEMM  ({f_tok * t_tps / 1e9:.1f} GFLOP/s)"),
]
w = max(len(k) for k, _ in rows)
print()
for k, v in rows:
    print(f"{k:<{w}}  {v}")
if md:
    with open(md, "a") as f:
        f.write("| | |\n|---|---|\n")
        for k, v in rows:
            f.write(f"| {k} | {v} |\n")
EOF
