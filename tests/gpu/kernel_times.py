#!/usr/bin/env python3
"""Per-kernel GPU times from an ncu CSV log (`ncu --metrics gpu__time_duration.sum --csv --log-file F ...`):
launches, total and mean time per kernel name, largest first, with each kernel's share of the GPU time.

Usage: kernel_times.py NCU.csv [--steps S] [--top K]
  --steps   training steps the profiled run made (all of them: zaya bench train's `steps run` line, warm-up and the
            phase breakdown's drained steps included): totals are shown per step
Used by tests/gpu/device-session.sh's `profile` part; its input there is bench-gpu's shapes cut to 2 layers, run with
bench train --no-gemm-probe (the cuBLASLt peak probe's GEMMs would share names with the step's own products)."""
import argparse
import csv
import re
import sys

UNITS = {"nsecond": 1e-9, "ns": 1e-9, "usecond": 1e-6, "us": 1e-6, "msecond": 1e-3, "ms": 1e-3, "second": 1.0,
         "s": 1.0}


def short(name):
    """A kernel's name without its template arguments and parameter list."""
    name = re.sub(r"\(.*\)$", "", re.sub(r"^void ", "", name))
    depth, out = 0, []
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out).strip() or name


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--top", type=int, default=40)
    a = ap.parse_args()
    lines = open(a.csv, errors="replace").read().splitlines()
    start = next((i for i, ln in enumerate(lines) if ln.startswith('"ID"')), None)
    if start is None:
        sys.exit(f"{a.csv}: no ncu CSV header (\"ID\",...) found")
    total, count = {}, {}
    for row in csv.DictReader(lines[start:]):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        unit = UNITS.get(row.get("Metric Unit", "").strip())
        try:
            v = float(row["Metric Value"].replace(",", ""))
        except (KeyError, ValueError):
            continue
        if unit is None:
            sys.exit(f"{a.csv}: unknown time unit {row.get('Metric Unit')!r}")
        k = short(row.get("Kernel Name", "?"))
        total[k] = total.get(k, 0.0) + v * unit
        count[k] = count.get(k, 0) + 1
    if not total:
        sys.exit(f"{a.csv}: no gpu__time_duration.sum rows")
    all_s = sum(total.values())
    print(f"{sum(count.values())} launches, {1e3 * all_s / a.steps:.2f} ms of GPU time per step over {a.steps} step(s)")
    print(f"{'ms/step':>9} {'share':>6} {'launches':>8} {'mean us':>8}  kernel")
    for k in sorted(total, key=total.get, reverse=True)[:a.top]:
        print(f"{1e3 * total[k] / a.steps:9.3f} {100 * total[k] / all_s:5.1f}% {count[k]:8d} {1e6 * total[k] / count[k]:8.1f}"
              f"  {k}")


if __name__ == "__main__":
    main()
