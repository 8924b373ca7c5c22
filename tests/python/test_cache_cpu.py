"""Cache in host memory: the CPU reference through the same front end the GPU
uses, every argument error named, buffers adopted, and the field failure
(a reader that disagrees with the writer) shown on the CPU."""
import numpy as np
import pytest

import nvfp4kv
from nvfp4kv import reference

DIMS = dict(layers=2, pages=8, heads=2, tokens_per_page=16, head_dim=64)


def rows(tokens, seed, heads=2, dim=64):
    rng = np.random.default_rng(seed)
    return rng.normal(0, 2, size=(tokens, heads, dim)).astype(np.float32)


def attention(q, k, v, scale):
    """fp64 softmax attention of one query row per head; GQA by repeating kv heads."""
    group = q.shape[0] // k.shape[1]
    k = np.repeat(k.astype(np.float64), group, axis=1)
    v = np.repeat(v.astype(np.float64), group, axis=1)
    logits = np.einsum("hd,thd->ht", q.astype(np.float64), k) * scale
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    return np.einsum("ht,thd->hd", p / p.sum(axis=1, keepdims=True), v)


@pytest.fixture
def cache():
    c = nvfp4kv.Cache(nvfp4kv.load("nvfp4kv-native", **DIMS), "cpu")
    c.set_global_scales([0.004, 0.005], [0.003, 0.002])
    return c


def test_store_gather_decode_agree_with_the_dense_reference(cache):
    k, v = rows(40, 1), rows(40, 2)
    pages = [5, 2, 7]  # any order
    slots = np.array([pages[t // 16] * 16 + t % 16 for t in range(40)], np.int64)
    cache.store(k, v, slots, 1)
    assert cache.status()["stored"] == 40
    table, cu = np.array([pages], np.int32), np.array([0, 40], np.int32)
    k_out, v_out = np.full((40, 2, 64), np.nan, np.float32), np.full((40, 2, 64), np.nan, np.float32)
    cache.gather(table, cu, 1, k_out, v_out)
    gs = cache.global_scales
    assert gs.shape == (2, 2) and gs[1, 0] == np.float32(0.005)
    k_ref = reference.dequantize(*reference.quantize(k, gs[1, 0]), gs[1, 0])
    v_ref = reference.dequantize(*reference.quantize(v, gs[1, 1]), gs[1, 1])
    np.testing.assert_array_equal(k_out, k_ref)
    np.testing.assert_array_equal(v_out, v_ref)
    q = rows(1, 3, heads=4)
    out, lse = np.full_like(q, np.nan), np.full((1, 4), np.nan, np.float32)
    cache.decode(q, table, np.array([40], np.int32), 1, out, lse=lse)
    expect = attention(q[0], k_ref, v_ref, 1 / 8)
    np.testing.assert_allclose(out[0], expect, rtol=0, atol=1e-5 * np.abs(expect).max())
    assert np.all(np.isfinite(lse))
    # offsets form, a window, a softcap: the reference's options all reach it
    cache.decode(q, table, None, 1, out, cu_seqlens=cu, window=16)
    np.testing.assert_allclose(out[0], attention(q[0], k_ref[24:], v_ref[24:], 1 / 8), atol=1e-4)


def test_attention_of_a_mixed_batch_is_causal_and_decode_for_one_token(cache):
    k, v = rows(40, 1), rows(40, 2)
    pages = [5, 2, 7]
    slots = np.array([pages[t // 16] * 16 + t % 16 for t in range(40)], np.int64)
    cache.store(k, v, slots, 1)
    gs = cache.global_scales
    k_ref = reference.dequantize(*reference.quantize(k, gs[1, 0]), gs[1, 0])
    v_ref = reference.dequantize(*reference.quantize(v, gs[1, 1]), gs[1, 1])
    # sequence 0: one new token of 40 (a decode); 1: six new tokens of 30 (an extend); 2: none
    table = np.array([pages, pages, pages], np.int32)
    q_lens, lens = [1, 6, 0], np.array([40, 30, 12], np.int32)
    cu_q = np.array([0, 1, 7, 7], np.int32)
    q = rows(7, 3, heads=4)
    out, lse = np.full_like(q, np.nan), np.full((7, 4), np.nan, np.float32)
    cache.attention(q, cu_q, q_lens, table, lens, 1, out, lse=lse)
    decoded = np.full_like(q[:1], np.nan)
    cache.decode(q[:1], table[:1], lens[:1], 1, decoded)
    np.testing.assert_array_equal(out[0], decoded[0])
    for i in range(6):  # query i at position 30 - 6 + i sees tokens 0 .. 24 + i
        expect = attention(q[1 + i], k_ref[:25 + i], v_ref[:25 + i], 1 / 8)
        np.testing.assert_allclose(out[1 + i], expect, rtol=0, atol=1e-5 * np.abs(expect).max())
    assert np.all(np.isfinite(lse))
    with pytest.raises(nvfp4kv.ArgumentError, match="q_lens: sequence 1"):
        cache.attention(q, cu_q, [1, 5, 1], table, lens, 1, out)
    with pytest.raises(nvfp4kv.ArgumentError, match="q: expected 8 rows"):
        cache.attention(q, cu_q, [1, 6, 1], table, lens, 1, out)
    with pytest.raises(nvfp4kv.ArgumentError, match="q_lens: expected 3 lengths"):
        cache.attention(q, cu_q, [1, 6], table, lens, 1, out)
    # more new tokens than tokens: counted as a bad length, the rows NaN
    cache.reset_status()
    cache.attention(q, cu_q, q_lens, table, np.array([40, 5, 12], np.int32), 1, out)
    assert cache.status()["bad_lengths"] == 1
    assert np.isnan(out[1:7]).all() and np.isfinite(out[0]).all()


def test_bad_entries_are_counted_not_read(cache):
    k, v = rows(3, 4), rows(3, 5)
    cache.store(k, v, np.array([-1, 8 * 16, 3], np.int32), 0)
    s = cache.status()
    assert (s["stored"], s["padding"], s["out_of_range"]) == (1, 1, 1)
    cache.reset_status()
    out = np.zeros((16, 2, 64), np.float32)
    cache.gather(np.array([[99]], np.int32), np.array([0, 16], np.int32), 0, out, out.copy())
    assert np.isnan(out).all() and cache.status()["bad_pages"] == 16


def test_adopted_buffers_are_used_in_place():
    layout = nvfp4kv.check(nvfp4kv.load("nvfp4kv-native", **DIMS))
    per_layer = [np.zeros(layout.layout.buffers[0].bytes, np.uint8) for _ in range(2)]
    scales = np.ones((2, 2), np.float32)
    cache = nvfp4kv.Cache(layout, "cpu", buffers=[per_layer], global_scales=scales)
    cache.store(rows(1, 6), rows(1, 7), np.array([0], np.int64), 1)
    assert per_layer[1].any() and not per_layer[0].any()
    assert np.shares_memory(cache.buffer(0, 1), per_layer[1])
    scales[1] = [0.01, 0.01]  # adopted: the cache reads the caller's array
    assert cache.global_scales[1, 0] == np.float32(0.01)
    # one array holding all layers back to back works too
    flat = np.zeros(2 * layout.layout.buffers[0].bytes, np.uint8)
    nvfp4kv.Cache(layout, "cpu", buffers=[flat]).store(rows(1, 6), rows(1, 7), np.array([0], np.int64), 1)
    assert flat[layout.layout.buffers[0].bytes:].any()


def test_a_disagreeing_reader_gives_wrong_answers_and_compare_says_so_first():
    dims = dict(layers=1, pages=8, heads=2, tokens_per_page=16, head_dim=64)
    writer = nvfp4kv.check(nvfp4kv.load("vllm-legacy-hnd-writer-upstream", **dims))
    reader = nvfp4kv.check(nvfp4kv.load("vllm-legacy-hnd-reader-sm120", **dims))
    report = nvfp4kv.compare(writer, reader)
    assert not report.agree and report.examples[0].region == "v_scale"
    written = nvfp4kv.Cache(writer, "cpu")
    # Forced through: the reader's cache adopts the writer's bytes.
    read = nvfp4kv.Cache(reader, "cpu", buffers=[[written.buffer(i, 0)] for i in range(len(writer.layout.buffers))])
    k, v = rows(64, 8), rows(64, 9) * np.exp(np.random.default_rng(1).normal(0, 1, (64, 1, 1))).astype(np.float32)
    written.store(k, v, np.arange(64, dtype=np.int32), 0)
    table, lens = np.array([[0, 1, 2, 3]], np.int32), np.array([64], np.int32)
    q = rows(1, 10, heads=2)
    right, wrong = np.zeros_like(q), np.zeros_like(q)
    written.decode(q, table, lens, 0, right)
    read.decode(q, table, lens, 0, wrong)
    assert np.isfinite(wrong).all()  # nothing crashes, nothing is flagged
    rel = np.linalg.norm(wrong - right) / np.linalg.norm(right)
    assert rel > 0.05, rel


CASES = [
    ("k: expected shape (*, 2, 64)", lambda c, a: c.store(a["k"][:, :1], a["v"], a["slots"], 0)),
    ("k: expected bfloat16 or float16 or float32", lambda c, a: c.store(a["k"].astype(np.int32), a["v"], a["slots"], 0)),
    ("v: must have k's dtype", lambda c, a: c.store(a["k"], a["v"].astype(np.float16), a["slots"], 0)),
    ("v: expected shape (4, 2, 64)", lambda c, a: c.store(a["k"], a["v"][:3], a["slots"], 0)),
    ("k: the head dim must be contiguous", lambda c, a: c.store(np.zeros((4, 2, 128), np.float32)[:, :, ::2], a["v"], a["slots"], 0)),
    ("v: must have k's token stride", lambda c, a: c.store(a["k"], np.zeros((4, 3, 2, 64), np.float32)[:, 0], a["slots"], 0)),
    ("slots: expected int32 or int64", lambda c, a: c.store(a["k"], a["v"], a["slots"].astype(np.float32), 0)),
    ("slots: expected shape (4,)", lambda c, a: c.store(a["k"], a["v"], a["slots"][:2], 0)),
    ("slots: must be contiguous", lambda c, a: c.store(a["k"], a["v"], np.zeros(8, np.int64)[::2], 0)),
    ("layer: must be in [0, 2), got 2", lambda c, a: c.store(a["k"], a["v"], a["slots"], 2)),
    ("rule: expected", lambda c, a: c.store(a["k"], a["v"], a["slots"], 0, rule="round")),
    ("k_scale: expected one float32", lambda c, a: c.store(a["k"], a["v"], a["slots"], 0, k_scale=np.ones(2, np.float32))),
    ("block_table: expected int32", lambda c, a: c.gather(a["table"].astype(np.int64), a["cu"], 0, a["out"], a["out"].copy())),
    ("block_table: must be contiguous", lambda c, a: c.gather(np.zeros((1, 4), np.int32)[:, ::2], a["cu"], 0, a["out"], a["out"].copy())),
    ("cu_seqlens: expected shape (2,)", lambda c, a: c.gather(a["table"], a["cu"][:1], 0, a["out"], a["out"].copy())),
    ("cu_seqlens: entry 1 = 99", lambda c, a: c.gather(a["table"], np.array([0, 99], np.int32), 0, a["out"], a["out"].copy())),
    ("v_out: expected shape (16, 2, 64)", lambda c, a: c.gather(a["table"], a["cu"], 0, a["out"], a["out"][:8].copy())),
    ("v_out: must have k_out's dtype", lambda c, a: c.gather(a["table"], a["cu"], 0, a["out"], a["out"].astype(np.float16))),
    ("q: expected shape (*, *, 64)", lambda c, a: c.decode(np.zeros((1, 4, 32), np.float32), a["table"], a["lens"], 0, a["qout"])),
    ("q_heads must be a positive multiple", lambda c, a: c.decode(np.zeros((1, 3, 64), np.float32), a["table"], a["lens"], 0, np.zeros((1, 3, 64), np.float32))),
    ("block_table: expected 1 rows", lambda c, a: c.decode(a["q"], np.zeros((2, 2), np.int32), a["lens"], 0, a["qout"])),
    ("seq_lens: give the sequence lengths", lambda c, a: c.decode(a["q"], a["table"], None, 0, a["qout"])),
    ("seq_lens: expected int32", lambda c, a: c.decode(a["q"], a["table"], a["lens"].astype(np.int64), 0, a["qout"])),
    ("out: expected float32", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, a["qout"].astype(np.float16))),
    ("out: expected shape (1, 4, 64)", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, np.zeros((1, 2, 64), np.float32))),
    ("sinks: expected shape (4,)", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, a["qout"], sinks=np.zeros(2, np.float32))),
    ("lse: expected float32", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, a["qout"], lse=np.zeros((1, 4), np.float64))),
    ("softmax_scale must be finite and > 0", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, a["qout"], softmax_scale=-1.0)),
    ("window must be >= 0", lambda c, a: c.decode(a["q"], a["table"], a["lens"], 0, a["qout"], window=-3)),
    ("set_global_scales: layer 1", lambda c, a: c.set_global_scales([1.0, 0.0], 1.0)),
    ("set_global_scales: one K and one V scale per layer", lambda c, a: c.set_global_scales([1.0], 1.0)),
    ("buffer: index 3 outside", lambda c, a: c.buffer(3, 0)),
]


@pytest.mark.parametrize("message, call", CASES, ids=[m.split(":")[0] + "-" + str(i) for i, (m, _) in enumerate(CASES)])
def test_every_argument_error_names_the_argument(cache, message, call):
    args = dict(k=rows(4, 1), v=rows(4, 2), slots=np.arange(4, dtype=np.int64), table=np.array([[0]], np.int32),
                cu=np.array([0, 16], np.int32), out=np.zeros((16, 2, 64), np.float32), lens=np.array([16], np.int32),
                q=np.zeros((1, 4, 64), np.float32), qout=np.zeros((1, 4, 64), np.float32))
    before = [cache.buffer(0, layer).copy() for layer in range(2)]
    with pytest.raises(nvfp4kv.ArgumentError) as info:
        call(cache, args)
    assert message in str(info.value)
    assert all(np.array_equal(b, cache.buffer(0, layer)) for layer, b in enumerate(before))  # nothing ran


@pytest.mark.parametrize("kwargs, message", [
    (dict(buffers=[]), "buffers: layout \"nvfp4kv-native\" has 1 buffers, got 0"),
    (dict(buffers=[[np.zeros(16, np.uint8)] * 2]), "holds 16 bytes, the layout needs"),
    (dict(buffers=[[np.zeros(1 << 16, np.uint8)]]), "one array per layer: expected 2, got 1"),
    (dict(buffers=["bytes"]), "expected an array"),
    (dict(global_scales=np.ones((2, 1), np.float32)), "global_scales: expected shape (2, 2)"),
    (dict(global_scales=np.ones((2, 2), np.float64)), "global_scales: expected float32"),
])
def test_construction_errors(kwargs, message):
    with pytest.raises(nvfp4kv.ArgumentError) as info:
        nvfp4kv.Cache(nvfp4kv.load("nvfp4kv-native", **DIMS), "cpu", **kwargs)
    assert message in str(info.value)


def test_device_and_stream_arguments():
    layout = nvfp4kv.load("nvfp4kv-native", **DIMS)
    with pytest.raises(ValueError, match="device"):
        nvfp4kv.Cache(layout, "tpu")
    if not nvfp4kv.has_cuda:
        with pytest.raises(nvfp4kv.UnsupportedError, match="without CUDA"):
            nvfp4kv.Cache(layout, "cuda")
    from nvfp4kv import _streams
    assert _streams.handle(7) == 7
    with pytest.raises(TypeError, match="stream"):
        _streams.handle("default")


def test_build_says_what_it_contains():
    assert nvfp4kv.build_info.startswith("nvfp4kv 0.1.0: ")
    assert ("CUDA kernels for sm_" in nvfp4kv.build_info) == nvfp4kv.has_cuda
