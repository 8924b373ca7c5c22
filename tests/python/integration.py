"""The shape of a real integration: a small random transformer (GQA, RoPE)
decoding in PyTorch with its KV cache in nvfp4kv (store every step, decode
attention, the step replayed as a CUDA graph), compared with the same model on
a BF16 cache; then the field failure, a reader that disagrees with the writer.

    python3 tests/python/integration.py --out bench/results/DATE-h200-python-integration.md

writes the figures (markdown, and the per-step series as JSON beside it);
tests/python/test_integration.py runs the same code with assertions. On a
machine without a GPU, --device cpu runs the host cache (the CPU reference,
eagerly) for a smaller check of the same code.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import nvfp4kv


@dataclasses.dataclass
class Config:
    vocab: int = 2048
    layers: int = 4
    q_heads: int = 8
    kv_heads: int = 2            # GQA: 4 query heads per kv head
    head_dim: int = 128
    mlp: int = 2048
    batch: int = 4
    prompt: int = 8
    steps: int = 256             # decode steps after the prompt
    tokens_per_page: int = 16
    logit_scale: float = 3.0     # logits' standard deviation: peaked, not one-hot, next-token choices
    attn_sharpness: float = 1.0  # q . k / sqrt(D) has this standard deviation: attention picks tokens
    seed: int = 0

    @property
    def d_model(self) -> int:
        return self.q_heads * self.head_dim

    @property
    def max_tokens(self) -> int:
        return self.prompt + self.steps


class Model:
    """Pre-norm decoder, random weights in bf16; attention goes through `attend`."""

    def __init__(self, cfg: Config, device: str):
        g = torch.Generator(device="cpu").manual_seed(cfg.seed)
        d, dev = cfg.d_model, device

        def w(*shape, std):
            return (torch.randn(*shape, generator=g) * std).to(torch.bfloat16).to(dev)

        self.cfg = cfg
        self.embed = w(cfg.vocab, d, std=1.0)
        self.wq = [w(d, cfg.q_heads * cfg.head_dim, std=cfg.attn_sharpness * d ** -0.5) for _ in range(cfg.layers)]
        self.wk = [w(d, cfg.kv_heads * cfg.head_dim, std=d ** -0.5) for _ in range(cfg.layers)]
        self.wv = [w(d, cfg.kv_heads * cfg.head_dim, std=d ** -0.5) for _ in range(cfg.layers)]
        self.wo = [w(cfg.q_heads * cfg.head_dim, d, std=(cfg.q_heads * cfg.head_dim) ** -0.5) for _ in range(cfg.layers)]
        self.w1 = [w(d, cfg.mlp, std=d ** -0.5) for _ in range(cfg.layers)]
        self.w3 = [w(d, cfg.mlp, std=d ** -0.5) for _ in range(cfg.layers)]
        self.w2 = [w(cfg.mlp, d, std=cfg.mlp ** -0.5) for _ in range(cfg.layers)]
        self.head = w(d, cfg.vocab, std=d ** -0.5)  # untied: the next token is not the current one
        half = cfg.head_dim // 2
        inv = 1.0 / (10000.0 ** (torch.arange(half, dtype=torch.float32) / half))
        angles = torch.arange(cfg.max_tokens + 1, dtype=torch.float32)[:, None] * inv[None, :]
        self.cos, self.sin = angles.cos().to(dev), angles.sin().to(dev)

    @staticmethod
    def norm(x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """x (batch, heads, D), pos (batch,): rotate pairs (i, i + D/2)."""
        cos, sin = self.cos[pos][:, None, :], self.sin[pos][:, None, :]
        a, b = x.float().chunk(2, dim=-1)
        return torch.cat([a * cos - b * sin, a * sin + b * cos], dim=-1).to(torch.bfloat16)

    def step(self, tokens: torch.Tensor, pos: torch.Tensor, attend: Callable) -> torch.Tensor:
        """One token per sequence: tokens, pos (batch,) -> logits (batch, vocab) fp32."""
        c = self.cfg
        x = self.embed[tokens]
        for layer in range(c.layers):
            h = self.norm(x)
            q = self.rope((h @ self.wq[layer]).view(-1, c.q_heads, c.head_dim), pos)
            k = self.rope((h @ self.wk[layer]).view(-1, c.kv_heads, c.head_dim), pos)
            v = (h @ self.wv[layer]).view(-1, c.kv_heads, c.head_dim).contiguous()
            o = attend(layer, q, k, v)
            x = x + o.reshape(x.shape[0], -1) @ self.wo[layer]
            h = self.norm(x)
            x = x + (torch.nn.functional.silu(h @ self.w1[layer]) * (h @ self.w3[layer])) @ self.w2[layer]
        return (self.norm(x) @ self.head).float() * c.logit_scale


class DenseCache:
    """The baseline: K and V in BF16, attention in fp32 over positions <= pos."""

    def __init__(self, cfg: Config, device: str):
        shape = (cfg.layers, cfg.batch, cfg.max_tokens, cfg.kv_heads, cfg.head_dim)
        self.cfg, self.k, self.v = cfg, torch.zeros(shape, dtype=torch.bfloat16, device=device), \
            torch.zeros(shape, dtype=torch.bfloat16, device=device)
        self.t = 0
        self.amax = torch.zeros(cfg.layers, 2, device=device)

    def attend(self, layer, q, k, v):
        t, c = self.t, self.cfg
        self.k[layer, :, t], self.v[layer, :, t] = k, v
        self.amax[layer, 0] = torch.maximum(self.amax[layer, 0], k.float().abs().max())
        self.amax[layer, 1] = torch.maximum(self.amax[layer, 1], v.float().abs().max())
        group = c.q_heads // c.kv_heads
        keys = self.k[layer, :, : t + 1].float().repeat_interleave(group, dim=2)  # (B, T, Hq, D)
        vals = self.v[layer, :, : t + 1].float().repeat_interleave(group, dim=2)
        logits = torch.einsum("bhd,bthd->bht", q.float(), keys) / math.sqrt(c.head_dim)
        return torch.einsum("bht,bthd->bhd", logits.softmax(-1), vals).to(torch.bfloat16)


class PagedNvfp4:
    """The KV cache in nvfp4kv: `writer` stores, `reader` attends (the same Cache
    unless a field failure is staged). Pages are handed out shuffled, as an
    engine's allocator would; the step can be captured in a CUDA graph."""

    def __init__(self, cfg: Config, writer: nvfp4kv.Cache, reader: nvfp4kv.Cache, device: str):
        pages_per_seq = -(-cfg.max_tokens // cfg.tokens_per_page)
        g = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)
        order = torch.randperm(writer.dims.pages, generator=g)[: cfg.batch * pages_per_seq].to(torch.int32)
        self.cfg, self.writer, self.reader = cfg, writer, reader
        self.table = order.view(cfg.batch, pages_per_seq).contiguous().to(device)  # (batch, pages) int32
        self.slots = torch.zeros(cfg.batch, dtype=torch.int64, device=device)
        self.seq_lens = torch.zeros(cfg.batch, dtype=torch.int32, device=device)
        self.out = torch.zeros(cfg.batch, cfg.q_heads, cfg.head_dim, dtype=torch.bfloat16, device=device)

    def set_position(self, pos: torch.Tensor) -> None:
        """pos (batch,) on the device: the slot each sequence writes and its length."""
        n = self.cfg.tokens_per_page
        self.slots.copy_(self.table.gather(1, (pos // n).view(-1, 1)).view(-1).long() * n + pos % n)
        self.seq_lens.copy_((pos + 1).to(torch.int32))

    def attend(self, layer, q, k, v):
        self.writer.store(k, v, self.slots, layer)
        # One output buffer for every layer: the caller consumes it before the next layer.
        self.reader.decode(q, self.table, self.seq_lens, layer, self.out)
        return self.out


def calibrate(cfg: Config, model: Model, device: str) -> torch.Tensor:
    """Per-layer K and V amax from a separate BF16 run: what an engine's calibration gives."""
    cal = dataclasses.replace(cfg, steps=min(64, cfg.steps), seed=cfg.seed + 100)
    dense = DenseCache(cal, device)
    g = torch.Generator(device="cpu").manual_seed(cal.seed)
    tokens = torch.randint(0, cfg.vocab, (cfg.batch,), generator=g).to(device)
    for t in range(cal.max_tokens):
        dense.t = t
        logits = model.step(tokens, torch.full((cfg.batch,), t, device=device), dense.attend)
        tokens = logits.argmax(-1)
    return dense.amax.cpu()


def make_cache(cfg: Config, layout, amax: torch.Tensor, device: str, buffers=None) -> nvfp4kv.Cache:
    cache = nvfp4kv.Cache(layout, device, buffers=buffers)
    scale = nvfp4kv.reference.recommend_global_scale
    cache.set_global_scales([scale(1.5 * float(a)) for a in amax[:, 0]], [scale(1.5 * float(a)) for a in amax[:, 1]])
    return cache


def run(cfg: Config, model: Model, writer: nvfp4kv.Cache, reader: nvfp4kv.Cache, device: str,
        graph: bool) -> Dict[str, List[float]]:
    """Both models fed the same tokens (the BF16 model's greedy choices:
    teacher forcing), per-step logits compared; plus free-running greedy
    decoding of the nvfp4kv model against the BF16 one."""
    paged = PagedNvfp4(cfg, writer, reader, device)
    writer.reset_status()
    g = torch.Generator(device="cpu").manual_seed(cfg.seed + 7)
    prompt = torch.randint(0, cfg.vocab, (cfg.batch, cfg.prompt), generator=g).to(device)
    tokens = torch.zeros(cfg.batch, dtype=torch.int64, device=device)
    pos = torch.zeros(cfg.batch, dtype=torch.int64, device=device)
    logits_out = torch.zeros(cfg.batch, cfg.vocab, device=device)

    def step():
        paged.set_position(pos)
        logits_out.copy_(model.step(tokens, pos, paged.attend))

    replay = step
    if graph:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: kernels loaded, decode workspace sized
            tokens.copy_(prompt[:, 0])
            step()
        torch.cuda.current_stream().wait_stream(side)
        cuda_graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(cuda_graph):
            step()
        replay = cuda_graph.replay

    def drive(free_running: bool):
        dense = DenseCache(cfg, device)
        series = {"rel_logit_error": [], "max_abs_logit_error": [], "greedy_agree": []}
        fed = prompt[:, 0].clone()
        own = prompt[:, 0].clone()
        for t in range(cfg.max_tokens):
            pos.fill_(t)
            tokens.copy_(own if free_running else fed)
            replay()
            dense.t = t
            ref = model.step(fed, pos, dense.attend)
            got = logits_out.clone()
            if t >= cfg.prompt - 1:
                err = (got - ref).norm(dim=-1) / ref.norm(dim=-1)
                series["rel_logit_error"].append(float(err.mean()))
                series["max_abs_logit_error"].append(float((got - ref).abs().max()))
                series["greedy_agree"].append(float((got.argmax(-1) == ref.argmax(-1)).float().mean()))
            nxt = prompt[:, t + 1] if t + 1 < cfg.prompt else ref.argmax(-1)
            own = prompt[:, t + 1] if t + 1 < cfg.prompt else got.argmax(-1)
            if free_running:
                series.setdefault("same_token", []).append(float((own == nxt).float().mean()))
            fed = nxt
        return series

    forced = drive(False)
    free = drive(True)
    forced["finite"] = [float(torch.isfinite(logits_out).all())]
    forced["free_running_same_token"] = free["same_token"][cfg.prompt - 1:]
    forced["status"] = writer.status()
    return forced


def first_divergence(same: List[float]) -> Optional[int]:
    for i, s in enumerate(same):
        if s < 1.0:
            return i
    return None


def summarize(name: str, s: Dict) -> Dict:
    err = np.array(s["rel_logit_error"])
    return {
        "run": name,
        "rel_logit_error_mean": float(err.mean()),
        "rel_logit_error_p50": float(np.median(err)),
        "rel_logit_error_max": float(err.max()),
        "max_abs_logit_error": float(max(s["max_abs_logit_error"])),
        "greedy_agreement": float(np.mean(s["greedy_agree"])),
        "free_running_first_divergence": first_divergence(s["free_running_same_token"]),
        "free_running_token_agreement": float(np.mean(s["free_running_same_token"])),
        "all_finite": bool(s["finite"][0] == 1.0),
        "status": s["status"],
    }


def experiment(cfg: Config, device: str = "cuda", graph: bool = True) -> Dict:
    """Everything the figures file reports; tests/python/test_integration.py asserts on it."""
    model = Model(cfg, device)
    amax = calibrate(cfg, model, device)
    pages = cfg.batch * -(-cfg.max_tokens // cfg.tokens_per_page) + 7
    dims = dict(layers=cfg.layers, pages=pages, heads=cfg.kv_heads, tokens_per_page=cfg.tokens_per_page,
                head_dim=cfg.head_dim)
    result: Dict = {"config": dataclasses.asdict(cfg), "device": device, "graph": graph,
                    "build": nvfp4kv.build_info, "runs": [], "series": {}}
    if device == "cuda":
        result["gpu"] = torch.cuda.get_device_name()

    def record(name, writer, reader):
        t0 = time.perf_counter()
        s = run(cfg, model, writer, reader, device, graph)
        summary = summarize(name, s)
        summary["seconds"] = time.perf_counter() - t0
        result["runs"].append(summary)
        result["series"][name] = {k: v for k, v in s.items() if k != "status"}

    native = make_cache(cfg, nvfp4kv.plan(layers=cfg.layers, kv_heads=cfg.kv_heads, head_dim=cfg.head_dim,
                                          tokens_per_page=cfg.tokens_per_page, pages=pages), amax, device)
    record("nvfp4kv-native", native, native)

    # The field failure: vLLM's upstream writer swizzles V scales, the SM120 reader reads them linearly.
    writer_layout = nvfp4kv.check(nvfp4kv.load("vllm-legacy-hnd-writer-upstream", **dims))
    reader_layout = nvfp4kv.check(nvfp4kv.load("vllm-legacy-hnd-reader-sm120", **dims))
    report = nvfp4kv.compare(writer_layout, reader_layout)
    result["compare"] = {"summary": report.summary(writer_layout.name, reader_layout.name),
                         "misplaced_per_region": report.misplaced_per_region, "elements": report.elements}
    writer = make_cache(cfg, writer_layout, amax, device)
    record("vllm writer = reader (upstream)", writer, writer)
    forced = make_cache(cfg, reader_layout, amax, device,
                        buffers=[[writer.buffer(i, l) for l in range(cfg.layers)]
                                 for i in range(len(writer_layout.layout.buffers))])
    record("vllm upstream writer, SM120 reader (forced)", writer, forced)

    rejected = {}
    for name in ("vllm-packed-nhd-writer-upstream", "vllm-packed-nhd-reader-sm120"):
        try:
            nvfp4kv.Cache(nvfp4kv.load(name, **dims), device)
            rejected[name] = "accepted"
        except nvfp4kv.LayoutRejected as e:
            rejected[name] = str(e)
    result["packed_nhd"] = rejected
    return result


def markdown(result: Dict) -> str:
    cfg = result["config"]
    lines = [
        "# nvfp4kv from Python: a random transformer decoding with its KV cache in NVFP4",
        "",
        "Written by `tests/python/integration.py` (%s, %s%s)." % (
            result.get("gpu", result["device"]), result["build"], ", decode step as a CUDA graph" if result["graph"] else ""),
        "",
        "Model: %d layers, %d query heads / %d kv heads (GQA), head dim %d, RoPE, vocab %d, random bf16 weights; "
        "batch %d, prompt %d, %d decode steps, %d tokens per page, pages shuffled. Global scales from a separate "
        "calibration run (1.5 x amax / 2688). Teacher-forced: both models read the BF16 model's greedy tokens; "
        "free-running: each its own." % (cfg["layers"], cfg["q_heads"], cfg["kv_heads"], cfg["head_dim"],
                                         cfg["vocab"], cfg["batch"], cfg["prompt"], cfg["steps"],
                                         cfg["tokens_per_page"]),
        "",
        "| run (store / decode) | rel. logit error mean | p50 | max | greedy agreement (forced) | free-running: first divergence | free-running agreement | finite | status |",
        "|---|---:|---:|---:|---:|---:|---:|---|---|",
    ]
    for r in result["runs"]:
        st = r["status"]
        lines.append("| %s | %.4f | %.4f | %.4f | %.1f %% | %s | %.1f %% | %s | stored %d, bad %d |" % (
            r["run"], r["rel_logit_error_mean"], r["rel_logit_error_p50"], r["rel_logit_error_max"],
            100 * r["greedy_agreement"],
            "none" if r["free_running_first_divergence"] is None else "step %d" % r["free_running_first_divergence"],
            100 * r["free_running_token_agreement"], "yes" if r["all_finite"] else "NO",
            st["stored"], st["out_of_range"] + st["bad_pages"] + st["bad_global_scale"] + st["non_finite"]))
    lines += ["", "Before anything ran, `compare` said:", "", "    " + result["compare"]["summary"].replace("\n", "\n    "),
              "", "The vLLM packed NHD pair cannot be turned into a cache:", ""]
    for name, why in result["packed_nhd"].items():
        lines.append("- `%s`: %s" % (name, why))
    series = result["series"]
    lines += ["", "Relative logit error by step (teacher-forced), every 32nd step:", "",
              "| step | " + " | ".join(series) + " |", "|---:|" + "---:|" * len(series)]
    n = len(next(iter(series.values()))["rel_logit_error"])
    for i in sorted(set(range(0, n, 32)) | {n - 1}):
        lines.append("| %d | " % i + " | ".join("%.4f" % s["rel_logit_error"][i] for s in series.values()) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="python-integration.md", help="markdown figures (JSON beside it)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--steps", type=int, default=256)
    ap.add_argument("--no-graph", action="store_true")
    args = ap.parse_args()
    cfg = Config(steps=args.steps)
    result = experiment(cfg, args.device, graph=args.device == "cuda" and not args.no_graph)
    text = markdown(result)
    with open(args.out, "w") as f:
        f.write(text)
    with open(args.out.rsplit(".", 1)[0] + ".json", "w") as f:
        json.dump(result, f, indent=1)
    print(text)


if __name__ == "__main__":
    main()
