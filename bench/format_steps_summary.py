#!/usr/bin/env python3
"""Tables from bench/format_steps.sh's JSON lines (DIR/plain.jsonl, DIR/transforms.jsonl) and
its clock samples (DIR/logs/clocks.csv, DIR/logs/phases.txt).

plain: microseconds per call of each tree at each cell, every repetition, and each other
tree's fastest against this tree's fastest. transforms: each tree's fastest per transform
against its plain NVFP4's, at each cell.
Usage: bench/format_steps_summary.py DIR
"""
import json
import os
import sys
from collections import defaultdict


def rows(path):
    if not os.path.exists(path):
        return []
    out = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{") and '"ms"' in line:
                out.append(json.loads(line))
    return out


def cell(r):
    if r["kernel"] == "decode":
        return ("decode", f'{r["batch"]} x {r["context"] // 1024}K, D {r["head_dim"]}')
    return ("prefill", f'{r["batch"]} x {r["prompt"] // 1024}K, D {r["head_dim"]}')


def fmt(us):
    return f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def plain_table(data):
    times = defaultdict(list)  # (kernel, cell, tree) -> us
    trees, cells = [], []
    for r in data:
        key = cell(r)
        if r["tree"] not in trees:
            trees.append(r["tree"])
        if key not in cells:
            cells.append(key)
        times[key + (r["tree"],)].append(r["ms"] * 1e3)
    others = [t for t in trees if t != "this"]
    head = "| kernel | cell | " + " | ".join(f"{t} (us)" for t in trees) + " | " + " | ".join(
        f"{t} vs this" for t in others) + " |"
    lines = [head, "|" + "---|" * (2 + len(trees) + len(others))]
    for key in cells:
        runs = [times.get(key + (t,), []) for t in trees]
        base = min(times[key + ("this",)]) if times.get(key + ("this",)) else None
        ratios = []
        for t in others:
            got = times.get(key + (t,))
            ratios.append(f"{100 * (min(got) / base - 1):+.1f} %" if got and base else "-")
        lines.append(f"| {key[0]} | {key[1]} | " + " | ".join(" / ".join(fmt(x) for x in r) or "-" for r in runs) +
                     " | " + " | ".join(ratios) + " |")
    return "\n".join(lines)


def transform_table(data):
    times = defaultdict(list)
    ceiling = {}
    transforms, cells = [], []
    for r in data:
        key = (r["tree"],) + cell(r)
        t = r.get("transform", "plain")
        if t not in transforms:
            transforms.append(t)
        if key not in cells:
            cells.append(key)
        times[key + (t,)].append(r["ms"] * 1e3)
        if "of_ceiling" in r:
            ceiling[key + (t,)] = max(ceiling.get(key + (t,), 0), r["of_ceiling"])
    others = [t for t in transforms if t != "plain"]
    lines = ["| tree | kernel | cell | plain (us) | of read ceiling | " + " | ".join(others) + " |",
             "|" + "---|" * (5 + len(others))]
    for key in cells:
        base = min(times.get(key + ("plain",), [float("nan")]))
        cols = []
        for t in others:
            got = times.get(key + (t,))
            # A transform that changes the bytes (FP8 sides) says its own share of the ceiling.
            share = ceiling.get(key + (t,))
            own = f", {100 * share:.0f} % of ceiling" if share and "fp8" in t else ""
            cols.append(f"{fmt(min(got))} ({100 * (min(got) / base - 1):+.1f} %{own})" if got else "-")
        ceil = f"{100 * ceiling[key + ('plain',)]:.0f} %" if key + ("plain",) in ceiling else "-"
        lines.append(f"| {key[0]} | {key[1]} | {key[2]} | {fmt(base)} | {ceil} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def clock_table(d):
    """Mean SM clock, power and the samples' count per phase of the script (logs/phases.txt,
    logs/clocks.csv from nvidia-smi every 100 ms)."""
    import datetime
    phases_path, clocks_path = os.path.join(d, "logs", "phases.txt"), os.path.join(d, "logs", "clocks.csv")
    if not (os.path.exists(phases_path) and os.path.exists(clocks_path)):
        return ""
    phases = []
    for line in open(phases_path):
        t, _, name = line.strip().partition(" ")
        phases.append((float(t), name))
    samples = []
    for line in open(clocks_path):
        parts = [x.strip() for x in line.split(",")]
        try:
            t = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").replace(
                tzinfo=datetime.timezone.utc).timestamp()
            samples.append((t, float(parts[1].split()[0]), float(parts[2].split()[0])))
        except (ValueError, IndexError):
            continue
    lines = ["| phase | samples | SM clock (MHz) | power (W) |", "|---|---:|---:|---:|"]
    for i, (t0, name) in enumerate(phases):
        t1 = phases[i + 1][0] if i + 1 < len(phases) else float("inf")
        got = [s for s in samples if t0 <= s[0] < t1]
        if got:
            lines.append(f"| {name} | {len(got)} | {sum(s[1] for s in got) / len(got):.0f} | "
                         f"{sum(s[2] for s in got) / len(got):.0f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def main():
    d = sys.argv[1]
    plain = rows(os.path.join(d, "plain.jsonl"))
    if plain:
        print("## Plain caches: each tree, every repetition (us per call), the fastest against this tree's\n")
        print(plain_table(plain))
    transforms = rows(os.path.join(d, "transforms.jsonl"))
    if transforms:
        print("\n## Each tree: each transform's fastest against its plain NVFP4's (a process each, alternating)\n")
        print(transform_table(transforms))
    clocks = clock_table(d)
    if clocks:
        print("\n## SM clock and power per phase (nvidia-smi every 100 ms)\n")
        print(clocks)


if __name__ == "__main__":
    main()
