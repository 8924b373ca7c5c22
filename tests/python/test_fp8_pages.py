"""FP8 pages from Python: a layout that holds K (or V) as FP8 E4M3, planned, shown and checked;
a CPU Cache over it stores each FP8 byte as an independent E4M3 cast (ml_dtypes) of
x / scale and gives back exactly code * scale; the format must agree with the layout."""
import json

import numpy as np
import pytest

import nvfp4kv
from nvfp4kv import reference

DIMS = dict(layers=2, pages=4, heads=2, tokens_per_page=16, head_dim=64)


def fp8_through(x, scale):
    """E4M3 of x * (1 / scale) in float32, saturating at 448, back times scale: ml_dtypes' cast
    (round to nearest even) after the clamp nvfp4kv's satfinite applies."""
    ml_dtypes = pytest.importorskip("ml_dtypes", reason="the independent E4M3 cast comes from ml_dtypes")
    inv = np.float32(1.0) / np.float32(scale)
    y = np.clip(x.astype(np.float32) * inv, -448.0, 448.0)
    return y.astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * np.float32(scale)


def test_plan_and_load_hold_fp8_sides():
    nv = nvfp4kv.plan(layers=4, kv_heads=8, head_dim=128, pages=10)
    k8 = nvfp4kv.plan(layers=4, kv_heads=8, head_dim=128, pages=10, k_element="fp8_e4m3")
    assert k8.layout.dims.k_element == "fp8_e4m3" and k8.layout.dims.v_element == "nvfp4"
    assert (nv.bytes_per_page_per_layer, k8.bytes_per_page_per_layer) == (8 * 16 * 144, 8 * 16 * 200)
    assert k8.layout.bits_per_value == 6.25
    layout = nvfp4kv.load("nvfp4kv-native", **DIMS, v_element="fp8_e4m3")
    assert "fp8_e4m3" in repr(layout.dims)
    text = json.loads(layout.to_json())
    assert text["elements"] == {"k": "nvfp4", "v": "fp8_e4m3"} and "v_scale" not in text["regions"]
    assert "elements: K nvfp4, V fp8_e4m3" in nvfp4kv.show(layout)
    with pytest.raises(nvfp4kv.ArgumentError, match="v_scale holds nothing"):
        layout.address("v_scale", 0, 0, 0, 0, 0)
    # A layout spelled in NVFP4's row sizes cannot hold FP8 rows: the proof finds the shared bytes.
    with pytest.raises(nvfp4kv.LayoutError, match="share byte"):
        nvfp4kv.check(nvfp4kv.load("nvfp4kv-native-v1", **DIMS, v_element="fp8_e4m3"))
    with pytest.raises(nvfp4kv.ArgumentError, match='k_element: expected "nvfp4" or "fp8_e4m3"'):
        nvfp4kv.plan(layers=1, kv_heads=1, head_dim=64, pages=1, k_element="fp4")
    with pytest.raises(nvfp4kv.LayoutError, match="describe different caches: V elements fp8_e4m3 vs nvfp4"):
        nvfp4kv.compare(layout, nvfp4kv.load("nvfp4kv-native", **DIMS))


def test_a_cpu_cache_stores_fp8_bytes_and_reads_them_back_exactly():
    valid = nvfp4kv.check(nvfp4kv.load("nvfp4kv-native", **DIMS, k_element="fp8_e4m3"))
    cache = nvfp4kv.Cache(valid, "cpu")
    rng = np.random.default_rng(3)
    k = rng.normal(0, 3, size=(40, 2, 64)).astype(np.float32)
    v = rng.normal(0, 1, size=(40, 2, 64)).astype(np.float32)
    k[3, 1, 7] = np.nan
    k_scale = float(np.nanmax(np.abs(k)) / 448)
    cache.set_global_scales(k_scale, 0.003)
    pages = [3, 0, 2]
    slots = np.array([pages[t // 16] * 16 + t % 16 for t in range(40)], np.int64)
    cache.store(k, v, slots, 1)
    assert cache.status()["stored"] == 40 and cache.status()["non_finite"] == 1
    table, cu = np.array([pages], np.int32), np.array([0, 40], np.int32)
    k_out, v_out = np.full_like(k, np.nan), np.full_like(v, np.nan)
    cache.gather(table, cu, 1, k_out, v_out)
    gs = cache.global_scales
    want_k = fp8_through(np.nan_to_num(k, nan=0.0), gs[1, 0])
    np.testing.assert_array_equal(k_out, want_k)
    np.testing.assert_array_equal(v_out, reference.dequantize(*reference.quantize(v, gs[1, 1]), gs[1, 1]))
    # The bytes themselves: token 0 of page 3, head 0 holds K's 64 E4M3 codes in its first row.
    raw = np.asarray(cache.buffer(0, 1))
    span = 16 * 64 + 16 * 32 + 16 * 4  # (page, head): K data plane, V data plane, V scale plane
    ml_dtypes = pytest.importorskip("ml_dtypes")
    codes = raw[3 * 2 * span: 3 * 2 * span + 64].view(ml_dtypes.float8_e4m3fn).astype(np.float32)
    np.testing.assert_array_equal(codes * np.float32(gs[1, 0]), want_k[0, 0])


def test_the_format_must_agree_with_the_layout():
    plain = nvfp4kv.check(nvfp4kv.load("nvfp4kv-native", **DIMS))
    with pytest.raises(nvfp4kv.LayoutError, match=r"format.layers\[1\].k.element: fp8_e4m3, but the layout holds K "
                                                   r"as nvfp4"):
        nvfp4kv.with_format(plain, {"layers": [{}, {"k": {"element": "fp8_e4m3"}}]})
    k8 = nvfp4kv.check(nvfp4kv.load("nvfp4kv-native", **DIMS, k_element="fp8_e4m3"))
    valid = nvfp4kv.with_format(k8, {"layers": [{"k": {"element": "fp8_e4m3", "rotation": 32}}]})
    assert valid.bits_per_value == 6.25
