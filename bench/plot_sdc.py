#!/usr/bin/env python3
"""Plots the detection rate of bit flips against the bit position as an SVG (no dependencies).

Usage: plot_sdc.py OUT.svg BITS.csv LABEL [BITS.csv LABEL ...]
Each CSV is an `atoll sdc-campaign` bits.csv (bit,n,any,guard,fingerprint,checksum,replay,harmful_misses);
each becomes one line of the "any detector" rate, and a cross marks a bit with a harmful miss."""
import csv
import sys

COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd"]
W, H, L, R, T, B = 820, 360, 60, 250, 30, 50


def main():
    if len(sys.argv) < 4 or len(sys.argv) % 2 != 0:
        print(__doc__, file=sys.stderr)
        return 2
    series = []
    for path, label in zip(sys.argv[2::2], sys.argv[3::2]):
        with open(path) as f:
            rows = [r for r in csv.DictReader(f) if int(r["n"]) > 0]
        series.append((label, rows))
    x = lambda b: L + (W - L - R) * b / 31.0
    y = lambda v: T + (H - T - B) * (1.0 - v)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" '
           'font-family="sans-serif" font-size="12">',
           f'<rect x="{x(23)}" y="{T}" width="{x(31) - x(23)}" height="{H - T - B}" '
           'fill="#f3f3f3"/>',
           f'<text x="{(x(23) + x(31)) / 2}" y="{T + 14}" text-anchor="middle" fill="#666">'
           'exponent + sign</text>']
    for v in (0, 0.25, 0.5, 0.75, 1.0):
        out.append(f'<line x1="{L}" x2="{W - R}" y1="{y(v)}" y2="{y(v)}" stroke="#ddd"/>')
        out.append(f'<text x="{L - 6}" y="{y(v) + 4}" text-anchor="end">{int(v * 100)}%</text>')
    for b in range(0, 32, 4):
        out.append(f'<text x="{x(b)}" y="{H - B + 16}" text-anchor="middle">{b}</text>')
    out.append(f'<text x="{(L + W - R) / 2}" y="{H - 12}" text-anchor="middle">'
               'bit flipped (0 = lowest mantissa bit, 31 = sign)</text>')
    out.append(f'<text x="14" y="{(T + H - B) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 14 {(T + H - B) / 2})">flips detected</text>')
    for i, (label, rows) in enumerate(series):
        c = COLORS[i % len(COLORS)]
        pts = " ".join(f"{x(int(r['bit'])):.1f},{y(float(r['any'])):.1f}" for r in rows)
        out.append(f'<polyline points="{pts}" fill="none" stroke="{c}" stroke-width="2"/>')
        for r in rows:
            if int(r["harmful_misses"]) > 0:
                cx, cy = x(int(r["bit"])), y(float(r["any"]))
                out.append(f'<path d="M{cx - 4},{cy - 4}L{cx + 4},{cy + 4}M{cx - 4},{cy + 4}'
                           f'L{cx + 4},{cy - 4}" stroke="#d00" stroke-width="2"/>')
        ly = T + 20 + 18 * i
        out.append(f'<line x1="{W - R + 10}" x2="{W - R + 30}" y1="{ly}" y2="{ly}" '
                   f'stroke="{c}" stroke-width="2"/>')
        out.append(f'<text x="{W - R + 36}" y="{ly + 4}">{label}</text>')
    ly = T + 20 + 18 * len(series)
    out.append(f'<text x="{W - R + 10}" y="{ly + 4}" fill="#d00">x harmful miss</text>')
    out.append("</svg>")
    with open(sys.argv[1], "w") as f:
        f.write("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
