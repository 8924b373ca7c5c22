#!/usr/bin/env python3
"""The short-query cells of bench/gpu_session.sh (NVFP4KV_SHORT=1: `nvfp4kv bench prefill
[--mixed] --json` lines) as a markdown table and a PNG: each cell's time against one-token
decode at the same batch, heads and context (the issue's bound: 1.3x).

usage: short_query_plot.py SHORT.jsonl OUT.md OUT.png
"""
import json
import sys


def main(argv):
    if len(argv) != 4:
        raise SystemExit(__doc__)
    rows = [json.loads(line) for line in open(argv[1]) if line.startswith("{")]

    def key(r):
        return (r["batch"], r["q_heads"], r["kv_heads"], r["head_dim"], r["cached"] + r["prompt"])

    decode = {key(r): r["ms"] for r in rows if r["prompt"] == 1 and r["route"] == "mixed"}
    lines = ["| batch | heads | context | q length | call | route taken | us | vs one-token decode |",
             "|---:|---|---:|---:|---|---|---:|---:|"]
    bars = []
    for r in rows:
        k = key(r)
        group = r["q_heads"] // r["kv_heads"]
        if r["route"] != "mixed":
            taken = "prefill"
        elif r["prompt"] == 1:
            taken = "decode"
        elif r["prompt"] * group <= 16:
            taken = "short-query"
        else:
            taken = "prefill"
        ratio = r["ms"] / decode[k] if k in decode else float("nan")
        call = "mixed_attention" if r["route"] == "mixed" else "prefill_attention"
        lines.append("| %d | %d/%d | %d | %d | %s | %s | %.1f | %.2fx |" % (
            r["batch"], r["q_heads"], r["kv_heads"], k[4], r["prompt"], call, taken, r["ms"] * 1e3, ratio))
        bars.append(("B%d %d/%d %dK\nq%d %s" % (r["batch"], r["q_heads"], r["kv_heads"], k[4] // 1024, r["prompt"], taken),
                     ratio, taken))
    open(argv[2], "w").write("\n".join(lines) + "\n")

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    colors = {"decode": "#888888", "short-query": "#2a7ab0", "prefill": "#d0703c"}
    bars = bars[::-1]  # the first cell on top
    fig, ax = plt.subplots(figsize=(9, 0.32 * len(bars) + 1.4))
    ys = range(len(bars))
    ax.barh(ys, [b[1] for b in bars], color=[colors[b[2]] for b in bars])
    ax.axvline(1.3, color="black", linestyle="--", linewidth=1)
    ax.text(1.32, len(bars) - 0.6, "goal: 1.3x", ha="left", va="center", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("time / one-token decode at the same batch, heads and context (log)")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([b[0].replace("\n", ", ") for b in bars], fontsize=8)
    for y, b in zip(ys, bars):
        ax.text(b[1] * 1.04, y, "%.2fx" % b[1], ha="left", va="center", fontsize=7)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()]
    ax.legend(handles, ["route: " + c for c in colors], loc="upper right", fontsize=8)
    ax.set_xlim(0.8, 30)
    ax.set_title("Short queries on the H200 (D 128): each route's time against one-token decode", fontsize=10)
    fig.tight_layout()
    fig.savefig(argv[3], dpi=110)


if __name__ == "__main__":
    main(sys.argv)
