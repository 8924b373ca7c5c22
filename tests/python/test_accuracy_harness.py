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


def test_the_rotated_k_simulation_with_the_hadamard_is_what_the_cache_stores():
    # The k-*-sim rows' machinery: with R the whole-head Hadamard it must hold what KVCache stores
    # for K - mu rotated by the head's Hadamard with 4over6 (and V as that row's format), so the
    # PCA rows differ from the cache's own control by R alone.
    torch = pytest.importorskip("torch", reason="the harness runs models in PyTorch")
    pytest.importorskip("transformers", reason="the harness runs transformers models")
    import accuracy
    import nvfp4kv.transformers as nt
    from test_transformers import batch, relative_gap, run, tiny

    model = tiny("llama")
    layers, heads, dim = nt._kv_dims(model.config)
    g = np.random.default_rng(5)
    mu = (g.standard_normal((layers, heads, dim)) * 0.3).astype(np.float32)
    r = accuracy.k_rotations("hadamard", mu, None)
    cache = accuracy.RotatedKCache(model.config, mu, r, [0.004] * layers, [0.003] * layers)
    ids, mask = batch(model.config.vocab_size, [40], 0)
    chunks = [24, 8, 1, 1, 1, 1, 1, 1, 1, 1]
    got = run(model, cache, "eager", ids, mask, chunks)
    side = {"rule": "4over6", "rotation": "head"}
    stored = nt.KVCache(model.config, max_tokens=64, device="cpu", format={"layers": [{"k": side, "v": side}], "k_mean": mu},
                        global_scales=(0.004, 0.003))
    want = run(model, stored, nt.NAME, ids, mask, chunks)
    gap = relative_gap(got, want, mask)
    # The simulation rotates in float64 and the writer in float32 butterflies; measured 3.6e-7 apart
    # (a code rounding the other way would show as ~1e-4). Without mu the gap is ~0.09.
    no_mu = run(model, accuracy.RotatedKCache(model.config, 0 * mu, r, [0.004] * layers, [0.003] * layers),
                "eager", ids, mask, chunks)
    print("hadamard simulation vs the cache: %.3g; mu left out: %.3g" % (gap, relative_gap(no_mu, want, mask)))
    assert gap < 1e-5 and relative_gap(no_mu, want, mask) > 1e-2


def test_the_principal_axes_are_orthonormal_and_sorted():
    import accuracy
    g = np.random.default_rng(7)
    a = g.standard_normal((2, 3, 32, 32))
    cov = np.einsum("lhij,lhkj->lhik", a, a)  # symmetric positive definite per (layer, head)
    mu = np.zeros((2, 3, 32))
    for kind in ("pca", "pca-h16"):
        r = accuracy.k_rotations(kind, mu, cov)
        for layer in range(2):
            for head in range(3):
                assert np.allclose(r[layer, head].T @ r[layer, head], np.eye(32), atol=1e-12)
    d = np.einsum("lhdi,lhde,lhej->lhij", accuracy.k_rotations("pca", mu, cov), cov, accuracy.k_rotations("pca", mu, cov))
    diag = np.diagonal(d, axis1=2, axis2=3)
    assert np.allclose(d - np.einsum("lhi,ij->lhij", diag, np.eye(32)), 0, atol=1e-8 * np.abs(d).max())
    assert (np.diff(diag, axis=2) <= 1e-9).all()  # variances in decreasing order


def test_the_query_aware_channel_scales_balance_k_spread_against_query_energy():
    import accuracy
    g = np.random.default_rng(11)
    a = g.standard_normal((1, 2, 32, 32))
    cov = np.einsum("lhij,lhkj->lhik", a, a)
    mu = np.zeros((1, 2, 32))
    var = np.diagonal(cov, axis1=2, axis2=3)
    q_energy = g.uniform(0.1, 10.0, (1, 2, 32))
    lam = 1 / np.diagonal(accuracy.k_rotations("qscale", mu, cov, q_energy), axis1=2, axis2=3)
    ratio = lam ** 4 * q_energy / var  # lambda^4 proportional to var / E[q^2] (lambda in float32, as the format holds it)
    assert np.allclose(ratio, ratio[..., :1], rtol=1e-6)
    assert np.allclose(np.log(lam).mean(axis=2), 0, atol=1e-6)  # geometric mean 1
    assert np.allclose(lam, accuracy.channel_scale(cov, q_energy), rtol=1e-12)
    # Where the query energy follows K's spread every scale is 1: the Hadamard control.
    same = accuracy.k_rotations("qscale-hadamard", mu, cov, 7 * var)
    assert np.allclose(same, accuracy.k_rotations("hadamard", mu, cov), atol=1e-6)


def test_the_query_scaled_k_simulation_is_what_the_cache_format_stores():
    # k-qscale-hadamard-sim (R = diag(1 / lambda) H) against KVCache over the format that holds
    # lambda as k_channel_scale (nvfp4-qscale): the same K rows give the same K back, so the
    # simulated rows are the format's own. (Compared per layer on the same rows: through a whole
    # model, float32 eager attention against the cache's float64 attention moves a later layer's
    # K by an ulp, and a 4over6 block that flips then moves the logits by ~1e-2.)
    torch = pytest.importorskip("torch", reason="the harness runs models in PyTorch")
    pytest.importorskip("transformers", reason="the harness runs transformers models")
    import accuracy
    import nvfp4kv.transformers as nt
    from test_transformers import tiny

    model = tiny("llama")
    layers, heads, dim = nt._kv_dims(model.config)
    g = np.random.default_rng(6)
    mu = (g.standard_normal((layers, heads, dim)) * 0.3).astype(np.float32)
    a = g.standard_normal((layers, heads, dim, dim))
    cov = np.einsum("lhij,lhkj->lhik", a, a) / dim
    q_energy = np.exp(g.uniform(-4.0, 4.0, (layers, heads, dim)))  # queries of very unequal energy per channel
    lam = accuracy.channel_scale(cov, q_energy)
    assert lam.min() < 0.6 and lam.max() > 1.6  # scales that matter
    sim = accuracy.RotatedKCache(model.config, mu, accuracy.k_rotations("qscale-hadamard", mu, cov, q_energy),
                                 [0.004] * layers, [0.003] * layers)
    side = {"rule": "4over6", "rotation": "head"}
    fmt = {"layers": [{"k": side, "v": side}], "k_mean": mu, "k_channel_scale": lam}
    without = {"layers": [{"k": side, "v": side}], "k_mean": mu}
    k = torch.from_numpy(g.standard_normal((1, heads, 48, dim)).astype(np.float32)) * 0.5
    for layer in range(layers):
        want = sim.k_through(k, layer)
        got, apart = [], []
        for f, out in ((fmt, got), (without, apart)):
            cache = nt.KVCache(model.config, max_tokens=64, device="cpu", format=f, global_scales=(0.004, 0.003))
            for l in range(layers):
                cache.update(k, k, l)
            out.append(cache.gather(layer, torch.float32)[0])
        gap = float((got[0] - want).abs().max() / want.abs().max())
        print("layer %d: qscale simulation vs the cache format %.3g, the format without lambda %.3g"
              % (layer, gap, float((apart[0] - want).abs().max() / want.abs().max())))
        assert gap < 1e-6  # an ulp where float32 steps round apart; a flipped code would be ~1e-2
        assert float((apart[0] - want).abs().max() / want.abs().max()) > 1e-2
