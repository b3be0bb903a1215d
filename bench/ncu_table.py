#!/usr/bin/env python3
"""Per-kernel GPU time from Nsight Compute's CSV, as a markdown table (bench/gpu_bench.sh, part
kernels).

  ncu --csv --print-units base --metrics gpu__time_duration.sum --log-file run.csv PROGRAM ...
  bench/ncu_table.py run.csv [--title T] [--per N]

For each kernel (its name without namespaces and parameters; template arguments kept): calls,
total and mean microseconds, and its share of the total, largest total first. --per N divides
the totals by N (e.g. the steps profiled), so that they read as per step. Lines before the CSV's
header (ncu's ==PROF== lines) are skipped. Exit 2 for an unreadable file or one without the
gpu__time_duration.sum metric.
"""
import argparse
import csv
import sys

UNITS = {"nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3, "second": 1e6}


def short_name(name):
    """'void ns::(anonymous namespace)::K<64, 1>(float *, int)' -> 'K<64, 1>'."""
    name = name.replace("(anonymous namespace)", "anon").strip()
    depth, end = 0, len(name)
    for i, c in enumerate(name):
        if c == "<":
            depth += 1
        elif c == ">":
            depth -= 1
        elif c == "(" and depth == 0:
            end = i
            break
    name = name[:end]
    if name.startswith("void "):
        name = name[5:]
    depth, start = 0, 0
    for i in range(len(name) - 1):
        if name[i] == "<":
            depth += 1
        elif name[i] == ">":
            depth -= 1
        elif depth == 0 and name[i : i + 2] == "::":
            start = i + 2
    name = name[start:]
    return name if len(name) <= 72 else name[:69] + "..."


def read(path):
    """{kernel: [calls, total microseconds]} from an ncu CSV log."""
    with open(path, newline="") as f:
        lines = f.read().splitlines()
    at = next((i for i, l in enumerate(lines) if l.startswith('"ID"')), None)
    if at is None:
        raise ValueError(f"{path}: no ncu CSV header (\"ID\",...)")
    kernels = {}
    for row in csv.DictReader(lines[at:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = row.get("Metric Unit", "nsecond")
        if unit not in UNITS:
            raise ValueError(f"{path}: unknown unit {unit!r}")
        us = float(row["Metric Value"].replace(",", "")) * UNITS[unit]
        entry = kernels.setdefault(short_name(row["Kernel Name"]), [0, 0.0])
        entry[0] += 1
        entry[1] += us
    if not kernels:
        raise ValueError(f"{path}: no gpu__time_duration.sum values")
    return kernels


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--title", default="")
    ap.add_argument("--per", type=float, default=1.0, help="divide totals by this (e.g. steps)")
    a = ap.parse_args()
    if a.per <= 0:
        ap.error("--per must be positive")
    try:
        kernels = read(a.csv)
    except (OSError, ValueError, KeyError) as e:
        print(f"ncu_table: {e}", file=sys.stderr)
        return 2
    total = sum(us for _, us in kernels.values())
    if a.title:
        print(a.title)
    print("| kernel | calls | total µs | mean µs | share |")
    print("|---|---:|---:|---:|---:|")
    for name, (calls, us) in sorted(kernels.items(), key=lambda kv: -kv[1][1]):
        print(f"| `{name}` | {calls / a.per:g} | {us / a.per:.1f} | {us / calls:.1f} | "
              f"{100 * us / total:.1f}% |")
    print(f"| all | {sum(c for c, _ in kernels.values()) / a.per:g} | {total / a.per:.1f} | | |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
