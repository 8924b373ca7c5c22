"""nvfp4kv.reference from NumPy: the C++ reference's bytes, checked against
the independent ml_dtypes quantizer of crosscheck_mldtypes.py and against the
bytes the reference store writes into a cache."""
import ml_dtypes
import numpy as np
import pytest

import crosscheck_mldtypes as independent
import nvfp4kv
from nvfp4kv import reference


def heavy_tailed(shape, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_t(3, size=shape) * np.exp(rng.normal(0, 1.5, size=shape[:-1] + (1,)))).astype(np.float32)


@pytest.mark.parametrize("rule", ["standard", "4over6"])
@pytest.mark.parametrize("gs", [1.0, 0.0123, 37.5])
def test_quantize_matches_the_ml_dtypes_quantizer(rule, gs):
    x = heavy_tailed((64, 4, 128), seed=3)
    data, scales = reference.quantize(x, gs, rule)
    assert data.shape == (64, 4, 64) and scales.shape == (64, 4, 8)
    assert data.dtype == np.uint8 and scales.dtype == np.uint8
    packed, sf = independent.quantize(x.reshape(-1, 16), np.float32(gs), rule)
    np.testing.assert_array_equal(data.reshape(-1, 8), packed)
    np.testing.assert_array_equal(scales.reshape(-1), sf)


def test_dequantize_is_e2m1_times_scale_times_global():
    x = heavy_tailed((16, 2, 64), seed=5)
    gs = reference.recommend_global_scale(float(np.abs(x).max()))
    assert gs == pytest.approx(np.abs(x).max() / 2688, rel=1e-6)
    data, scales = reference.quantize(x, gs)
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(16, 2, 64)
    e2m1 = codes.astype(np.uint8).view(ml_dtypes.float4_e2m1fn).astype(np.float32)
    sf = scales.view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    expect = (e2m1 * np.repeat(sf, 16, axis=-1)) * np.float32(gs)
    np.testing.assert_array_equal(reference.dequantize(data, scales, gs), expect)
    # the scales as float8_e4m3fn are accepted too, and the view costs no copy
    view = reference.as_e4m3(scales)
    assert view.dtype == ml_dtypes.float8_e4m3fn and np.shares_memory(view, scales)
    np.testing.assert_array_equal(reference.dequantize(data, view, gs), expect)
    rel = np.linalg.norm(expect - x) / np.linalg.norm(x)
    assert 0.02 < rel < 0.2  # NVFP4's error on heavy tails: neither exact nor garbage


def test_bf16_and_fp16_inputs_quantize_as_their_float32_values():
    x = heavy_tailed((8, 2, 32), seed=7)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        narrow = x.astype(dtype)
        d1, s1 = reference.quantize(narrow, 1.0)
        d2, s2 = reference.quantize(narrow.astype(np.float32), 1.0)
        np.testing.assert_array_equal(d1, d2)
        np.testing.assert_array_equal(s1, s2)


def test_non_finite_elements_are_stored_as_zero():
    x = np.full((1, 1, 16), 3.0, np.float32)  # scale e4m3(3 / 6) = 0.5: exact
    x[0, 0, 3], x[0, 0, 4] = np.nan, np.inf
    back = reference.dequantize(*reference.quantize(x, 1.0), 1.0)
    assert back[0, 0, 3] == 0 and back[0, 0, 4] == 0 and back[0, 0, 0] == 3.0


def test_the_reference_store_writes_the_same_bytes():
    # A token-major layout with linear scales: its buffers are the dense quantization.
    layout = nvfp4kv.load("attention-rs", layers=1, pages=4, heads=2, tokens_per_page=16, head_dim=64)
    cache = nvfp4kv.Cache(layout, "cpu")
    gs = 0.01
    cache.set_global_scales(gs, gs)
    k, v = heavy_tailed((64, 2, 64), 11), heavy_tailed((64, 2, 64), 12)
    cache.store(k, v, np.arange(64, dtype=np.int64), 0)
    names = [b.name for b in layout.buffers]
    for side, x in (("k", k), ("v", v)):
        data, scales = reference.quantize(x, gs)
        np.testing.assert_array_equal(cache.buffer(names.index(side + "_fp4"), 0)[: data.size], data.reshape(-1))
        np.testing.assert_array_equal(cache.buffer(names.index(side + "_sf"), 0)[: scales.size], scales.reshape(-1))


@pytest.mark.parametrize("call, message", [
    (lambda: reference.quantize(np.zeros((2, 16), np.float32), 1.0), "x: expected shape"),
    (lambda: reference.quantize(np.zeros((1, 1, 16), np.int32), 1.0), "x: expected float32"),
    (lambda: reference.quantize(np.zeros((1, 1, 16), np.float32), 0.0), "global scale"),
    (lambda: reference.quantize(np.zeros((1, 1, 24), np.float32), 1.0), "16"),
    (lambda: reference.quantize(np.zeros((1, 1, 16), np.float32), 1.0, "nearest"), "rule"),
    (lambda: reference.dequantize(np.zeros((1, 1, 8), np.uint8), np.zeros((1, 1, 2), np.uint8), 1.0), "scales: expected shape"),
    (lambda: reference.dequantize(np.zeros((1, 1, 8), np.float32), np.zeros((1, 1, 1), np.uint8), 1.0), "data: expected uint8"),
    (lambda: reference.dequantize(np.zeros((1, 1, 8), np.uint8), np.zeros((1, 1, 1), np.uint8), -1.0), "global_scale"),
])
def test_reference_argument_errors(call, message):
    with pytest.raises(nvfp4kv.Error, match=message):
        call()
