"""The CPU reference for NumPy arrays: NVFP4 quantization of dense
(tokens, heads, D) tensors, bit for bit what the kernels store.

Data bytes hold two E2M1 codes each, element 2j in the low nibble of byte j;
scales are E4M3 ("fn") bytes, one per 16 elements; ``global_scale`` is the
dequant multiplier (x ~= e2m1 * scale * global_scale, docs/format.md)."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from . import _core


def quantize(x: Any, global_scale: float, rule: str = "standard") -> Tuple[np.ndarray, np.ndarray]:
    """Quantize ``x`` (tokens, heads, D) float32, float16 or bfloat16 on the CPU
    (NumPy, ml_dtypes, or any CPU DLPack array; D a multiple of 16).

    Returns ``(data, scales)``: data (tokens, heads, D/2) uint8, scales
    (tokens, heads, D/16) uint8 E4M3 codes (``as_e4m3`` views them as floats).
    ``rule`` is "standard" (scale = amax / 6) or "4over6" (also tries amax / 4 and
    keeps the smaller squared error). NaN and Inf elements are stored as +0.
    """
    if isinstance(x, np.ndarray) and x.dtype.name == "bfloat16":  # ml_dtypes: exact in float32
        x = x.astype(np.float32)
    if isinstance(x, np.ndarray):
        x = np.ascontiguousarray(x)
    data, scales, _ = _core.quantize(x, float(global_scale), rule)
    return data, scales


def dequantize(data: Any, scales: Any, global_scale: float) -> np.ndarray:
    """(tokens, heads, D/2) uint8 data and (tokens, heads, D/16) uint8 (or
    float8_e4m3fn) scales back to (tokens, heads, D) float32: e2m1 * scale *
    global_scale, rounded once."""
    if isinstance(scales, np.ndarray) and scales.dtype.name == "float8_e4m3fn":
        scales = scales.view(np.uint8)
    return _core.dequantize(data, scales, float(global_scale))


def recommend_global_scale(amax: float) -> float:
    """amax / (448 * 6): the largest block then uses the largest E4M3 scale."""
    return _core.recommend_global_scale(float(amax))


def as_e4m3(scales: Any) -> Any:
    """A view of uint8 E4M3 codes as float8_e4m3fn: torch.float8_e4m3fn for a
    torch tensor, ml_dtypes.float8_e4m3fn for a NumPy array. No copy."""
    if type(scales).__module__.startswith("torch"):
        import torch

        return scales.view(torch.float8_e4m3fn)
    import ml_dtypes

    return np.asarray(scales).view(ml_dtypes.float8_e4m3fn)
