#!/usr/bin/env python3
"""Draws the device benchmark results (bench_collect.py's JSON) as one SVG:
top, each zblk figure as a ratio to zram of the same boot (median, whisker
from min to max over rounds); bottom, random 4 KB latency p50/p99 of zram,
zblk end to end and zblk's engine alone (`zblk stat`), log scale.

Python 3 standard library only: the SVG is written by hand.

  plot.py results.json device.svg
"""

import json
import math
import sys
from xml.sax.saxutils import escape

W = 980
FONT = "font-family='DejaVu Sans, Arial, sans-serif'"
COLORS = {"zram": "#7f7f7f", "zblk": "#1f77b4", "engine": "#9ecae1"}

# Rows of the ratio panel: (test, variant, figure) in this order, per pair.
RATIO_ROWS = [
    ("swap", "", "swap-out MB/s"),
    ("swap", "", "swap-in+verify MB/s"),
    ("swap", "", "swap elapsed s"),
    ("munmap", "64 MB", "munmap ms"),
    ("munmap", "256 MB", "munmap ms"),
    ("munmap", "2x128 MB", "munmap ms"),
    ("randio", "read QD1", "random 4 KB IOPS"),
    ("randio", "write QD1", "random 4 KB IOPS"),
    ("randio", "read QD4", "random 4 KB IOPS"),
    ("randio", "write QD4", "random 4 KB IOPS"),
    ("corpus", "", "corpus orig/mem_used_total"),
]


def text(x, y, s, size=12, anchor="start", weight="normal", fill="#000"):
    """An SVG text element."""
    return (f"<text x='{x:.1f}' y='{y:.1f}' {FONT} font-size='{size}' text-anchor='{anchor}' "
            f"font-weight='{weight}' fill='{fill}'>{escape(s)}</text>")


def rect(x, y, w, h, fill, extra=""):
    """An SVG rectangle."""
    return f"<rect x='{x:.1f}' y='{y:.1f}' width='{max(w, 0):.1f}' height='{max(h, 0):.1f}' fill='{fill}' {extra}/>"


def line(x1, y1, x2, y2, stroke="#000", width=1, dash=""):
    """An SVG line."""
    d = f" stroke-dasharray='{dash}'" if dash else ""
    return f"<line x1='{x1:.1f}' y1='{y1:.1f}' x2='{x2:.1f}' y2='{y2:.1f}' stroke='{stroke}' stroke-width='{width}'{d}/>"


def ratio_panel(summary, top):
    """Horizontal bars of zblk/zram per figure; returns (elements, height)."""
    rows = []
    pairs = sorted({r["pair"] for r in summary}, key=lambda p: (p != "lz4:lz4", p))
    for pair in pairs:
        for test, var, fig in RATIO_ROWS:
            for r in summary:
                if (r["pair"], r["test"], r["variant"], r["figure"]) == (pair, test, var, fig) and r["ratio"]:
                    label = f"zblk {r['zblk_algo']} / zram {r['zram_algo']}: {fig}{' ' + var if var else ''}"
                    if r["better"] == "lower":
                        label += " (lower is better)"
                    rows.append((label, r["ratio"]))
    out = [text(20, top + 18, "zblk / zram in the same boot (median of rounds, whisker min-max; 1 = parity)",
                14, weight="bold")]
    x0, x1 = 430, W - 40
    hi = max([2.0] + [r["max"] for _, r in rows])
    hi = math.ceil(hi * 2) / 2
    sx = lambda v: x0 + (x1 - x0) * v / hi
    y = top + 36
    rh = 20
    for t in range(0, int(hi * 2) + 1):
        v = t / 2
        out.append(line(sx(v), y - 4, sx(v), y + rh * len(rows), "#ddd"))
        out.append(text(sx(v), y + rh * len(rows) + 14, f"{v:g}", 10, "middle"))
    out.append(line(sx(1), y - 4, sx(1), y + rh * len(rows), "#d62728", 1.5, "4,3"))
    for i, (label, r) in enumerate(rows):
        yy = y + i * rh
        out.append(text(x0 - 8, yy + 14, label, 11, "end"))
        out.append(rect(x0, yy + 3, sx(r["median"]) - x0, rh - 6, COLORS["zblk"]))
        out.append(line(sx(r["min"]), yy + rh / 2, sx(r["max"]), yy + rh / 2, "#000", 1.2))
        out.append(line(sx(r["min"]), yy + 5, sx(r["min"]), yy + rh - 5))
        out.append(line(sx(r["max"]), yy + 5, sx(r["max"]), yy + rh - 5))
        out.append(text(sx(r["max"]) + 6, yy + 14, f"{r['median']:.2f}", 10))
    return out, 36 + rh * len(rows) + 30


def latency_groups(res):
    """(label, [(series, value)]) groups of the latency panel."""
    groups = []
    summ = res["summary"]
    zlat = res.get("zblk_latency", [])
    pairs = sorted({r["pair"] for r in summ if r["test"] == "randio"}, key=lambda p: (p != "lz4:lz4", p))
    for pair in pairs:
        for mode, qd, pct in ((m, q, p) for m in ("read", "write") for q in ("QD1", "QD4") for p in ("p50", "p99")):
            fig = f"random 4 KB {pct} us"
            r = next((r for r in summ if (r["pair"], r["test"], r["variant"], r["figure"]) == (pair, "randio", f"{mode} {qd}", fig)), None)
            if r:
                bars = [(f"zram {r['zram_algo']}", "zram", r["zram"]["median"]),
                        (f"zblk {r['zblk_algo']}", "zblk", r["zblk"]["median"])]
                # The engine's own times pool every randio run of the device.
                e = next((z for z in zlat if (z["pair"], z["phase"], z["op"]) == (pair, "randio", mode)), None)
                if e and e.get(f"{pct}_us"):
                    bars.append(("zblk engine only", "engine", e[f"{pct}_us"]["median"]))
                za, ra = pair.split(":")
                groups.append((f"{za if za == ra else za + '/' + ra} {mode}", f"{qd} {pct}", bars))
    return groups


def latency_panel(res, top):
    """Grouped bars of random 4 KB latency, log scale; returns (elements, height)."""
    groups = latency_groups(res)
    out = [text(20, top + 18, "random 4 KB O_DIRECT latency, queue depth 1 and 4 (median of rounds, microseconds, log scale)",
                14, weight="bold")]
    if not groups:
        return out + [text(40, top + 50, "no randio results", 12)], 70
    h = 240
    y0, y1 = top + 40, top + 40 + h
    x0, x1 = 70, W - 20
    vals = [v for _, _, bars in groups for _, _, v in bars if v and v > 0]
    lo = 10 ** math.floor(math.log10(min(vals)))
    hi = 10 ** math.ceil(math.log10(max(vals)))
    sy = lambda v: y1 - (y1 - y0) * (math.log10(max(v, lo)) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
    d = lo
    while d <= hi * 1.001:
        out.append(line(x0, sy(d), x1, sy(d), "#ddd"))
        out.append(text(x0 - 6, sy(d) + 4, f"{d:g}", 10, "end"))
        d *= 10
    gw = (x1 - x0) / len(groups)
    for i, (label, label2, bars) in enumerate(groups):
        bw = (gw - 16) / 3
        for j, (_, series, v) in enumerate(bars):
            bx = x0 + i * gw + 8 + j * bw
            out.append(rect(bx, sy(v), bw - 2, y1 - sy(v), COLORS[series]))
            out.append(text(bx + bw / 2 - 1, sy(v) - 3, f"{v:.0f}", 8, "middle"))
        out.append(text(x0 + i * gw + gw / 2, y1 + 13, label, 9, "middle"))
        out.append(text(x0 + i * gw + gw / 2, y1 + 24, label2, 9, "middle"))
    out.append(line(x0, y1, x1, y1))
    lx = x0
    for name, series in (("zram (kernel)", "zram"), ("zblk end to end (randio)", "zblk"),
                         ("zblk engine only (zblk stat)", "engine")):
        out.append(rect(lx, y1 + 32, 12, 12, COLORS[series]))
        out.append(text(lx + 16, y1 + 43, name, 11))
        lx += 230
    return out, 40 + h + 56


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot.py results.json out.svg")
    with open(sys.argv[1], encoding="utf-8") as f:
        res = json.load(f)
    m = res.get("meta", {})
    els = [text(20, 24, "zblk vs kernel zram, qemu guest (TCG emulation: absolute figures are distorted, ratios are same-boot)",
                15, weight="bold"),
           text(20, 42, f"{m.get('date', '')}  guest {m.get('guest_kernel', '')}, {m.get('guest_mem', '')}, "
                        f"{m.get('guest_cpus', '')} vCPU; host {m.get('host_cpu', '')} x{m.get('host_cpus', '')}; "
                        f"{m.get('boots', '')} boot(s) x {m.get('rounds_per_boot', '')} rounds; commit {m.get('commit', '')}", 11, fill="#444")]
    p1, h1 = ratio_panel(res["summary"], 52)
    p2, h2 = latency_panel(res, 52 + h1)
    height = 52 + h1 + h2 + 10
    svg = [f"<svg xmlns='http://www.w3.org/2000/svg' width='{W}' height='{height:.0f}' viewBox='0 0 {W} {height:.0f}'>",
           rect(0, 0, W, height, "#fff")] + els + p1 + p2 + ["</svg>"]
    with open(sys.argv[2], "w", encoding="utf-8") as f:
        f.write("\n".join(svg) + "\n")


if __name__ == "__main__":
    main()
