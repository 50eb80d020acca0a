#!/usr/bin/env python3
"""Collects the `BENCH {json}` lines of qemu guest console logs into one
results file: every record, plus per question the median and min-max spread
of zblk's figure, zram's figure and the zblk/zram ratio, where each ratio
pairs zblk with zram of the same boot, round and codec pair.

Python 3 standard library only.

  bench_collect.py --meta meta.txt --out results.json [--markdown tables.md] console-1.log [...]

With --markdown it also writes the tables BENCHMARKS.md quotes, one per
question, each cell "median (min-max)".
"""

import argparse
import json
import statistics
import sys

# (test, figure path inside the record, name in the summary, better)
FIGURES = [
    ("swap", ("wall_s",), "swap elapsed s", "lower"),
    ("swap", ("swapout_mb_s",), "swap-out MB/s", "higher"),
    ("swap", ("swapin_verify_mb_s",), "swap-in+verify MB/s", "higher"),
    ("swap", ("ratio_mem",), "usemem pattern orig/mem_used_total", "higher"),
    ("swap", ("ratio_data",), "usemem pattern orig/compr", "higher"),
    ("munmap", ("munmap_ms",), "munmap ms", "lower"),
    ("munmap", ("settle_s",), "stats back to baseline s", "lower"),
    ("corpus", ("ratio_mem",), "corpus orig/mem_used_total", "higher"),
    ("corpus", ("ratio_data",), "corpus orig/compr", "higher"),
    ("randio", ("randio", "iops"), "random 4 KB IOPS", "higher"),
    ("randio", ("randio", "all", "p50_us"), "random 4 KB p50 us", "lower"),
    ("randio", ("randio", "all", "p99_us"), "random 4 KB p99 us", "lower"),
]


def parse_logs(paths):
    """Every BENCH record of the logs, tagged with its boot (1-based)."""
    records = []
    for boot, path in enumerate(paths, 1):
        with open(path, encoding="utf-8", errors="replace") as f:
            for line in f:
                line = line.strip().replace("\r", "")
                if not line.startswith("BENCH {"):
                    continue
                try:
                    rec = json.loads(line[len("BENCH "):])
                except json.JSONDecodeError as e:
                    print(f"skipped a broken BENCH line of {path}: {e}", file=sys.stderr)
                    continue
                rec["boot"] = boot
                records.append(rec)
    return records


def corpus_written(records):
    """Recomputes the corpus ratios over the bytes written to the device.

    zram's orig_data_size counts same-filled pages; zblk's did not before
    commit 6d29a0e (it reported them only in same_pages), so orig/mem would
    understate an older zblk by the share of same-filled pages. The numerator that means the same on both is
    the corpus size written (`written`; in records without it, the largest
    orig of that boot's corpus records, which is zram's: every page)."""
    full = {}
    for r in records:
        if r["test"] == "corpus":
            full[r["boot"]] = max(full.get(r["boot"], 0), r.get("written", 0), r.get("orig", 0))
    for r in records:
        if r["test"] == "corpus" and full.get(r["boot"]):
            w = r.get("written", full[r["boot"]])
            if r.get("mem_used_total"):
                r["ratio_mem"] = round(w / r["mem_used_total"], 3)
            if r.get("compr"):
                r["ratio_data"] = round(w / r["compr"], 3)
            r["ratio_basis"] = "written"


def dig(rec, path):
    """The number at `path` in `rec`, or None."""
    v = rec
    for k in path:
        if not isinstance(v, dict) or k not in v:
            return None
        v = v[k]
    return v if isinstance(v, (int, float)) else None


def variant(rec):
    """What splits one test into several rows: munmap size and processes
    ("64 MB", "2x128 MB"), randio mode and queue depth ("read QD4"; records
    from before --jobs are queue depth 1)."""
    if rec["test"] == "munmap":
        procs = rec.get("procs", 1)
        return f"{procs}x{rec.get('mb')} MB" if procs > 1 else f"{rec.get('mb')} MB"
    if rec["test"] == "randio":
        qd = rec.get("jobs") or dig(rec, ("randio", "queue_depth")) or 1
        return f"{rec.get('mode', '')} QD{qd}"
    if rec["test"] == "zlat":
        return rec.get("phase", "")
    return ""


def spread(values):
    """Median, min, max and count of a list (None when empty)."""
    if not values:
        return None
    return {
        "median": round(statistics.median(values), 3),
        "min": round(min(values), 3),
        "max": round(max(values), 3),
        "n": len(values),
    }


def summarize(records):
    """One row per (test, pair, variant, figure): zblk, zram and ratio spreads."""
    rows = []
    keys = sorted({(r["test"], r["pair"], variant(r)) for r in records if r["test"] != "zlat"})
    for test, pair, var in keys:
        for ftest, path, name, better in FIGURES:
            if ftest != test:
                continue
            by_kind = {"zblk": {}, "zram": {}}
            for r in records:
                if (r["test"], r["pair"], variant(r)) != (test, pair, var):
                    continue
                v = dig(r, path)
                if v is not None:
                    by_kind[r["kind"]][(r["boot"], r["round"])] = (v, r["algo"])
            same = sorted(set(by_kind["zblk"]) & set(by_kind["zram"]))
            ratios = [by_kind["zblk"][k][0] / by_kind["zram"][k][0] for k in same if by_kind["zram"][k][0]]
            if not same:
                continue
            rows.append({
                "test": test,
                "pair": pair,
                "variant": var,
                "figure": name,
                "better": better,
                "zblk_algo": by_kind["zblk"][same[0]][1],
                "zram_algo": by_kind["zram"][same[0]][1],
                "zblk": spread([by_kind["zblk"][k][0] for k in same]),
                "zram": spread([by_kind["zram"][k][0] for k in same]),
                "ratio": spread(ratios),
            })
    return rows


def cross_codec(records):
    """Compression ratio of every zblk codec against every zram codec of the
    other pairs, matched by boot and round (e.g. zblk zstd against zram lz4):
    a ratio does not drift with the emulator's speed, but pairing by round
    keeps the same pages and the same boot."""
    rows = []
    for test, fig in (("corpus", "ratio_mem"), ("swap", "ratio_mem")):
        zb = {}
        zr = {}
        for r in records:
            if r["test"] != test or dig(r, (fig,)) is None:
                continue
            side = zb if r["kind"] == "zblk" else zr
            side.setdefault(r["algo"], {})[(r["boot"], r["round"])] = r[fig]
        for a, av in sorted(zb.items()):
            for b, bv in sorted(zr.items()):
                same = sorted(set(av) & set(bv))
                if not same:
                    continue
                rows.append({
                    "test": test, "figure": fig, "zblk_algo": a, "zram_algo": b,
                    "zblk": spread([av[k] for k in same]),
                    "zram": spread([bv[k] for k in same]),
                    "ratio": spread([av[k] / bv[k] for k in same if bv[k]]),
                })
    return rows


def qd_scaling(records):
    """Random 4 KB IOPS at each queue depth above 1 over queue depth 1, per
    device, codec and mode, pairing the runs of one boot and round: how far
    each device gains from requests in flight at once."""
    iops = {}
    for r in records:
        v = dig(r, ("randio", "iops"))
        if r["test"] == "randio" and v:
            qd = r.get("jobs") or dig(r, ("randio", "queue_depth")) or 1
            iops.setdefault((r["pair"], r["kind"], r["algo"], r.get("mode", "")), {})[(qd, r["boot"], r["round"])] = v
    rows = []
    for (pair, kind, algo, mode), by in sorted(iops.items()):
        for qd in sorted({k[0] for k in by if k[0] > 1}):
            same = [k[1:] for k in by if k[0] == qd and (1,) + k[1:] in by]
            if same:
                rows.append({"pair": pair, "kind": kind, "algo": algo, "mode": mode, "qd": qd,
                             "scaling": spread([by[(qd,) + k] / by[(1,) + k] for k in same])})
    return rows


def zlat_summary(records):
    """zblk's own per-page latency percentiles, median over rounds."""
    rows = []
    keys = sorted({(r["pair"], variant(r)) for r in records if r["test"] == "zlat"})
    for pair, phase in keys:
        recs = [r for r in records if r["test"] == "zlat" and (r["pair"], variant(r)) == (pair, phase)]
        for op in ("write", "read", "discard"):
            row = {"pair": pair, "algo": recs[0]["algo"], "phase": phase, "op": op}
            for k in ("count", "p50_us", "p95_us", "p99_us"):
                row[k] = spread([v for v in (dig(r, ("latency", op, k)) for r in recs) if v is not None])
            rows.append(row)
    return rows


def cell(sp, digits=2):
    """'median (min-max)' of a spread, '-' when missing."""
    if not sp:
        return "-"
    f = lambda v: f"{v:.{digits}f}"
    if sp["n"] == 1 or sp["min"] == sp["max"]:
        return f(sp["median"])
    return f"{f(sp['median'])} ({f(sp['min'])}-{f(sp['max'])})"


# Markdown tables: (title, tests, figures, which variants: a substring, "" for all).
RANDIO_FIGS = ("random 4 KB IOPS", "random 4 KB p50 us", "random 4 KB p99 us")
TABLES = [
    ("Swap under memory.high pressure (usemem)", ("swap",),
     ("swap elapsed s", "swap-out MB/s", "swap-in+verify MB/s"), ""),
    ("munmap of swapped-out memory", ("munmap",), ("munmap ms", "stats back to baseline s"), ""),
    ("Random 4 KB O_DIRECT, queue depth 1 (randio)", ("randio",), RANDIO_FIGS, "QD1"),
    ("Random 4 KB O_DIRECT, queue depth 4 (randio --jobs 4)", ("randio",), RANDIO_FIGS, "QD4"),
    ("Compression ratio per codec", ("corpus", "swap"),
     ("corpus orig/mem_used_total", "corpus orig/compr", "usemem pattern orig/mem_used_total"), ""),
]


def markdown(result):
    """The tables of BENCHMARKS.md's device section."""
    out = []
    for title, tests, figs, var in TABLES:
        out += [f"#### {title}", "",
                "| zblk algo | zram algo | test | figure | rounds | zblk | zram | zblk / zram |",
                "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for fig in figs:
            for r in result["summary"]:
                if r["test"] in tests and r["figure"] == fig and r["variant"].endswith(var):
                    d = 3 if "ratio" in fig or "orig" in fig else (0 if "IOPS" in fig or "us" in fig else 2)
                    out.append(f"| {r['zblk_algo']} | {r['zram_algo']} | {r['test']} {r['variant']}".rstrip()
                               + f" | {fig} | {r['zblk']['n']} | {cell(r['zblk'], d)} | {cell(r['zram'], d)} | {cell(r['ratio'])} |")
        out.append("")
    out += ["#### Compression ratio orig/mem_used_total, every zblk codec against every zram codec", "",
            "| data | zblk algo | zram algo | rounds | zblk | zram | zblk / zram |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for c in result["compression_cross"]:
        data = "real-memory corpus" if c["test"] == "corpus" else "usemem pattern"
        out.append(f"| {data} | {c['zblk_algo']} | {c['zram_algo']} | {c['zblk']['n']} | {cell(c['zblk'], 3)} | {cell(c['zram'], 3)} "
                   f"| {cell(c['ratio'])} |")
    out.append("")
    out += ["#### Random 4 KB IOPS at queue depth N over queue depth 1 (same round)", "",
            "| device | algo | mode | queue depth | rounds | IOPS QD N / QD 1 |",
            "| --- | --- | --- | --- | --- | --- |"]
    for q in result["randio_qd_scaling"]:
        out.append(f"| {q['kind']} | {q['algo']} | {q['mode']} | {q['qd']} | {q['scaling']['n']} | {cell(q['scaling'])} |")
    out.append("")
    out += ["#### zblk's own per-page latency (`zblk stat --json`, engine time inside the daemon)", "",
            "| zblk algo | workload | op | pages | p50 us | p95 us | p99 us |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for z in result["zblk_latency"]:
        if z["count"] and z["count"]["median"]:
            out.append(f"| {z['algo']} | {z['phase']} | {z['op']} | {cell(z['count'], 0)} | {cell(z['p50_us'], 1)} "
                       f"| {cell(z['p95_us'], 1)} | {cell(z['p99_us'], 1)} |")
    return "\n".join(out) + "\n"


def read_meta(path):
    """key=value lines of bench-device.sh's meta.txt."""
    meta = {}
    if path:
        with open(path, encoding="utf-8") as f:
            for line in f:
                k, _, v = line.rstrip("\n").partition("=")
                if k:
                    meta[k] = v
    return meta


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--meta")
    ap.add_argument("--out", required=True)
    ap.add_argument("--markdown")
    ap.add_argument("logs", nargs="+")
    a = ap.parse_args()
    records = parse_logs(a.logs)
    if not records:
        sys.exit("no BENCH lines in " + " ".join(a.logs))
    corpus_written(records)
    result = {
        "meta": read_meta(a.meta),
        "summary": summarize(records),
        "zblk_latency": zlat_summary(records),
        "compression_cross": cross_codec(records),
        "randio_qd_scaling": qd_scaling(records),
        "records": records,
    }
    with open(a.out, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1)
        f.write("\n")
    if a.markdown:
        with open(a.markdown, "w", encoding="utf-8") as f:
            f.write(markdown(result))
    for row in result["summary"]:
        r = row["ratio"]
        print(f"{row['test']:7} {row['pair']:13} {row['variant']:12} {row['figure']:36} "
              f"zblk {row['zblk']['median']:>10} zram {row['zram']['median']:>10} "
              f"zblk/zram {r['median'] if r else '-'} [{r['min'] if r else '-'}-{r['max'] if r else '-'}] n={row['zblk']['n']}")


if __name__ == "__main__":
    main()
