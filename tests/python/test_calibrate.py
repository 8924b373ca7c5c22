"""nvfp4kv calibrate (CLI and Python): K/V samples per layer in, a versioned calibration file out
(docs/calibration.md); shapes checked by name, malformed or mismatched files refused with nothing
written or changed, and KVCache(calibration=) takes the format and global scales from it."""
import json
import os
import shutil
import subprocess
import sysconfig

import numpy as np
import pytest

import nvfp4kv


def samples(layers=3, tokens=128, heads=2, dim=64, seed=0):
    g = np.random.default_rng(seed)
    out = {}
    for l in range(layers):
        k = g.standard_normal((tokens, heads, dim)).astype(np.float32)
        if l == 1:
            k[:, :, 5] *= 40  # an outlier channel: rotation should measure best here
        out["k_%d" % l] = k
        out["v_%d" % l] = g.standard_normal((tokens, heads, dim)).astype(np.float32)
    return out


def bf16_bits(x):
    """float32 -> bf16 bit patterns (round to nearest even) as uint16, and the values they hold."""
    u = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    bits = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)
    return bits, (bits.astype(np.uint32) << 16).view(np.float32)


def write_safetensors(path, tensors, header_extra=None):
    """A .safetensors file written by hand (the format: an 8-byte little-endian header length, a
    JSON header of dtype, shape and data offsets per tensor, the data): {name: (dtype, array)}."""
    header, blobs, at = {"__metadata__": {"by": "test"}}, [], 0
    for name, (dtype, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape), "data_offsets": [at, at + len(raw)]}
        blobs.append(raw)
        at += len(raw)
    header.update(header_extra or {})
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def cli():
    exe = os.path.join(sysconfig.get_path("scripts"), "nvfp4kv")
    return exe if os.path.exists(exe) else shutil.which("nvfp4kv")


def test_python_calibration_is_versioned_checked_and_respects_the_budget(tmp_path):
    out = tmp_path / "cal.json"
    cal = nvfp4kv.calibrate(samples(), bits=5.2, out=str(out))
    assert cal["nvfp4kv_calibration"] == 2 and (cal["layers"], cal["kv_heads"], cal["head_dim"]) == (3, 2, 64)
    assert cal["bits_per_value"] <= 5.2 and len(cal["k_mean"]) == 3 * 2 * 64
    assert "rotation" in cal["per_layer"][1]["best_mode"]
    fp8 = [i for i, l in enumerate(cal["format"]["layers"]) if l["k"]["element"] == "fp8_e4m3"]
    worst = max(range(3), key=lambda i: cal["per_layer"][i]["errors"][cal["per_layer"][i]["best_mode"]])
    assert fp8 == [worst]  # 3 layers: one FP8 K gives 5.08 bits, a second would make 5.67
    assert json.loads(out.read_text()) == cal
    again = nvfp4kv.load_calibration(str(out), layers=3, kv_heads=2, head_dim=64)
    assert again == cal
    with pytest.raises(nvfp4kv.ArgumentError, match="the calibration is for 2 kv heads, the cache has 4"):
        nvfp4kv.load_calibration(str(out), layers=3, kv_heads=4, head_dim=64)


def test_bad_samples_and_files_are_refused_and_nothing_is_written(tmp_path):
    out = tmp_path / "cal.json"
    bad = samples()
    bad["v_2"] = bad["v_2"][:, :, :32]
    with pytest.raises(nvfp4kv.ArgumentError, match=r"v_2 has shape \(128, 2, 32\), k_0 has \(128, 2, 64\)"):
        nvfp4kv.calibrate(bad, out=str(out))
    missing = samples()
    del missing["v_1"]
    with pytest.raises(nvfp4kv.ArgumentError, match="missing v_1"):
        nvfp4kv.calibrate(missing, out=str(out))
    with pytest.raises(nvfp4kv.ArgumentError, match=r"--bits: a budget of bits per value in \[4.5, 8\]"):
        nvfp4kv.calibrate(samples(), bits=4.0, out=str(out))
    assert not out.exists()
    good = tmp_path / "good.json"
    nvfp4kv.calibrate(samples(), out=str(good))
    doc = json.loads(good.read_text())
    for change, field in [(lambda d: d.update(nvfp4kv_calibration=3), "calibration.nvfp4kv_calibration: version 3"),
                          (lambda d: d["per_layer"].pop(), "calibration.per_layer: expected an array of 3 layers"),
                          (lambda d: d.update(extra=1), 'unknown key "extra"'),
                          (lambda d: d["k_mean"].pop(), r"calibration.k_mean: expected \(layers 3")]:
        broken = json.loads(json.dumps(doc))
        change(broken)
        path = tmp_path / "broken.json"
        path.write_text(json.dumps(broken))
        with pytest.raises(nvfp4kv.LayoutError, match=field):
            nvfp4kv.load_calibration(str(path))


def test_sample_files_read_as_the_arrays_they_hold(tmp_path):
    arrays = samples(layers=2)
    kbits, kvalues = bf16_bits(arrays["k_1"])       # layer 1's K in bf16,
    vhalf = arrays["v_1"].astype(np.float16)        # its V in float16
    held = dict(arrays, k_1=kvalues, v_1=vhalf.astype(np.float32))
    want = nvfp4kv.calibrate(held)
    write_safetensors(tmp_path / "s.safetensors", {"k_0": ("F32", arrays["k_0"]), "v_0": ("F32", arrays["v_0"]),
                                                   "k_1": ("BF16", kbits), "v_1": ("F16", vhalf)})
    assert nvfp4kv.calibrate(tmp_path / "s.safetensors") == want
    np.savez(tmp_path / "s.npz", k_0=arrays["k_0"], v_0=arrays["v_0"], k_1=kbits, v_1=vhalf)  # bf16 as '<u2'
    assert nvfp4kv.calibrate(str(tmp_path / "s.npz")) == want
    # Broken files are refused naming the tensor; nothing is written.
    out = tmp_path / "x.json"
    cases = [({"k_0": ("I32", arrays["k_0"].view(np.int32))}, r'tensor "k_0" has dtype "I32"; samples are F32, F16 or BF16'),
             ({"k_0": ("F32", arrays["k_0"][:10])}, r"missing v_0"),
             ({"k_0": ("F32", arrays["k_0"])}, r'tensor "k_0": shape and dtype need 65536 bytes, data_offsets give 4'),
             ({"k_0": ("F32", arrays["k_0"])}, r'tensor "k_0": data_offsets \[0, 99999999\) lie outside')]
    extras = [None, None, {"k_0": {"dtype": "F32", "shape": [128, 2, 64], "data_offsets": [0, 4]}},
              {"k_0": {"dtype": "F32", "shape": [128, 2, 64], "data_offsets": [0, 99999999]}}]
    for (tensors, message), extra in zip(cases, extras):
        write_safetensors(tmp_path / "b.safetensors", tensors, extra)
        with pytest.raises(nvfp4kv.ArgumentError, match=message):
            nvfp4kv.calibrate(tmp_path / "b.safetensors", out=str(out))
    (tmp_path / "t.safetensors").write_bytes((1 << 40).to_bytes(8, "little") + b"{}")
    with pytest.raises(nvfp4kv.ArgumentError, match="is not a .safetensors file: its header length 1099511627776"):
        nvfp4kv.calibrate(tmp_path / "t.safetensors", out=str(out))
    for header, message in [(b'{"k_0": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "k_0": {}}',
                             r'b.safetensors\) header: key "k_0" appears twice'),
                            (b'[1, 2]', "the header is not a JSON object"),
                            (b'{"k_0": {"dtype": "F32", "shape": [0, 18446744073709551615, 64], "data_offsets": [0, 0]}}',
                             "its shape holds more elements than the file has bytes"),
                            (b'{"k_0": {"dtype": "F32", "shape": [1.5], "data_offsets": [0, 4]}}',
                             "shape entries must be non-negative integers")]:
        (tmp_path / "b.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bytes(4))
        with pytest.raises(nvfp4kv.ArgumentError, match=message):
            nvfp4kv.calibrate(tmp_path / "b.safetensors", out=str(out))
    stray = dict(arrays, q_1=arrays["k_1"])  # queries for one layer only, not layer 0
    write_safetensors(tmp_path / "q.safetensors", {name: ("F32", a) for name, a in stray.items()})
    with pytest.raises(nvfp4kv.ArgumentError, match="missing q_0"):
        nvfp4kv.calibrate(tmp_path / "q.safetensors", out=str(out))
    assert not out.exists()
    # A file as the safetensors package writes it (its header padded), whatever its name.
    st = pytest.importorskip("safetensors.numpy", reason="the safetensors package writes the reference file")
    st.save_file({name: a for name, a in held.items()}, str(tmp_path / "samples.bin"))
    assert nvfp4kv.calibrate(tmp_path / "samples.bin") == want


def test_arrays_in_a_mapping_are_floats():
    arrays = samples(layers=2)
    kbits, kvalues = bf16_bits(arrays["k_1"])
    with pytest.raises(nvfp4kv.ArgumentError, match="k_1 holds uint16 values; arrays are float32, float16 or bfloat16"):
        nvfp4kv.calibrate(dict(arrays, k_1=kbits))
    torch = pytest.importorskip("torch", reason="PyTorch tensors in the mapping")
    as_torch = dict(arrays, k_1=torch.from_numpy(kvalues).to(torch.bfloat16))  # exact: the values are bf16's
    assert nvfp4kv.calibrate(as_torch) == nvfp4kv.calibrate(dict(arrays, k_1=kvalues))


@pytest.mark.skipif(cli() is None, reason="the nvfp4kv command is not installed here")
def test_the_cli_reads_npz_and_safetensors_checks_shapes_and_agrees_with_python(tmp_path):
    exe = cli()
    arrays = samples()
    np.savez(tmp_path / "s.npz", **arrays)
    run = subprocess.run([exe, "calibrate", "--samples", str(tmp_path / "s.npz"), "--bits", "5",
                          "--out", str(tmp_path / "cli.json")], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    want = nvfp4kv.calibrate(arrays, bits=5)
    assert json.loads((tmp_path / "cli.json").read_text()) == want
    write_safetensors(tmp_path / "s.safetensors", {name: ("F32", a) for name, a in arrays.items()})
    run = subprocess.run([exe, "calibrate", "--samples", str(tmp_path / "s.safetensors"), "--bits", "5",
                          "--out", str(tmp_path / "st.json")], capture_output=True, text=True)
    assert run.returncode == 0 and json.loads((tmp_path / "st.json").read_text()) == want, run.stderr
    np.savez_compressed(tmp_path / "c.npz", **arrays)
    bad = dict(arrays, q_0=arrays["k_0"])  # q for one layer only
    np.savez(tmp_path / "b.npz", **bad)
    for npz, message in [("c.npz", "is compressed; save the samples with numpy.savez"), ("b.npz", "missing q_1")]:
        run = subprocess.run([exe, "calibrate", "--samples", str(tmp_path / npz), "--out", str(tmp_path / "x.json")],
                             capture_output=True, text=True)
        assert run.returncode == 2 and message in run.stderr, run.stderr
        assert not (tmp_path / "x.json").exists()


def test_kvcache_takes_the_calibration_and_refuses_another_models(tmp_path):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import nvfp4kv.transformers as nt
    config = transformers.LlamaConfig(vocab_size=96, hidden_size=128, intermediate_size=128, num_hidden_layers=3,
                                      num_attention_heads=4, num_key_value_heads=2, head_dim=64)
    path = tmp_path / "cal.json"
    cal = nvfp4kv.calibrate(samples(), bits=4.5, out=str(path))  # NVFP4 everywhere: the CPU path stores it
    cache = nt.KVCache(config, max_tokens=64, device="cpu", calibration=str(path))
    assert json.loads(cache.writer.layout.format_json) == cal["format"]
    scales = np.asarray(cache.writer.global_scales)
    assert scales[1, 0] == np.float32(cal["per_layer"][1]["k_global_scale"])
    other = tmp_path / "other.json"
    nvfp4kv.calibrate(samples(layers=2), out=str(other))
    with pytest.raises(nvfp4kv.ArgumentError, match="the calibration is for 2 layers, the cache has 3"):
        nt.KVCache(config, max_tokens=64, device="cpu", calibration=str(other))
