"""The layout contract from Python: the same verdicts, messages and counts as
the C++ library and CLI (tests/cpu, tests/cli)."""
import json

import pytest

import nvfp4kv

DIMS = dict(layers=2, pages=8, heads=2, tokens_per_page=16, head_dim=128)


def test_presets_are_listed_and_load():
    names = [n for n, _ in nvfp4kv.presets()]
    assert "nvfp4kv-native" in names and "trtllm" in names
    for name in names:
        layout = nvfp4kv.load(name, **DIMS)
        assert layout.dims.heads == 2 and layout.dims.head_dim == 128


def test_unknown_preset_names_the_presets():
    with pytest.raises(nvfp4kv.LayoutError, match="nvfp4kv-native"):
        nvfp4kv.load("no-such-layout")


def test_open_sizes_are_named():
    with pytest.raises(nvfp4kv.LayoutError, match="leaves sizes open"):
        nvfp4kv.load("vllm-packed-nhd-writer-upstream", layers=1, pages=2)


def test_check_proves_a_sound_layout():
    valid = nvfp4kv.check(nvfp4kv.load("nvfp4kv-native", **DIMS))
    assert isinstance(valid, nvfp4kv.ValidLayout)
    assert valid.report.ok
    assert valid.report.elements == 2 * 8 * 16 * 2 * (64 + 8) * 2
    assert set(valid.report.access) == {"k_data", "k_scale", "v_data", "v_scale"}


def test_check_rejects_with_the_diagnostics():
    layout = nvfp4kv.load("vllm-packed-nhd-writer-upstream", **DIMS)
    with pytest.raises(nvfp4kv.LayoutRejected) as info:
        nvfp4kv.check(layout)
    report = info.value.report
    assert not report.ok
    assert report.collision is not None and "share byte" in report.collision
    assert "REJECTED" in str(info.value) and report.problems[0] in report.summary()
    assert report.colliding_pairs
    # check_report gives the same report without raising.
    assert nvfp4kv.check_report(layout).collision == report.collision


def test_a_rejected_layout_cannot_become_a_cache():
    with pytest.raises(nvfp4kv.LayoutRejected):
        nvfp4kv.Cache(nvfp4kv.load("vllm-packed-nhd-reader-sm120", **DIMS), "cpu")


def test_compare_names_the_swizzled_v_scales():
    # vLLM issue #50084: upstream's writer swizzles V scales, the SM120 reader reads them linearly.
    writer = nvfp4kv.load("vllm-legacy-hnd-writer-upstream", **DIMS)
    reader = nvfp4kv.load("vllm-legacy-hnd-reader-sm120", **DIMS)
    nvfp4kv.check(writer), nvfp4kv.check(reader)  # both sound on their own
    report = nvfp4kv.compare(writer, reader)
    assert not report.agree
    per = report.misplaced_per_region
    assert per["k_data"] == per["k_scale"] == per["v_data"] == 0 and per["v_scale"] > 0
    assert report.misplaced == per["v_scale"]
    ex = report.examples[0]
    assert ex.region == "v_scale" and ex.writer_byte != ex.reader_byte and len(ex.coord) == 5
    assert "DISAGREE" in report.summary(writer.name, reader.name)
    assert nvfp4kv.compare(writer, writer).agree


def test_plan_gives_a_proven_native_layout():
    p = nvfp4kv.plan(layers=32, kv_heads=8, head_dim=128, memory_bytes=1 << 30, tp_size=2, tp_rank=1)
    assert p.heads_per_rank == 4 and p.first_head == 4 and list(p.rank_heads) == [4, 5, 6, 7]
    assert p.layout.report.ok and p.token_capacity > 0 and p.total_bytes <= 1 << 30
    assert "token capacity" in p.summary()
    assert nvfp4kv.check(p) is p.layout
    with pytest.raises(nvfp4kv.LayoutError, match="head"):
        nvfp4kv.plan(layers=1, kv_heads=8, head_dim=100, pages=4)


def test_show_draws_the_page():
    text = nvfp4kv.show(nvfp4kv.load("vllm-legacy-hnd-writer-upstream", **DIMS))
    assert "check: " in text and "K" in text and "v" in text
    assert "!" in nvfp4kv.show(nvfp4kv.load("vllm-packed-nhd-writer-upstream", **DIMS))


def test_json_round_trip_and_addresses():
    layout = nvfp4kv.load("trtllm", **DIMS)
    again = nvfp4kv.from_json(layout.to_json())
    assert json.loads(again.to_json()) == json.loads(layout.to_json())
    assert nvfp4kv.compare(layout, again).agree
    # TensorRT-LLM's 4-token interleave of scales: (t/4)*4*sd + 4g + t%4 inside the plane.
    b0, base = layout.address("v_scale", 0, 0, 0, 0, 0)
    b1, off = layout.address("v_scale", 0, 0, 5, 0, 2)
    assert b0 == b1 and off - base == 1 * 4 * 8 + 4 * 2 + 1
    with pytest.raises(nvfp4kv.ArgumentError, match="region"):
        layout.address("q_data", 0, 0, 0, 0, 0)


def test_load_a_json_file(tmp_path):
    path = tmp_path / "mine.json"
    path.write_text(nvfp4kv.load("nvfp4kv-native", **DIMS).to_json())
    assert nvfp4kv.compare(nvfp4kv.load(str(path)), nvfp4kv.load("nvfp4kv-native", **DIMS)).agree


def test_a_cache_format_is_attached_checked_and_carried(tmp_path):
    import json as _json
    import numpy as _np
    valid = nvfp4kv.check(nvfp4kv.plan(layers=2, kv_heads=2, head_dim=64, pages=4).layout)
    assert valid.bits_per_value == 4.5 and _json.loads(valid.format_json)["layers"] == []
    fmt = {"layers": [{"k": {"rotation": 32}}, {"v": {"rule": "4over6", "rotation": "head"}}],
           "k_mean": _np.zeros((2, 2, 64)), "k_channel_scale": _np.full((2, 2, 64), 0.5)}
    with_fmt = nvfp4kv.with_format(valid, fmt)
    assert with_fmt.bits_per_value == 4.5
    # The element format is the layout's: FP8 K needs a layout that holds K as FP8.
    with pytest.raises(nvfp4kv.LayoutError, match=r"format.layers\[0\].k.element: fp8_e4m3, but the layout holds K"):
        nvfp4kv.with_format(valid, {"layers": [{"k": {"element": "fp8_e4m3"}}, {}]})
    k8 = nvfp4kv.plan(layers=2, kv_heads=2, head_dim=64, pages=4, k_element="fp8_e4m3").layout
    assert nvfp4kv.with_format(k8, {"layers": [{"k": {"element": "fp8_e4m3"}}]}).bits_per_value == 6.25
    doc = _json.loads(with_fmt.format_json)
    assert doc["layers"][1]["v"] == {"element": "nvfp4", "rule": "4over6", "rotation": "head"}
    assert len(doc["k_mean"]) == 2 * 2 * 64
    assert doc["k_channel_scale"] == [0.5] * (2 * 2 * 64)
    path = tmp_path / "format.json"
    path.write_text(with_fmt.format_json)
    assert nvfp4kv.with_format(valid, str(path)).format_json == with_fmt.format_json
    assert nvfp4kv.with_format(valid, with_fmt.format_json).format_json == with_fmt.format_json
    for bad, field in [({"layers": [{"k": {"rotation": 128}}]}, r"format.layers\[0\].k.rotation: 128 does not divide"),
                       ({"k_mean": _np.zeros(5)}, "format.k_mean: 5 values"),
                       ({"k_mean": _np.full((2, 2, 64), _np.nan)}, r'format.k_mean\[0\]: expected a number, got "nan"'),
                       ({"k_channel_scale": _np.ones((2, 2, 63))}, "format.k_channel_scale: 252 values"),
                       ({"k_channel_scale": _np.zeros((2, 2, 64))},
                        r"format.k_channel_scale\[0\]\[0\]\[0\]: 0 is not a float in \[2\^-16, 2\^16\]"),
                       ({"layers": [{}, {}, {}]}, "format.layers: 3 entries")]:
        with pytest.raises(nvfp4kv.LayoutError, match=field):
            nvfp4kv.with_format(valid, bad)
