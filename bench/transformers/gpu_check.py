"""On the GPU: (1) the fused decode kernel gives SmolLM2's perplexity through KVCache equal to the
CPU path's to 3 significant digits; (2) a decode step's tokens/s for BF16 SDPA, transformers'
quanto int4 cache and nvfp4kv at batch 1 and 32, contexts 2K and 8K.

    python3 bench/transformers/gpu_check.py --staged PART_A [PART_B] --out $OUT/transformers-gpu.json

(1) uses the staged real model (stage_gpu.py: SmolLM2-135M-Instruct's GGUF blocks exactly; part a
alone is its first 10 layers, a and b the whole model) in float32 on both devices (TF32 off), so the K/V rows each
path hands the store are the same bfloat16 values: the GPU's store is bit-exact with the CPU
reference, and what remains is the order of the attention sums. Each path runs every window
token by token (the decode kernel on the GPU, the CPU reference's decode on the host) and in
chunks of 256 (gather + SDPA).
(2) uses a model of SmolLM2-135M's full shape (30 layers) with random bfloat16 weights: the
timing does not depend on the weights. Each cache is filled by prefill, then --steps decode
steps of the whole model are timed (eager, one token per sequence per step, after 2 warm-ups).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import nvfp4kv  # noqa: E402
import nvfp4kv.transformers as nt  # noqa: E402
from staged import load_staged, staged_layers  # noqa: E402
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM  # noqa: E402


def log(msg):
    print(msg, flush=True)


def perplexities(model, device, tokens, windows, length, rule, chunk):
    """{"decode": ppl token by token, "chunked": ppl in chunks} through KVCache on ``device``."""
    nll = {"decode": 0.0, "chunked": 0.0}
    count = 0
    model.set_attn_implementation(nt.NAME)
    with torch.no_grad():
        for w in range(windows):
            ids = torch.from_numpy(tokens[w * length:(w + 1) * length].astype(np.int64))[None].to(device)
            cache = nt.KVCache(model.config, max_tokens=length, device=device, rule=rule)
            for t in range(length - 1):
                logits = model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[0, -1].float()
                nll["decode"] -= float(torch.log_softmax(logits, -1)[ids[0, t + 1]])
            cache = nt.KVCache(model.config, max_tokens=length, device=device, rule=rule)
            for start in range(0, length, chunk):
                logits = model(ids[:, start:start + chunk], past_key_values=cache, use_cache=True).logits[0].float()
                logp = torch.log_softmax(logits, -1)
                targets = ids[0, start + 1:start + chunk + 1]
                nll["chunked"] -= float(logp[: targets.numel()].gather(1, targets[:, None]).sum())
            count += length - 1
    return {k: math.exp(v / count) for k, v in nll.items()}


def three_digits(x):
    return float("%.3g" % x)


def check_perplexity(args):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    tokens = np.load(os.path.join(args.staged[0], "tokens.npy"))
    out = {}
    for rule in ("standard", "4over6"):
        row = {}
        for device in ("cpu", "cuda"):
            t0 = time.time()
            model = load_staged(args.staged, dtype=torch.float32, device=device)
            row[device] = perplexities(model, device, tokens, args.windows, args.length, rule, 256)
            log("perplexity %s %s: %s (%.0f s)" % (rule, device, row[device], time.time() - t0))
        row["equal_to_3_digits"] = all(three_digits(row["cpu"][k]) == three_digits(row["cuda"][k])
                                       for k in ("decode", "chunked"))
        row["relative_gap"] = {k: row["cuda"][k] / row["cpu"][k] - 1 for k in ("decode", "chunked")}
        out[rule] = row
    return {"windows": args.windows, "length": args.length,
            "model": "SmolLM2-135M-Instruct (Q4_1 GGUF weights), first %d of 30 layers" % staged_layers(args.staged),
            "rules": out}


def timed_cache(kind, config, batch, length, device="cuda"):
    if kind == "bf16-sdpa":
        return DynamicCache(config=config), "sdpa"
    if kind == "quanto-int4":
        from transformers import QuantizedCache

        return QuantizedCache(backend="quanto", config=config, nbits=4), "sdpa"
    if kind == "nvfp4kv":
        return nt.KVCache(config, max_tokens=batch * (length + 64), device=device), nt.NAME
    raise ValueError(kind)


def time_decode(model, kind, batch, length, steps, device="cuda"):
    """Decode tokens/s (batch * steps / seconds) after filling the cache with ``length`` tokens."""
    cache, attn = timed_cache(kind, model.config, batch, length, device)
    model.set_attn_implementation(attn)
    g = torch.Generator(device=device).manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, length + steps + 2), device=device, generator=g)
    with torch.no_grad():
        for start in range(0, length, 1024):
            model(ids[:, start:min(start + 1024, length)], past_key_values=cache, use_cache=True, logits_to_keep=1)
        for t in range(length, length + 2):  # warm-up steps (workspaces, lazy initialisation)
            model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        sync()
        t0 = time.perf_counter()
        for t in range(length + 2, length + 2 + steps):
            model(ids[:, t:t + 1], past_key_values=cache, use_cache=True)
        sync()
    seconds = time.perf_counter() - t0
    return {"tokens_per_s": batch * steps / seconds, "ms_per_step": 1e3 * seconds / steps}


def check_speed(args):
    with open(os.path.join(args.staged[0], "config.json")) as f:
        config = {k: v for k, v in json.load(f).items() if k != "architectures"}
    config["num_hidden_layers"] = 30
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**config)).to(device="cuda", dtype=torch.bfloat16).eval()
    result = []
    for batch in (1, 32):
        for length in (2048, 8192):
            for kind in ("bf16-sdpa", "quanto-int4", "nvfp4kv"):
                try:
                    r = time_decode(model, kind, batch, length, args.steps)
                except Exception as e:  # a peer that does not run here is reported, not fatal
                    r = {"error": "%s: %s" % (type(e).__name__, str(e).splitlines()[0][:200])}
                r.update(kind=kind, batch=batch, context=length)
                log("decode %s B=%d L=%d: %s" % (kind, batch, length, r))
                result.append(r)
                torch.cuda.empty_cache()
    return {"model": "SmolLM2-135M shape (30 layers, 9 q / 3 kv heads, D 64), random bf16 weights",
            "steps": args.steps, "runs": result}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--staged", nargs="+", required=True, help="stage_gpu.py's parts (a, or a and b)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--windows", type=int, default=4)
    ap.add_argument("--length", type=int, default=512)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--skip", default="", help="perplexity or speed")
    args = ap.parse_args(argv)
    ok, why = nvfp4kv.cuda_available()
    if not ok:
        raise SystemExit("gpu_check.py: %s" % why)
    torch.set_num_threads(min(16, os.cpu_count() or 1))
    result = {"nvfp4kv": nvfp4kv.build_info, "torch": torch.__version__,
              "transformers": __import__("transformers").__version__, "gpu": torch.cuda.get_device_name()}
    if "perplexity" not in args.skip:
        result["perplexity"] = check_perplexity(args)
    if "speed" not in args.skip:
        result["speed"] = check_speed(args)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    log(json.dumps(result, indent=1))
    verdicts = [r["equal_to_3_digits"] for r in result.get("perplexity", {}).get("rules", {}).values()]
    return 0 if all(verdicts) else 1


if __name__ == "__main__":
    sys.exit(main())
