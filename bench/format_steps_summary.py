#!/usr/bin/env python3
"""Tables from bench/format_steps.sh's JSON lines (DIR/plain.jsonl, DIR/transforms.jsonl).

plain: microseconds per call of each tree at each cell, every repetition, and each other
tree's fastest against this tree's fastest. transforms: this tree's fastest per transform
against plain NVFP4's in the same process, at each cell.
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
        key = cell(r)
        t = r.get("transform", "plain")
        if t not in transforms:
            transforms.append(t)
        if key not in cells:
            cells.append(key)
        times[key + (t,)].append(r["ms"] * 1e3)
        if t == "plain" and "of_ceiling" in r:
            ceiling[key] = max(ceiling.get(key, 0), r["of_ceiling"])
    others = [t for t in transforms if t != "plain"]
    lines = ["| kernel | cell | plain (us) | of read ceiling | " + " | ".join(others) + " |",
             "|" + "---|" * (4 + len(others))]
    for key in cells:
        base = min(times.get(key + ("plain",), [float("nan")]))
        cols = []
        for t in others:
            got = times.get(key + (t,))
            cols.append(f"{fmt(min(got))} ({100 * (min(got) / base - 1):+.1f} %)" if got else "-")
        ceil = f"{100 * ceiling[key]:.0f} %" if key in ceiling else "-"
        lines.append(f"| {key[0]} | {key[1]} | {fmt(base)} | {ceil} | " + " | ".join(cols) + " |")
    return "\n".join(lines)


def main():
    d = sys.argv[1]
    plain = rows(os.path.join(d, "plain.jsonl"))
    if plain:
        print("## Plain caches: each tree, every repetition (us per call), the fastest against this tree's\n")
        print(plain_table(plain))
    transforms = rows(os.path.join(d, "transforms.jsonl"))
    if transforms:
        print("\n## This tree: each transform's fastest against plain NVFP4's, same process\n")
        print(transform_table(transforms))


if __name__ == "__main__":
    main()
