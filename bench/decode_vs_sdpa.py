#!/usr/bin/env python3
"""Decode attention: nvfp4kv on its paged NVFP4 cache against PyTorch SDPA on dense
BF16 K/V, the same shapes measured in the same run, plus the streaming-read ceiling.

SDPA: scaled_dot_product_attention(q [B, Hq, 1, D], K/V [B, Hkv, L, D], enable_gqa=True),
captured in a CUDA graph of several calls that rotate over copies of K/V larger than
the L2, median of 20 replays. nvfp4kv: `nvfp4kv bench decode --json` (the same method;
see include/nvfp4kv/harness/decode_bench.hpp). Writes a markdown table, the raw JSON
and a PNG plot into --out.

usage: decode_vs_sdpa.py --nvfp4kv build/gpu/nvfp4kv --out DIR [--quick]
"""
import argparse
import json
import math
import os
import subprocess
import sys


def grid(quick):
    """(batch, context, q_heads, kv_heads, head_dim) cells of the issue's grid."""
    cells = []
    batches = [1, 8, 32, 128]
    contexts = [2048, 8192, 32768, 131072]
    for hq, hkv in [(32, 8), (64, 8), (32, 32)]:
        for b in batches:
            for ctx in contexts:
                cells.append((b, ctx, hq, hkv, 128))
    for d in (64, 256):
        cells += [(8, 32768, 32, 8, d), (32, 8192, 32, 8, d)]
    if quick:
        return [(1, 2048, 32, 8, 128), (1, 8192, 32, 8, 128), (1, 32768, 32, 8, 128), (1, 131072, 32, 8, 128),
                (8, 2048, 32, 8, 128), (16, 32768, 32, 8, 128), (32, 8192, 32, 8, 128), (128, 2048, 32, 8, 128),
                (8, 8192, 64, 8, 128), (1, 2048, 32, 32, 128), (8, 32768, 32, 8, 64), (8, 32768, 32, 8, 256)]
    return cells


def fits(cell, limit_gb):
    b, ctx, hq, hkv, d = cell
    return 2 * b * hkv * ctx * d * 2 / 1e9 <= limit_gb  # BF16 K + V for SDPA


def sdpa_ms(cell):
    import torch
    import torch.nn.functional as F
    b, ctx, hq, hkv, d = cell
    kv_bytes = 2 * b * hkv * ctx * d * 2
    copies = max(1, min(16, math.ceil(256e6 / kv_bytes)))
    gen = torch.Generator(device="cuda").manual_seed(1)
    ks = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
    vs = [torch.randn(b, hkv, ctx, d, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(copies)]
    q = torch.randn(b, hq, 1, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    calls = max(copies, 4)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for c in range(calls):  # warm-up outside the graph (kernel selection, workspace)
            F.scaled_dot_product_attention(q, ks[c % copies], vs[c % copies], enable_gqa=True)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for c in range(calls):
            F.scaled_dot_product_attention(q, ks[c % copies], vs[c % copies], enable_gqa=True)
    times = []
    for _ in range(21):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / calls)
    del ks, vs, q, graph
    torch.cuda.empty_cache()
    times.sort()
    return times[len(times) // 2], kv_bytes


def ours(nvfp4kv, cells):
    """One process per (heads, dim) group: the CLI takes lists of batches and contexts."""
    results, ceiling = {}, None
    groups = {}
    for b, ctx, hq, hkv, d in cells:
        groups.setdefault((hq, hkv, d), (set(), set()))
        groups[(hq, hkv, d)][0].add(b)
        groups[(hq, hkv, d)][1].add(ctx)
    for (hq, hkv, d), (bs, ctxs) in groups.items():
        cmd = [nvfp4kv, "bench", "decode", "--json", "--q-heads", str(hq), "--kv-heads", str(hkv), "--head-dim", str(d),
               "--batch", ",".join(map(str, sorted(bs))), "--context", ",".join(map(str, sorted(ctxs)))]
        print("running:", " ".join(cmd), flush=True)
        p = subprocess.run(cmd, capture_output=True, text=True)
        sys.stderr.write(p.stderr)
        if p.returncode != 0:
            raise SystemExit(f"nvfp4kv bench failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
        for line in p.stdout.splitlines():
            r = json.loads(line)
            if "ceiling_read_tbs" in r:
                ceiling = r["ceiling_read_tbs"] if ceiling is None else max(ceiling, r["ceiling_read_tbs"])
                continue
            results[(r["batch"], r["context"], r["q_heads"], r["kv_heads"], r["head_dim"])] = r
    return results, ceiling


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvfp4kv", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--limit-gb", type=float, default=70.0)
    args = ap.parse_args()
    import torch
    cells = [c for c in grid(args.quick) if fits(c, args.limit_gb)]
    sdpa = {}
    for cell in cells:
        ms, kv_bytes = sdpa_ms(cell)
        sdpa[cell] = (ms, kv_bytes)
        print(f"sdpa {cell}: {ms * 1e3:.1f} us, {kv_bytes / ms / 1e9:.2f} TB/s", flush=True)
    mine, ceiling = ours(args.nvfp4kv, cells)
    rows = []
    for cell in cells:
        if cell not in mine:
            continue
        r = mine[cell]
        s_ms, s_bytes = sdpa[cell]
        rows.append(dict(batch=cell[0], context=cell[1], q_heads=cell[2], kv_heads=cell[3], head_dim=cell[4],
                         ours_us=r["ms"] * 1e3, ours_tbs=r["tbs"], of_ceiling=r["tbs"] / ceiling,
                         sdpa_us=s_ms * 1e3, sdpa_tbs=s_bytes / (s_ms * 1e-3) / 1e12, speedup=s_ms / r["ms"],
                         splits=r["splits"], dense=r["dense"], checked_rel_l2=r["checked_rel_l2"]))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "decode.json"), "w") as f:
        json.dump(dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, ceiling_read_tbs=ceiling, rows=rows), f,
                  indent=1)
    lines = [f"GPU: {torch.cuda.get_device_name()}, PyTorch {torch.__version__}; streaming-read ceiling "
             f"{ceiling:.2f} TB/s (same run)", "",
             "| B | context | heads q/kv | D | nvfp4kv us | NVFP4 TB/s | of read ceiling | SDPA bf16 us | SDPA TB/s | "
             "speed vs SDPA | splits |", "|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['batch']} | {r['context']} | {r['q_heads']}/{r['kv_heads']} | {r['head_dim']} | "
                     f"{r['ours_us']:.1f} | {r['ours_tbs']:.2f} | {100 * r['of_ceiling']:.0f}% | {r['sdpa_us']:.1f} | "
                     f"{r['sdpa_tbs']:.2f} | {r['speedup']:.2f}x | {r['splits']} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(args.out, "decode.md"), "w") as f:
        f.write(table + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
        for b, color in zip([1, 8, 32, 128], ["tab:blue", "tab:orange", "tab:green", "tab:red"]):
            sel = [r for r in rows if r["batch"] == b and r["q_heads"] == 32 and r["kv_heads"] == 8 and r["head_dim"] == 128]
            if not sel:
                continue
            x = [r["context"] for r in sel]
            axes[0].plot(x, [r["ours_tbs"] for r in sel], "-o", color=color, label=f"nvfp4kv NVFP4, B={b}")
            axes[0].plot(x, [r["sdpa_tbs"] for r in sel], "--s", color=color, alpha=0.6, label=f"SDPA BF16, B={b}")
            axes[1].plot(x, [r["speedup"] for r in sel], "-o", color=color, label=f"B={b}")
        axes[0].axhline(ceiling, color="gray", lw=1, ls=":", label="streaming-read ceiling")
        for ax in axes:
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (tokens)")
            ax.grid(alpha=0.3)
        axes[0].set_ylabel("cache bytes read per second (TB/s)")
        axes[0].set_title(f"decode, 32 q / 8 kv heads, D 128, {torch.cuda.get_device_name()}")
        axes[1].axhline(3.56, color="gray", lw=1, ls=":", label="byte ratio 3.56x")
        axes[1].axhline(1.0, color="black", lw=0.8)
        axes[1].set_ylabel("speed vs SDPA on BF16")
        axes[1].set_title("nvfp4kv / SDPA time")
        axes[0].legend(fontsize=7, ncol=2)
        axes[1].legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "decode_h200.png"), dpi=110)
    except ImportError as e:
        print("no plot:", e)


if __name__ == "__main__":
    main()
