#!/usr/bin/env python3
"""Plots validation loss against cumulative WAN bytes per strategy as an SVG (no dependencies).

Usage: plot_strategies.py STRATEGIES.csv OUT.svg [TITLE]
The CSV has the columns row,step,val_loss,wan_bytes_sent (bench/strategies_bench.sh writes it);
each row (strategy) becomes one line, x on a log scale (MB sent by site 0)."""
import csv
import math
import sys

COLORS = ["#222222", "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]


def main():
    if len(sys.argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    series = {}
    with open(sys.argv[1]) as f:
        for r in csv.DictReader(f):
            mb = float(r["wan_bytes_sent"]) / 1e6
            if mb > 0:
                series.setdefault(r["row"], []).append((mb, float(r["val_loss"]), int(r["step"])))
    if not series:
        print("plot_strategies: no points with WAN bytes > 0", file=sys.stderr)
        return 2
    title = sys.argv[3] if len(sys.argv) > 3 else "validation loss vs WAN bytes"
    xs = [p[0] for s in series.values() for p in s]
    ys = [p[1] for s in series.values() for p in s]
    x0, x1 = math.floor(math.log10(min(xs))), math.ceil(math.log10(max(xs)))
    if x1 == x0:
        x1 += 1
    pad = 0.05 * (max(ys) - min(ys) or 1.0)
    y0, y1 = min(ys) - pad, max(ys) + pad
    W, H, L, R, TOP, B = 720, 440, 70, 170, 40, 55
    pw, ph = W - L - R, H - TOP - B

    def px(mb):
        return L + pw * (math.log10(mb) - x0) / (x1 - x0)

    def py(v):
        return TOP + ph * (1 - (v - y0) / (y1 - y0))

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           f'font-family="sans-serif" font-size="12">',
           f'<rect width="{W}" height="{H}" fill="white"/>',
           f'<text x="{W / 2}" y="22" text-anchor="middle" font-size="14">{title}</text>',
           f'<rect x="{L}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>']
    for e in range(x0, x1 + 1):
        x = px(10.0 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + ph}" stroke="#ddd"/>')
        label = f"{10.0 ** e:g}"
        out.append(f'<text x="{x:.1f}" y="{TOP + ph + 18}" text-anchor="middle">{label}</text>')
    for i in range(6):
        v = y0 + (y1 - y0) * i / 5
        y = py(v)
        out.append(f'<line x1="{L}" y1="{y:.1f}" x2="{L + pw}" y2="{y:.1f}" stroke="#eee"/>')
        out.append(f'<text x="{L - 6}" y="{y + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    out.append(f'<text x="{L + pw / 2}" y="{H - 12}" text-anchor="middle">'
               f'MB sent over the WAN by site 0 (log scale)</text>')
    out.append(f'<text x="16" y="{TOP + ph / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {TOP + ph / 2})">validation loss</text>')
    for i, (name, pts) in enumerate(series.items()):
        c = COLORS[i % len(COLORS)]
        pts.sort()
        path = " ".join(f"{px(m):.1f},{py(v):.1f}" for m, v, _ in pts)
        out.append(f'<polyline points="{path}" fill="none" stroke="{c}" stroke-width="2"/>')
        for m, v, s in pts:
            out.append(f'<circle cx="{px(m):.1f}" cy="{py(v):.1f}" r="3.5" fill="{c}">'
                       f'<title>{name} step {s}: {v:.3f} at {m:.1f} MB</title></circle>')
        ly = TOP + 16 + 20 * i
        label = name.replace(":", " H=")
        out.append(f'<line x1="{L + pw + 14}" y1="{ly - 4}" x2="{L + pw + 34}" y2="{ly - 4}" '
                   f'stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{L + pw + 40}" y="{ly}">{label}</text>')
    out.append("</svg>")
    with open(sys.argv[2], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
