"""bench/transformers: what the accuracy table rests on. plot.py makes its table from a committed
results file; accuracy.py's PolicyCache (a calibration's per-layer policy simulated in a
DynamicCache, for the FP8 layers that layouts cannot place yet) holds, in its NVFP4 layers, exactly
what nvfp4kv's KVCache stores and reads back."""
import json
import pathlib
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "transformers"))
sys.path.insert(0, str(ROOT / "tests" / "python"))


def test_the_table_is_made_from_a_results_file():
    import plot
    r = json.loads((ROOT / "bench/results/2026-12-03-accuracy-modes.json").read_text())
    text = plot.table(r)
    assert "| nvfp4kv NVFP4, global scale 1.0 | 4.50 | 6480 | 19.600 | +6.23 % | 0.0656 | 0.376 | 86.4 % |" in text
    assert "| BF16 KV (reference) | 16.00 |" in text
    r["dtype"] = "float32"
    assert "| FP32 KV, unquantized (reference) | 16.00 |" in plot.table(r)


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_the_simulated_policy_is_what_the_cache_stores(family):
    torch = pytest.importorskip("torch", reason="the harness runs models in PyTorch")
    pytest.importorskip("transformers", reason="the harness runs transformers models")
    import accuracy
    import nvfp4kv.transformers as nt
    from test_transformers import batch, relative_gap, run, tiny

    model = tiny(family)
    layers, heads, dim = nt._kv_dims(model.config)
    g = np.random.default_rng(3)
    # Every transform somewhere: 4over6 + rotation + mu in layer 0, rotation of 32 in layer 1's V.
    cal = {"format": {"nvfp4kv_format": 1,
                      "layers": [{"k": {"element": "nvfp4", "rule": "4over6", "rotation": "head"},
                                  "v": {"element": "nvfp4", "rule": "4over6", "rotation": "head"}},
                                 {"k": {"element": "nvfp4", "rule": "standard", "rotation": "none"},
                                  "v": {"element": "nvfp4", "rule": "standard", "rotation": 32}}],
                      "k_mean": (np.concatenate([g.standard_normal((1, heads, dim)) * 0.3,
                                                 np.zeros((1, heads, dim))]).astype(np.float32).ravel().tolist())},
           "per_layer": [{"k_global_scale": 0.004, "v_global_scale": 0.003}] * layers}
    ids, mask = batch(model.config.vocab_size, [40], 0)
    chunks = [24, 8, 1, 1, 1, 1, 1, 1, 1, 1]
    got = run(model, accuracy.PolicyCache(model.config, cal), "eager", ids, mask, chunks)
    fmt = dict(cal["format"], k_mean=np.asarray(cal["format"]["k_mean"], np.float32).reshape(layers, heads, dim))
    cache = nt.KVCache(model.config, max_tokens=64, device="cpu", format=fmt, global_scales=(0.004, 0.003))
    want = run(model, cache, nt.NAME, ids, mask, chunks)
    assert relative_gap(got, want, mask) < 1e-5
    # FP8 in a layer moves the logits: the policy's elements are honoured.
    cal["format"]["layers"][1]["k"]["element"] = "fp8_e4m3"
    moved = run(model, accuracy.PolicyCache(model.config, cal), "eager", ids, mask, chunks)
    assert relative_gap(moved, want, mask) > 1e-3
    # ... and the cache now stores them: layer 1's K in its own FP8 pages reads back as simulated.
    fmt["layers"][1]["k"]["element"] = "fp8_e4m3"
    mixed = nt.KVCache(model.config, max_tokens=64, device="cpu", format=fmt, global_scales=(0.004, 0.003))
    assert len(mixed.writers) == 2
    assert relative_gap(moved, run(model, mixed, nt.NAME, ids, mask, chunks), mask) < 1e-5
