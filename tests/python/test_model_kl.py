"""Model-level sensitivity in nvfp4kv.transformers.calibrate (docs/calibration.md): a layer's
k_model_kl (v_model_kl) is the model's mean next-token KL divergence from its exact-K/V self when
only that layer's K (V) goes through its best NVFP4 mode; the policy spends FP8 on K, then V, of
the layers where it is largest; version-1 files (no model KL) still load."""
import json

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="nvfp4kv.transformers needs PyTorch")
transformers = pytest.importorskip("transformers", reason="nvfp4kv.transformers needs transformers")

import nvfp4kv  # noqa: E402
import nvfp4kv.transformers as nt  # noqa: E402
from test_transformers import tiny  # noqa: E402

FP8_STEP = (8.0 - 4.5) / 2  # bits per value one FP8 tensor of one layer adds


class OneSideQuantized(transformers.DynamicCache):
    """Layer `layer`'s K (side "k") or V ("v") through the calibration's format of that layer (as
    the cache would give it back); everything else exact."""

    def __init__(self, config, cal, layer, side):
        super().__init__(config=config)
        layers, heads, dim = nt._kv_dims(config)
        self.layer, self.which, self.fmt = layer, side, cal["format"]["layers"][layer][side]
        mean = cal["format"].get("k_mean")
        self.mu = np.asarray(mean, np.float32).reshape(layers, heads, dim)[layer] if mean and side == "k" else None
        self.scale = cal["per_layer"][layer]["%s_global_scale" % side]

    def update(self, k, v, layer_idx, *args, **kwargs):
        if layer_idx == self.layer and self.which == "k":
            k = nt._through_format(k, self.fmt, self.scale, self.mu)
        if layer_idx == self.layer and self.which == "v":
            v = nt._through_format(v, self.fmt, self.scale)
        return super().update(k, v, layer_idx, *args, **kwargs)


class AllButOneQuantized(transformers.DynamicCache):
    """Every layer's K and V through the calibration's format of that layer except layer `layer`'s
    K (side "k") or V ("v"), which stays exact (layer None: every side quantized)."""

    def __init__(self, config, cal, layer, side):
        super().__init__(config=config)
        layers, heads, dim = nt._kv_dims(config)
        self.keep, self.cal = (layer, side), cal
        mean = cal["format"].get("k_mean")
        self.mu = np.asarray(mean, np.float32).reshape(layers, heads, dim) if mean else None

    def update(self, k, v, layer_idx, *args, **kwargs):
        fmt, scales = self.cal["format"]["layers"][layer_idx], self.cal["per_layer"][layer_idx]
        if self.keep != (layer_idx, "k"):
            k = nt._through_format(k, fmt["k"], scales["k_global_scale"], None if self.mu is None else self.mu[layer_idx])
        if self.keep != (layer_idx, "v"):
            v = nt._through_format(v, fmt["v"], scales["v_global_scale"])
        return super().update(k, v, layer_idx, *args, **kwargs)


def kl_of(cal):
    return {side: [layer["%s_model_kl" % side] for layer in cal["per_layer"]] for side in "kv"}


def direct_kl(model, ids, cache, chunk):
    """Mean KL(P_exact || P_cache) of the next-token distributions over ids, through torch's kl_div
    in float64. In calibrate's chunks: K computed in other chunks differs in its last bits, and a
    value near a rounding boundary then lands on the other NVFP4 step (2.7e-4 of layer 1's KL
    apart on the tiny Llama in one pass of 80 tokens against chunks of 40)."""
    with torch.no_grad():
        exact = transformers.DynamicCache(config=model.config)
        ref = torch.cat([model(ids[None, s:s + chunk], past_key_values=exact).logits[0].double()
                         for s in range(0, ids.numel(), chunk)])
        got = torch.cat([model(ids[None, s:s + chunk], past_key_values=cache).logits[0].double()
                         for s in range(0, ids.numel(), chunk)])
    return float(torch.nn.functional.kl_div(torch.log_softmax(got, -1), torch.log_softmax(ref, -1),
                                            log_target=True, reduction="batchmean"))


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_model_kl_is_the_kl_of_the_model_with_only_that_side_quantized(family):
    model = tiny(family)
    ids = np.random.default_rng(11).integers(1, 96, 96)
    cal = nt.calibrate(model, ids, samples=96, chunk=40, model_kl=True, kl_tokens=80, progress=False)
    kl = kl_of(cal)
    assert all(k > 1e-6 for side in "kv" for k in kl[side]), kl  # NVFP4 moves this model's logits everywhere
    first = torch.from_numpy(ids[:80])
    for layer in range(2):
        for side in "kv":
            want = direct_kl(model, first, OneSideQuantized(model.config, cal, layer, side), 40)
            assert abs(kl[side][layer] - want) < 1e-6 * want, (layer, side, kl[side][layer], want)
    # Measured on other tokens (all 96), or another side or layer quantized, the figure differs.
    assert abs(direct_kl(model, torch.from_numpy(ids), OneSideQuantized(model.config, cal, 0, "k"), 40)
               - kl["k"][0]) > 1e-3 * kl["k"][0]
    assert abs(kl["k"][1] - kl["k"][0]) > 1e-3 * kl["k"][0] and abs(kl["v"][0] - kl["k"][0]) > 1e-3 * kl["k"][0]


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_saved_is_what_one_exact_side_saves_with_every_other_side_quantized(family):
    model = tiny(family)
    ids = np.random.default_rng(17).integers(1, 96, 96)
    cal = nt.calibrate(model, ids, samples=96, chunk=40, model_kl="saved", kl_tokens=80, progress=False)
    kl, first = kl_of(cal), torch.from_numpy(ids[:80])
    everything = direct_kl(model, first, AllButOneQuantized(model.config, cal, None, None), 40)
    assert everything > 1e-4, everything
    for layer in range(2):
        for side in "kv":
            want = max(everything - direct_kl(model, first, AllButOneQuantized(model.config, cal, layer, side), 40), 0.0)
            assert abs(kl[side][layer] - want) < 1e-6 * everything, (layer, side, kl[side][layer], want)
    # Not the same figure as a side quantized alone ("alone", model_kl=True).
    alone = kl_of(nt.calibrate(model, ids, samples=96, chunk=40, model_kl=True, kl_tokens=80, progress=False))
    assert any(abs(alone[s][l] - kl[s][l]) > 1e-3 * everything for s in "kv" for l in range(2)), (alone, kl)
    with pytest.raises(ValueError, match=r"model_kl: False, True \(.alone.\) or .saved., got 'both'"):
        nt.calibrate(model, ids, samples=96, model_kl="both")


def test_a_side_kept_exactly_has_no_model_kl():
    model = tiny("llama")
    with torch.no_grad():  # layer 1's K is all zero: every mode stores it exactly
        model.model.layers[1].self_attn.k_proj.weight.zero_()
    ids = np.random.default_rng(12).integers(1, 96, 64)
    cal = nt.calibrate(model, ids, samples=64, chunk=24, bits=4.5 + FP8_STEP / 2, model_kl=True, progress=False)
    kl = kl_of(cal)
    assert kl["k"][1] < 1e-12 and kl["k"][0] > 1e-6 and kl["v"][1] > 1e-6, kl
    # The one FP8 K the budget buys goes to layer 0, the layer whose K costs the model.
    assert [layer["k"]["element"] for layer in cal["format"]["layers"]] == ["fp8_e4m3", "nvfp4"]


def test_the_policy_spends_fp8_on_the_largest_model_kl_within_the_budget(tmp_path):
    model = tiny("qwen3")
    ids = np.random.default_rng(13).integers(1, 96, 64)
    seen = {}
    real = nvfp4kv.calibrate

    def spy(arrays, **kw):
        seen.update(arrays)
        return real(arrays, **kw)

    try:
        nvfp4kv.calibrate = spy
        cal = nt.calibrate(model, ids, samples=64, chunk=32, bits=4.5 + FP8_STEP / 2, model_kl=True, progress=False)
    finally:
        nvfp4kv.calibrate = real
    kl = kl_of(cal)
    fp8_k = [layer["k"]["element"] == "fp8_e4m3" for layer in cal["format"]["layers"]]
    assert fp8_k == [kl["k"][0] > kl["k"][1], kl["k"][1] >= kl["k"][0]]
    # The same samples with the ranking reversed (a given model KL) put the FP8 K on the other
    # layer, whatever the attention errors say; without a model KL the attention error decides.
    for given in ([1.0, 0.0], [0.0, 1.0]):
        other = real(seen, bits=4.5 + FP8_STEP / 2, model_kl={"k": given, "v": given[::-1]})
        assert [layer["k"]["element"] for layer in other["format"]["layers"]] == \
            ["fp8_e4m3" if g else "nvfp4" for g in given]
        assert kl_of(other) == {"k": given, "v": given[::-1]}
    plain = real(seen, bits=4.5 + FP8_STEP / 2)
    errors = [layer["errors"][layer["best_mode"]] for layer in plain["per_layer"]]
    assert kl_of(plain) == {"k": [None, None], "v": [None, None]}
    assert [layer["k"]["element"] == "fp8_e4m3" for layer in plain["format"]["layers"]] == \
        [errors[0] >= errors[1], errors[1] > errors[0]]
    # Every budget is respected; FP8 K in the order of K's model KL, then V in the order of V's.
    given = {"k": [0.2, 0.7], "v": [0.5, 0.1]}
    order = [(1, "k"), (0, "k"), (0, "v"), (1, "v")]
    for bits, fp8 in ((4.5, 0), (5.3, 0), (5.375, 1), (6.25, 2), (7.0, 2), (7.125, 3), (8.0, 4)):
        c = real(seen, bits=bits, model_kl=given)
        assert c["bits_per_value"] <= bits + 1e-9 and c["bits_per_value"] == 4.5 + FP8_STEP * fp8 / 2, bits
        assert {(layer, side) for layer in range(2) for side in "kv"
                if c["format"]["layers"][layer][side]["element"] == "fp8_e4m3"} == set(order[:fp8]), bits
    with pytest.raises(nvfp4kv.ArgumentError, match=r"model_kl.k: 1 values for 2 layers"):
        real(seen, bits=5, model_kl={"k": [0.1], "v": [0.1, 0.2]})
    with pytest.raises(nvfp4kv.ArgumentError, match=r"model_kl.v: 0 values for 2 layers"):
        real(seen, bits=5, model_kl={"k": [0.1, 0.2], "v": []})
    with pytest.raises(nvfp4kv.ArgumentError, match=r"model_kl.v\[1\]: a KL divergence"):
        real(seen, bits=5, model_kl={"k": [0.1, 0.2], "v": [0.1, -1.0]})
    with pytest.raises(nvfp4kv.ArgumentError, match=r"model_kl.k\[0\]: a KL divergence"):
        real(seen, bits=5, model_kl={"k": [float("nan"), 0.1], "v": [0.1, 0.2]})
    with pytest.raises(nvfp4kv.ArgumentError, match=r"model_kl: a mapping"):
        real(seen, bits=5, model_kl=[0.1, 0.2])


def test_model_kl_off_and_bad_kl_tokens(capsys):
    model = tiny("llama")
    ids = np.random.default_rng(14).integers(1, 96, 64)
    for bad in (8, 65):  # refused before the model runs: no progress line yet
        with pytest.raises(ValueError, match=r"kl_tokens must be in \[16, samples = 64\], got %d" % bad):
            nt.calibrate(model, ids, samples=64, model_kl=True, kl_tokens=bad)
        assert "nvfp4kv calibrate" not in capsys.readouterr().err
    off = nt.calibrate(model, ids, samples=64, chunk=32, progress=False)  # the default: no model KL
    assert kl_of(off) == {"k": [None, None], "v": [None, None]}
    on = nt.calibrate(model, ids, samples=64, chunk=32, model_kl=True, kl_tokens=32)
    assert "nvfp4kv calibrate: [####################] 2/2 layers: model KL of K and V" in capsys.readouterr().err
    assert all(k > 0 for side in "kv" for k in kl_of(on)[side])
    # The rest of the file is what it was without the model KL.
    assert [layer["errors"] for layer in on["per_layer"]] == [layer["errors"] for layer in off["per_layer"]]


def test_version_1_files_still_load_and_version_2_is_checked(tmp_path):
    g = np.random.default_rng(15)
    samples = {"%s_%d" % (t, layer): g.standard_normal((64, 2, 64)).astype(np.float32) for layer in (0, 1) for t in "kv"}
    cal = nvfp4kv.calibrate(samples, bits=4.5, model_kl={"k": [0.03, 0.01], "v": [0.002, 0.004]})
    assert cal["nvfp4kv_calibration"] == 2 and kl_of(cal) == {"k": [0.03, 0.01], "v": [0.002, 0.004]}
    old = json.loads(json.dumps(cal))
    old["nvfp4kv_calibration"] = 1
    for layer in old["per_layer"]:
        del layer["k_model_kl"], layer["v_model_kl"]
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(old))
    back = nvfp4kv.load_calibration(str(path), layers=2, kv_heads=2, head_dim=64)
    assert kl_of(back) == {"k": [None, None], "v": [None, None]}
    assert back["format"] == cal["format"] and back["nvfp4kv_calibration"] == 2
    cache = nt.KVCache(nt_config(), max_tokens=64, device="cpu", calibration=str(path))  # a version-1 file serves a cache
    assert cache.writer.global_scales[0][0] == cal["per_layer"][0]["k_global_scale"]

    def refused(change, match):
        doc = json.loads(json.dumps(cal))
        change(doc)
        path.write_text(json.dumps(doc))
        with pytest.raises(nvfp4kv.LayoutError, match=match):
            nvfp4kv.load_calibration(str(path))

    refused(lambda d: d["per_layer"][0].pop("k_model_kl"), r"per_layer\[0\]: \"k_model_kl\" is required")
    refused(lambda d: d["per_layer"][1].update(v_model_kl=None), r"per_layer\[1\]: k_model_kl and v_model_kl measured on some")
    refused(lambda d: [e.update(k_model_kl=None, v_model_kl=None) for e in d["per_layer"][1:]],
            r"per_layer\[1\]: k_model_kl and v_model_kl measured on some")
    refused(lambda d: d["per_layer"][0].update(k_model_kl=-0.5), r"per_layer\[0\].k_model_kl: a KL divergence is >= 0")
    refused(lambda d: d["per_layer"][0].update(v_model_kl="0.1"), r"per_layer\[0\].v_model_kl: expected a finite number")
    refused(lambda d: d.update(nvfp4kv_calibration=3), r"version 3 is not one this build reads \(1 to 2\)")
    refused(lambda d: d.update(nvfp4kv_calibration=1), r"per_layer\[0\]: unknown key \"k_model_kl\"")


def nt_config():
    """A config of the sizes test_version_1_files_still_load's samples have: 2 layers, 2 KV heads, D 64."""
    return transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=2,
                                    num_attention_heads=2, num_key_value_heads=2, head_dim=64)


def test_model_kl_on_the_command_line(tmp_path, capsys):
    model = tiny("qwen3")
    model.save_pretrained(tmp_path / "model")
    np.save(tmp_path / "ids.npy", np.random.default_rng(16).integers(1, 96, 80))
    out = tmp_path / "cal.json"
    args = ["calibrate", "--model", str(tmp_path / "model"), "--tokens", str(tmp_path / "ids.npy"), "--samples", "64",
            "--chunk", "32", "--out", str(out)]
    assert nt.main(args + ["--model-kl", "--kl-tokens", "32"]) == 0
    printed = capsys.readouterr()
    assert "on 32 tokens (5 forward passes)" in printed.err and "model KL K " in printed.out
    assert all(k > 0 for side in "kv" for k in kl_of(nvfp4kv.load_calibration(str(out)))[side])
    assert nt.main(args) == 0  # the default: no model KL
    assert "model KL" not in capsys.readouterr().out
    assert kl_of(json.loads(out.read_text())) == {"k": [None, None], "v": [None, None]}
