#!/usr/bin/env python3
"""Prefill / extend attention: nvfp4kv on its paged NVFP4 cache against PyTorch SDPA on
dense contiguous BF16 K/V with the same causal mask, the same cells in the same run.

SDPA: scaled_dot_product_attention(q [B, Hq, L, D], K/V [B, Hkv, C + L, D]), causal from
the bottom right (the new tokens are the last L of C + L: torch's causal_lower_right
bias; is_causal where C = 0), under the cuDNN backend and under the flash backend, the
faster reported by name (a backend that refuses the cell is skipped, with GQA expanded
to all query heads first where enable_gqa is refused). Median of 7 event-timed calls
after warm-up. nvfp4kv: `nvfp4kv bench prefill --json` (median of 7 launches). Both
counted as causal attention's FLOPs: 4 D per attended (query head, key token) pair.
Short-query cells (q length 4) run through the mixed-batch call (`--mixed`: its short-query
route) and are also set beside one-token decode at the same batch and context (`nvfp4kv
bench decode --json`): the issue's bound is 1.3x its time.
Writes prefill.md, prefill.json and prefill.png into --out. --from-log rebuilds them from a
run's printed rows (its log), e.g. when a device call could not bring the files back.

usage: prefill_vs_sdpa.py --nvfp4kv build/gpu/nvfp4kv --out DIR [--quick]
       prefill_vs_sdpa.py --from-log LOG --gpu NAME --torch VERSION --out DIR
"""
import argparse
import ast
import json
import os
import subprocess
import sys


def grid(quick):
    """(batch, prompt, cached, q_heads, kv_heads, head_dim, kind) cells of the issue's grid."""
    cells = []
    for hq in (32, 64):
        for b, L in [(1, 2048), (1, 8192), (1, 32768), (8, 2048), (8, 8192), (32, 2048)]:
            cells.append((b, L, 0, hq, 8, 128, "prefill"))
    for d in (64, 256):
        cells += [(1, 8192, 0, 32, 8, d, "prefill"), (8, 2048, 0, 32, 8, d, "prefill")]
    cells += [(1, 512, 8192, 32, 8, 128, "extend"), (1, 2048, 32768, 32, 8, 128, "extend")]
    cells += [(32, 4, 8192 - 4, 32, 8, 128, "short"), (32, 4, 32768 - 4, 32, 8, 128, "short")]
    if quick:
        keep = {(1, 8192, 0, 32, 8, 128), (8, 2048, 0, 32, 8, 128), (1, 512, 8192, 32, 8, 128),
                (32, 4, 8188, 32, 8, 128)}
        cells = [c for c in cells if c[:6] in keep]
    return cells


def causal_flops(b, L, C, hq, d):
    pairs = L * C + L * (L + 1) // 2  # query i of the new tokens attends to C + i + 1 keys
    return 4.0 * d * hq * b * pairs


def sdpa_ms(cell):
    """(ms, backend name) of the faster of cuDNN and flash on this cell, or (None, why)."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.bias import causal_lower_right
    b, L, C, hq, hkv, d, _ = cell
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(b, hq, L, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(b, hkv, C + L, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(b, hkv, C + L, d, device="cuda", dtype=torch.bfloat16, generator=gen)
    best, why = None, []
    for backend, name in [(SDPBackend.CUDNN_ATTENTION, "cuDNN"), (SDPBackend.FLASH_ATTENTION, "flash")]:
        for expand in (False, True):
            kk = k.repeat_interleave(hq // hkv, dim=1) if expand else k
            vv = v.repeat_interleave(hq // hkv, dim=1) if expand else v

            def call():
                if C == 0:
                    return F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=not expand)
                return F.scaled_dot_product_attention(q, kk, vv, attn_mask=causal_lower_right(L, C + L),
                                                      enable_gqa=not expand)
            try:
                with sdpa_kernel([backend]):
                    for _ in range(3):
                        call()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(7):
                        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                        start.record()
                        call()
                        end.record()
                        end.synchronize()
                        times.append(start.elapsed_time(end))
            except RuntimeError as e:
                why.append(f"{name}{' (GQA expanded)' if expand else ''}: {str(e).splitlines()[0][:80]}")
                continue
            times.sort()
            ms = times[len(times) // 2]
            label = name + (" (GQA expanded)" if expand else "")
            if best is None or ms < best[0]:
                best = (ms, label)
            break  # this backend ran; the expanded form is only its fallback
    del q, k, v
    torch.cuda.empty_cache()
    return best if best else (None, "; ".join(why))


def run_json(cmd):
    print("running:", " ".join(cmd), flush=True)
    p = subprocess.run(cmd, capture_output=True, text=True)
    sys.stderr.write(p.stderr)
    if p.returncode != 0:
        raise SystemExit(f"nvfp4kv failed ({p.returncode}):\n{p.stdout}\n{p.stderr}")
    return [json.loads(line) for line in p.stdout.splitlines() if line.startswith("{")]


def ours(nvfp4kv, cell):
    """Milliseconds of our call; short-query cells through the mixed-batch call, which routes them."""
    b, L, C, hq, hkv, d, kind = cell
    rows = run_json([nvfp4kv, "bench", "prefill", "--json", "--batch", str(b), "--prompt", str(L), "--cached", str(C),
                     "--q-heads", str(hq), "--kv-heads", str(hkv), "--head-dim", str(d)] +
                    (["--mixed"] if kind == "short" else []))
    return rows[-1]["ms"]


def decode_ms(nvfp4kv, batch, context, hq, hkv, d):
    rows = run_json([nvfp4kv, "bench", "decode", "--json", "--batch", str(batch), "--context", str(context),
                     "--q-heads", str(hq), "--kv-heads", str(hkv), "--head-dim", str(d)])
    return [r for r in rows if "ms" in r][-1]["ms"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--nvfp4kv")
    ap.add_argument("--out", required=True)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--from-log", help="rebuild the outputs from this log's printed rows; runs nothing")
    ap.add_argument("--gpu", default="unknown GPU", help="with --from-log: the GPU the log's run used")
    ap.add_argument("--torch", default="unknown", help="with --from-log: its PyTorch version")
    args = ap.parse_args()
    if args.from_log:
        with open(args.from_log) as f:
            rows = [ast.literal_eval(line) for line in f if line.startswith("{'kind'")]
        if not rows:
            raise SystemExit(f"{args.from_log}: no rows")
        write_outputs(rows, args.gpu, args.torch, args.out)
        return
    if not args.nvfp4kv:
        ap.error("--nvfp4kv is required unless --from-log is given")
    import torch
    rows = []
    for cell in grid(args.quick):
        b, L, C, hq, hkv, d, kind = cell
        flops = causal_flops(b, L, C, hq, d)
        s_ms, s_name = sdpa_ms(cell)
        o_ms = ours(args.nvfp4kv, cell)
        row = dict(kind=kind, batch=b, prompt=L, cached=C, q_heads=hq, kv_heads=hkv, head_dim=d, ours_ms=o_ms,
                   ours_tflops=flops / (o_ms * 1e-3) / 1e12, sdpa_ms=s_ms, sdpa_backend=s_name,
                   sdpa_tflops=flops / (s_ms * 1e-3) / 1e12 if s_ms else None)
        if kind == "short":
            row["decode_ms"] = decode_ms(args.nvfp4kv, b, C + L, hq, hkv, d)
        rows.append(row)
        print(row, flush=True)
    write_outputs(rows, torch.cuda.get_device_name(), torch.__version__, args.out)


def write_outputs(rows, gpu, torch_version, out):
    """prefill.json, prefill.md (printed too) and prefill.png of a run's rows."""
    # Extend cells against our own prefill rate at the same total length (the goal).
    for r in rows:
        if r["kind"] == "extend":
            same = [p for p in rows if p["kind"] == "prefill" and p["batch"] == r["batch"] and p["q_heads"] == r["q_heads"]
                    and p["head_dim"] == r["head_dim"] and p["prompt"] == r["prompt"] + r["cached"]]
            r["of_own_prefill_rate"] = r["ours_tflops"] / same[0]["ours_tflops"] if same else None
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "prefill.json"), "w") as f:
        json.dump(dict(gpu=gpu, torch=torch_version, rows=rows), f, indent=1)
    lines = [f"GPU: {gpu}, PyTorch {torch_version}; SDPA on dense BF16 K/V, the faster "
             "of cuDNN and flash (named); TFLOP/s counted as causal FLOPs for both", "",
             "| kind | B | new | cached | heads q/kv | D | nvfp4kv ms | nvfp4kv TFLOP/s | SDPA ms | SDPA TFLOP/s | SDPA backend "
             "| nvfp4kv / SDPA rate | note |", "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---|"]
    for r in rows:
        ratio = f"{r['ours_tflops'] / r['sdpa_tflops']:.2f}x" if r["sdpa_tflops"] else "-"
        note = ""
        if r["kind"] == "short":
            note = f"{r['ours_ms'] / r['decode_ms']:.2f}x one-token decode ({r['decode_ms'] * 1e3:.1f} us)"
        if r["kind"] == "extend" and r.get("of_own_prefill_rate"):
            note = f"{r['of_own_prefill_rate']:.2f}x our prefill rate at the same length"
        sdpa_ms_text = f"{r['sdpa_ms']:.3f}" if r["sdpa_ms"] else "-"
        sdpa_tf_text = f"{r['sdpa_tflops']:.0f}" if r["sdpa_tflops"] else "-"
        lines.append(f"| {r['kind']} | {r['batch']} | {r['prompt']} | {r['cached']} | {r['q_heads']}/{r['kv_heads']} | "
                     f"{r['head_dim']} | {r['ours_ms']:.3f} | {r['ours_tflops']:.0f} | {sdpa_ms_text} | {sdpa_tf_text} | "
                     f"{r['sdpa_backend']} | {ratio} | {note} |")
    table = "\n".join(lines)
    print(table)
    with open(os.path.join(out, "prefill.md"), "w") as f:
        f.write(table + "\n")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        sel = [r for r in rows if r["sdpa_tflops"]]
        labels = [f"{r['kind'][0]} {r['batch']}x{r['prompt']}" + (f"+{r['cached']}" if r["cached"] else "") +
                  f" {r['q_heads']}/{r['kv_heads']} D{r['head_dim']}" for r in sel]
        x = range(len(sel))
        fig, ax = plt.subplots(figsize=(max(8, 0.55 * len(sel)), 4.8))
        ax.bar([i - 0.2 for i in x], [r["ours_tflops"] for r in sel], width=0.4, label="nvfp4kv, NVFP4 paged")
        ax.bar([i + 0.2 for i in x], [r["sdpa_tflops"] for r in sel], width=0.4, label="SDPA, BF16 dense")
        ax.set_xticks(list(x))
        ax.set_xticklabels(labels, rotation=60, ha="right", fontsize=7)
        ax.set_ylabel("TFLOP/s (causal FLOPs)")
        ax.set_title(f"prefill / extend attention, {gpu}, same run")
        ax.legend()
        ax.grid(axis="y", alpha=0.3)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "prefill.png"), dpi=110)
    except ImportError as e:
        print("no plot:", e)


if __name__ == "__main__":
    main()
