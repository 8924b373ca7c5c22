"""The accuracy table (markdown) and plot (PNG) from accuracy.py's JSON.

    python3 bench/transformers/plot.py bench/results/FILE.json     # writes FILE.md and FILE.png beside it
    python3 bench/transformers/plot.py --merge RUN1.json RUN2.json [RUN3.json ...] FILE.json
        # one results file from several runs of accuracy.py (e.g. its contexts split across GPU
        # calls, decode and generation in another): each context from the run with the most
        # windows there (the first of equals), later runs' extra rows at a context added where
        # its BF16 row is the same (the same windows), decode and generation from the last run
        # that has them; all commands kept),
        # then its table and plot
"""
from __future__ import annotations

import json
import os
import sys

LABELS = {
    "bf16": "BF16 KV (reference)",
    "fp8": "FP8 E4M3, per-tensor scale (calibrated)",
    "nvfp4": "nvfp4kv NVFP4, global scale 1.0",
    "nvfp4-cal": "nvfp4kv NVFP4, calibrated global scale",
    "nvfp4-4over6": "nvfp4kv NVFP4 4over6, global scale 1.0",
    "nvfp4-4over6-cal": "nvfp4kv NVFP4 4over6, calibrated",
    "nvfp4-rot": "nvfp4kv NVFP4 + Hadamard rotation (whole head)",
    "nvfp4-smooth": "nvfp4kv NVFP4 + K smoothing (calibrated mu)",
    "nvfp4-all": "nvfp4kv NVFP4 4over6 + rotation + K smoothing",
    "k-fp8-v-nvfp4": "K FP8 + V NVFP4 (simulated, 6.25 bits)",
    "nvfp4-calibrated": "nvfp4kv NVFP4, per-layer modes and scales from nvfp4kv calibrate (4.5 bits)",
    "nvfp4-calibrated-gs1": "nvfp4kv NVFP4, per-layer modes from nvfp4kv calibrate, global scale 1.0",
    "policy-4.5-sim": "calibrated per-layer policy at 4.5 bits (simulated; = the calibrated row)",
    "policy-5.3-sim": "calibrated per-layer policy, <= 5.3 bits: FP8 K/V in the most sensitive layers (simulated)",
    "policy-6-sim": "calibrated per-layer policy, <= 6 bits: FP8 K/V in the most sensitive layers (simulated)",
    "policy-5.3-attn-sim": "calibrated per-layer policy, <= 5.3 bits, layers ranked by attention error (simulated)",
    "policy-6-attn-sim": "calibrated per-layer policy, <= 6 bits, layers ranked by attention error (simulated)",
    "nvfp4-first-bf16": "NVFP4 with each window's first token in BF16 (simulated; its side region, +11.5/L bits "
                        "per value at context L, not counted)",
    "k-hadamard-sim": "K - mu, whole-head Hadamard, 4over6; V 4over6 + rotation; calibrated scales (simulated control)",
    "k-pca-sim": "K - mu rotated onto its principal axes, 4over6; V as the control (simulated)",
    "k-pca-h16-sim": "K - mu on its principal axes, then Hadamard-16 per block, 4over6; V as the control (simulated)",
    "k-qscale-sim": "K - mu, channels scaled by (var k / E q^2)^1/4 (q by its inverse), 4over6; V as the control (simulated)",
    "k-qscale-hadamard-sim": "K - mu, channels scaled as k-qscale, then whole-head Hadamard, 4over6; V as the control (simulated)",
    "nvfp4-qscale": "cache format: K - mu, / lambda (k_channel_scale), whole-head Hadamard, 4over6; V 4over6 + rotation (KVCache)",
    "policy-5.3-qscale-sim": "calibrated policy, <= 5.3 bits (attention-error layers), NVFP4 K scaled as k-qscale + Hadamard (simulated)",
    "policy-6-qscale-sim": "calibrated policy, <= 6 bits (attention-error layers), NVFP4 K scaled as k-qscale + Hadamard (simulated)",
    "quanto-int4": "transformers QuantizedCache quanto int4",
    "quanto-int2": "transformers QuantizedCache quanto int2",
    "hqq-4": "transformers QuantizedCache HQQ 4-bit",
}


def where(r) -> str:
    """The machine a run used, in words."""
    if r["device"].startswith("cuda"):
        return "the GPU (%s)" % r.get("gpu", r["device"])
    return "the %s (%d thread(s))" % (r["device"], r["threads"])


def label(r, row: str) -> str:
    """A row's name in the table; the reference row says which precision it kept K/V in (the
    activations', float32 where the run asked for it)."""
    if row == "bf16" and r.get("dtype", "bfloat16") != "bfloat16":
        return "%s KV, unquantized (reference)" % {"float32": "FP32", "float16": "FP16"}.get(r["dtype"], r["dtype"])
    return LABELS.get(row, row)


def model_name(r) -> str:
    """The model's short name: what the results' "model" says before its first comma."""
    return r["model"].split(",")[0]


def bits_per_value(r, row: str) -> float:
    """A row's stored bits per K/V value, from its bytes per token against the BF16 row's 16 bits."""
    return 16.0 * r["bytes_per_token"][row] / r["bytes_per_token"]["bf16"]


def table(r) -> str:
    rows = r["rows"]
    out = ["# What KV-cache formats cost on %s" % model_name(r), "",
           "Model: %s; every row runs the same weights, so the rows compare KV caches only. Activations "
           "%s on %s; %s; torch %s, transformers %s." % (
               r["model"], r["dtype"], where(r), r["nvfp4kv"], r["torch"], r["transformers"]),
           "Text: the Python 3 manual's prose (Debian python3-doc, bench/transformers/text.py), windows from its "
           "start; calibration (the FP8 scales, the -cal global scales, the K means of K smoothing): K and V amax "
           "and K's mean per layer, KV head and channel over %d tokens of the "
           "Debian Reference (debian-reference-en), text never evaluated on.%s" % (
               r["calibration"]["tokens"], " Every window begins with BOS (id %d), as the tokenizer begins a text, "
               "followed by the text's next tokens." % r["inputs"]["bos"] if r.get("inputs", {}).get("bos") is not None else ""),
           "KL: KL(P_ref || P_row) of the next-token distributions against the reference row (K/V unquantized, "
           "in the activations' precision), per predicted token; top-1: the same most likely next token as the "
           "reference row; bits per value: of the stored form, the reference counted as 16. Bytes per token: all layers, K and V, data and scales (quanto and "
           "HQQ: their 4 or 2 bits plus a 16-bit scale and zero point per group of 64, not counting the last "
           "128 tokens they keep in BF16).", "",
           "Predicted tokens per row: %s (%d in all)." % (
               ", ".join("%s at context %s" % (per["bf16"]["tokens"], c) for c, per in r["contexts"].items()),
               sum(per["bf16"]["tokens"] for per in r["contexts"].values())), "",
           "    " + r["command"].replace("; ", "\n    "), "",
           "Took %.0f s in all%s." % (r.get("seconds", float("nan")),
                                      "" if r.get("complete", True) else ", cut short by accuracy.py --deadline")]
    for row, why in r.get("failed_rows", {}).items():
        out += ["", "Row %s failed on this machine and is left out: %s" % (label(r, row), why)]
    for ctx, per in r["contexts"].items():
        base = per["bf16"]["ppl"]
        windows = per["bf16"]["tokens"] // (int(ctx) - 1)
        cut = "" if per.get("windows_planned", windows) == windows else " of %d planned" % per["windows_planned"]
        out += ["", "**Context %s** (%d windows%s, %d predicted tokens per row, chunks of %d; %.0f s)" %
                (ctx, windows, cut, per["bf16"]["tokens"], r["chunk"], per["seconds"]), "",
                "| row | bits / value | cache bytes / token | perplexity | vs reference | mean KL | p99 KL | top-1 agreement |",
                "|---|---:|---:|---:|---:|---:|---:|---:|"]
        for row in [x for x in rows if x in per]:
            m = per[row]
            out.append("| %s | %.2f | %d | %.3f | %+.2f %% | %.4f | %.3f | %.1f %% |" % (
                label(r, row), bits_per_value(r, row), r["bytes_per_token"][row], m["ppl"],
                100 * (m["ppl"] / base - 1), m["kl_mean"], m["kl_p99"], 100 * m["top1"]))
    if "decode" in r:
        d = r["decode"]
        out += ["", "**Token by token against chunked** (the first %d window(s) of %d tokens, the same tokens both "
                "ways)" % (d["windows"], d["context"]), "",
                "| row | perplexity, decode | perplexity, chunks of %d | gap |" % r["chunk"], "|---|---:|---:|---:|"]
        for row in [x for x in rows if x in d["rows"]]:
            m = d["rows"][row]
            out.append("| %s | %.3f | %.3f | %+.2f %% |" % (label(r, row), m["ppl_decode"], m["ppl_chunked"],
                                                           100 * (m["ppl_decode"] / m["ppl_chunked"] - 1)))
    if "generation" in r:
        g = r["generation"]
        n = g["bf16"]["prompts"]
        out += ["", "**Greedy generation** (%d prompts left-padded into one batch, %d new tokens each)" %
                (n, g["new_tokens"]), "",
                "| row | tokens before the first difference from the reference | continuations identical to the reference |",
                "|---|---:|---:|"]
        for row in [x for x in rows if x in g]:
            m = g[row]
            out.append("| %s | %.1f %% | %d of %d |" % (label(r, row), 100 * m["prefix_agreement"],
                                                       m["identical"], m["prompts"]))
    return "\n".join(out) + "\n"


def plot(r, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [x for x in r["rows"] if x != "bf16"]
    contexts = list(r["contexts"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 5.2))
    markers = ["o", "s", "^", "D"]
    for i, ctx in enumerate(contexts):
        per = r["contexts"][ctx]
        have = [x for x in rows if x in per]
        xs = [bits_per_value(r, x) for x in have]
        ys = [max(per[x]["kl_mean"], 1e-5) for x in have]
        left.scatter(xs, ys, marker=markers[i % len(markers)], label="context %s" % ctx, alpha=0.8)
        if i == 0:  # labels beside the points; rows at the same bytes stacked so they stay legible
            same = {}
            for x, y, name in sorted(zip(xs, ys, have), key=lambda p: p[1]):
                k = same.setdefault(x, [])
                left.annotate(name, (x, y), textcoords="offset points", xytext=(8, -4 + 11 * len(k)), fontsize=8,
                              arrowprops=dict(arrowstyle="-", lw=0.4, alpha=0.5) if k else None)
                k.append(name)
    left.set_yscale("log")
    left.set_xlabel("bits per stored K/V value (data and scales)")
    left.set_ylabel("mean KL divergence from the unquantized reference (nats)")
    left.set_title("What each KV format costs: next-token KL")
    left.grid(True, which="both", alpha=0.3)
    left.legend()
    width = 0.8 / len(contexts)
    for i, ctx in enumerate(contexts):
        per = r["contexts"][ctx]
        base = per["bf16"]["ppl"]
        right.bar([j + i * width for j in range(len(rows))],
                  [100 * (per[x]["ppl"] / base - 1) if x in per else 0 for x in rows], width, label="context %s" % ctx)
    right.set_xticks([j + width * (len(contexts) - 1) / 2 for j in range(len(rows))])
    right.set_xticklabels(rows, rotation=30, ha="right", fontsize=8)
    right.set_yscale("symlog", linthresh=1)
    right.set_ylabel("perplexity increase over the reference (%)")
    right.set_title("Perplexity (chunked prefill of %d)" % r["chunk"])
    right.grid(True, axis="y", alpha=0.3)
    right.legend()
    fig.suptitle("%s (4-bit weights, the same for every row), Python 3 manual prose, on %s"
                 % (model_name(r), where(r)), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def merge(paths, out_path: str) -> None:
    """One results file from accuracy.py runs over the same text (see the module's doc)."""
    runs = []
    for path in paths:
        with open(path) as f:
            runs.append(json.load(f))
    out = runs[0]

    def took(r):  # a run stopped after its contexts has no total: the sum of its contexts'
        return r.get("seconds", sum(per["seconds"] for per in r.get("contexts", {}).values()))

    whole = {key: out.get("complete", True) for key in ("decode", "generation") if key in out}
    for other in runs[1:]:
        for key in ("decode", "generation"):
            if key in other:
                out[key] = other[key]
                whole[key] = other.get("complete", True)
                measured = other[key]["rows"] if key == "decode" else other[key]
                for row in other["rows"]:
                    if row in measured and row not in out["rows"]:
                        out["rows"].append(row)
                        out["bytes_per_token"][row] = other["bytes_per_token"][row]
        for ctx, per in other.get("contexts", {}).items():
            have = out["contexts"].get(ctx)
            if have is None or per["bf16"]["tokens"] > have["bf16"]["tokens"]:
                # A context new here, or measured over more windows than before (an earlier run was
                # cut by its deadline): the later run's, whole.
                out["contexts"][ctx] = per
                new = [row for row in per if isinstance(per[row], dict)]
            elif per["bf16"]["tokens"] < have["bf16"]["tokens"]:
                continue  # a run cut shorter than the one kept
            else:
                # Rows the later run measured at a context an earlier one has too (same windows: its
                # BF16 row must be the earlier's, or the two runs did not see the same tokens).
                if per["bf16"] != have["bf16"]:
                    raise SystemExit("plot.py --merge: the BF16 rows at context %s differ: not the same windows" % ctx)
                new = [row for row, m in per.items() if isinstance(m, dict) and row not in have]
                for row in new:
                    out["contexts"][ctx][row] = per[row]
                out["contexts"][ctx]["seconds"] += per["seconds"]
            for row in new:
                if row not in out["rows"]:
                    out["rows"].append(row)
                    out["bytes_per_token"][row] = other["bytes_per_token"][row]
        for row, why in other.get("failed_rows", {}).items():
            out.setdefault("failed_rows", {})[row] = why
    # Complete when every context kept has all its windows, and the runs that gave decode and
    # generation were not cut.
    out["complete"] = all(per.get("windows", 0) == per.get("windows_planned", 0) for per in out["contexts"].values()) \
        and all(whole.values())
    out["command"] = "; ".join(["python3 %s" % r["command"] for r in runs] +
                               ["python3 bench/transformers/plot.py --merge %s %s" % (" ".join(paths), out_path)])
    out["seconds"] = sum(took(r) for r in runs)
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) >= 4 and argv[0] == "--merge":
        merge(argv[1:-1], argv[-1])
        argv = argv[-1:]
    if len(argv) != 1:
        print(__doc__.strip(), file=sys.stderr)
        return 2
    with open(argv[0]) as f:
        r = json.load(f)
    stem = os.path.splitext(argv[0])[0]
    with open(stem + ".md", "w") as f:
        f.write(table(r))
    plot(r, stem + ".png")
    print("wrote %s.md and %s.png" % (stem, stem))
    return 0


if __name__ == "__main__":
    sys.exit(main())
