#!/usr/bin/python3
"""Runs one setting of the Epoch reference notebook (ege-erdil/limits_to_distributed_training,
optimal_parallelism.ipynb, a checkout of which you give) and prints where its linear scaling
ends and its largest run, as JSON. For bench/plan/reference_agreement.sh.

    /usr/bin/python3 bench/plan/reference_run.py REF_CHECKOUT SETTING [--overlap-dp 0|1]

SETTING is an identifier of the notebook's settings ("H100 SXM", "A100 SXM", "V100 SXM",
"H100 SXM sparse", "No scaling", "DeepSeek scaling", "H100 SXM Low Latency", "H100 SXM Global
NVLink", ...; and "H100 SXM Zero Latency", the paper's, added here). The notebook's own code does
the work: its first four code cells (definitions and settings) and its simulate_training_runs,
with matplotlib stubbed out (nothing is drawn); the crossover is its own rule (the first run
whose utilization is at most 0.8 x clock / max clock).
Needs numpy and sympy (Debian: python3-numpy, python3-sympy).
"""
import argparse
import contextlib
import copy
import io
import json
import os
import sys
import time
import types


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ref")
    ap.add_argument("setting")
    ap.add_argument("--overlap-dp", type=int, default=0, help="the notebook as committed: 0")
    a = ap.parse_args()
    mpl, plt = types.ModuleType("matplotlib"), types.ModuleType("matplotlib.pyplot")
    plt.__getattr__ = lambda name: (lambda *x, **k: None)
    mpl.pyplot = plt
    sys.modules["matplotlib"], sys.modules["matplotlib.pyplot"] = mpl, plt
    sys.path.insert(0, a.ref)
    cells = ["".join(c["source"]) for c in json.load(open(os.path.join(a.ref, "optimal_parallelism.ipynb")))["cells"]
             if c["cell_type"] == "code"]
    run = cells[4]
    g = {}
    exec("\n\n".join(cells[:4]), g)
    exec(run[run.index("import warnings"):run.index("info_dict = {}")], g)
    settings = {s.identifier: s for s in g["base_comparison_settings"] + g["grand_comparison_settings_dense"]
                + g["batch_size_comparison_settings"]}
    settings.update({s.identifier + " sparse": s for s in g["base_comparison_sparse_settings"]})
    # The paper's "zero latency" network, which the code at b1f771c no longer defines (it became
    # "Low Latency", a tenth of each latency): the H100 with every latency zero, as it was.
    zl = copy.deepcopy(g["H100_SXM5"])
    zl.name = "H100 SXM Zero Latency"
    zl.latency_per_matmul_seconds = 0
    zl.network_latency_per_level_seconds = [0] * len(zl.network_latency_per_level_seconds)
    settings[zl.name] = g["SimulationSetting"](zl, g["number_of_layers"], lambda d_model, d_ff: 1,
                                               g["critical_batch_size"], zl.name)
    if a.setting not in settings:
        sys.exit(f"reference_run: unknown setting {a.setting!r}; known: {sorted(settings)}")
    s = settings[a.setting]
    t0 = time.time()
    with contextlib.redirect_stdout(io.StringIO()):
        info = g["simulate_training_runs"](
            s.gpu, g["d_model_list"], [4 * d for d in g["d_model_list"]], layer_fun=s.layer_fun,
            sparsity_fun=s.sparsity_fun, batch_size_fun=s.batch_size_fun, seq_len=g["seq_len"],
            years=g["run_duration_years"], stopping_utilization_value=0.001, overlap_TP=1,
            overlap_DP=a.overlap_dp, overlap_PP=1)
    cap = s.gpu.clock_Hz / s.gpu.max_clock_Hz
    cross = next((i[6] for i in info if i[8] <= 0.8 * cap), None)
    print(json.dumps({"setting": a.setting, "overlap_dp": a.overlap_dp, "crossover_flop": cross,
                      "largest_feasible_flop": info[-1][6] if info else None, "runs": len(info),
                      "seconds": round(time.time() - t0, 1)}))


if __name__ == "__main__":
    main()
