"""nvfp4kv.conformance from NumPy: the kit's arrays, and check_write / check_read
against foreign writers and readers written here from vLLM's own index
arithmetic for its packed NHD cache (csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu,
vllm/utils/torch_utils.py nvfp4_split_data_scale) and FlashInfer's rounding
(cvt_warp_fp16_to_fp4), with numpy and ml_dtypes only."""
import gc
import json

import ml_dtypes
import numpy as np
import pytest

import nvfp4kv
from nvfp4kv import conformance

F32 = np.float32
F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
SIZES = dict(layers=1, pages=16, tokens_per_page=16, heads=2, head_dim=128)


@pytest.fixture(scope="module")
def layout():
    # vLLM's packed NVFP4 cache (B, 2H, N, F) stored NHD: physically (B, N, 2H, F), rows read literally.
    return nvfp4kv.check(nvfp4kv.load("vllm-packed-nhd-rows", **SIZES))


@pytest.fixture(scope="module")
def kit(layout):
    return conformance.gen(layout)


# ---- the engine: vLLM's writer and reader, FlashInfer's rounding ----------------------------
def reciprocal_multiply(x, gs):
    """cvt_warp_fp16_to_fp4 on (..., D) float32 rows, given the quant multiplier
    global_sf = 1 / gs: SF = e4m3(global_sf * (amax * (1/6))), inv = 1 / (SF * (1 / global_sf)),
    codes = cvt.rn.satfinite.e2m1(x * inv). Returns ((..., D/2) bytes, (..., D/16) scale codes)."""
    global_sf = F32(1) / F32(gs)
    blocks = x.reshape(*x.shape[:-1], -1, 16).astype(F32)
    vec_max = np.abs(blocks).max(axis=-1)
    sf = np.minimum(global_sf * (vec_max * (F32(1) / F32(6))), F32(448)).astype(F8)  # RNE, saturating
    sf_value = sf.astype(F32)
    with np.errstate(divide="ignore"):
        inv = np.where(sf_value == 0, F32(0), F32(1) / (sf_value * (F32(1) / global_sf))).astype(F32)
    codes = np.clip(blocks * inv[..., None], F32(-6), F32(6)).astype(F4).view(np.uint8) & 0xF
    packed = (codes[..., 0::2] | (codes[..., 1::2] << 4)).astype(np.uint8)
    return packed.reshape(*x.shape[:-1], -1), sf.view(np.uint8)


def shape_of(kit):
    d = kit.dims
    dd, sd = d.head_dim // 2, d.head_dim // 16
    return d.pages, d.heads, d.tokens_per_page, dd, sd, dd + sd


def vllm_writer_addresses(kit, side, physical_rows):
    """(data byte, scale byte) of (page, token, head) for side 0 (K) or 1 (V) as
    reshape_and_cache_nvfp4 computes them on the packed NHD tensor; physical_rows:
    the fix, addressing the tensor's own rows (B, N, 2H, F)."""
    B, H, N, dd, sd, F = shape_of(kit)
    page_bytes = 2 * H * N * F
    if physical_rows:
        row = lambda p, t, h: p * page_bytes + (t * 2 * H + side * H + h) * F  # noqa: E731
        return row, lambda p, t, h: row(p, t, h) + dd
    # reshape_and_cache_nvfp4_dispatch: key_cache = kv_cache[:, :H], value_cache = kv_cache[:, H:],
    # logical [num_blocks, block_size, num_heads, full_dim] with strides (2H*N*F, 2H*F, F, 1);
    # is_hnd = stride(2) > stride(1) is false, so the NHD strides are taken from num_heads.
    block_stride, value_offset = page_bytes, H * F
    data_head_stride, data_block_offset_stride = dd, H * dd
    scale_head_stride, scale_block_offset_stride = sd, H * sd
    data_per_kv = H * N * dd
    base = side * value_offset
    return (lambda p, t, h: base + p * block_stride + h * data_head_stride + t * data_block_offset_stride,
            lambda p, t, h: base + data_per_kv + p * block_stride + h * scale_head_stride
            + t * scale_block_offset_stride)


def vllm_write(kit, physical_rows=False):
    """The engine's store: every stored row, K then V, into the kit's poisoned buffer."""
    B, H, N, dd, sd, F = shape_of(kit)
    (kv,) = kit.empty_buffers()
    for side, (rows, gs) in enumerate(((kit.k_f32, kit.k_global_scale), (kit.v_f32, kit.v_global_scale))):
        packed, scales = reciprocal_multiply(rows, gs)
        data_at, scale_at = vllm_writer_addresses(kit, side, physical_rows)
        for i, slot in enumerate(kit.slots):
            if slot < 0:
                continue  # padding
            p, t = divmod(int(slot), N)
            for h in range(H):
                kv[data_at(p, t, h) + np.arange(dd)] = packed[i, h]
                kv[scale_at(p, t, h) + np.arange(sd)] = scales[i, h]
    return [kv]


def dequantize(data, scales, gs):
    codes = np.stack([data & 0xF, data >> 4], axis=-1).reshape(*data.shape[:-1], -1).astype(np.uint8)
    e2m1 = codes.view(F4).astype(F32)
    return (e2m1 * np.repeat(scales.view(F8).astype(F32), 16, axis=-1)) * F32(gs)


def vllm_read(kit, physical_rows=False):
    """The engine's reader: K and V of the kit's sequences dequantized, (tokens, H, D) in
    sequence order, through nvfp4_split_data_scale's views of kv_cache.split(H, dim=1)."""
    B, H, N, dd, sd, F = shape_of(kit)
    (cache,) = kit.cache
    # Each side: logical (B, H, N, F), strides (2H*N*F, F, 2H*F, 1), from byte side * H * F.
    st0, st_head, st_token = 2 * H * N * F, F, 2 * H * F
    out = []
    for side, gs in ((0, kit.k_global_scale), (1, kit.v_global_scale)):
        base = side * H * F
        if physical_rows:
            data_base, scale_base, dh, dt, sh, shd = base, base + dd, st_head, st_token, st_head, st_token
        else:  # strides scaled by dd/F for data, sd/F for scales from dim1 * dim2 * dd bytes on
            data_base, scale_base = base, base + H * N * dd
            dh, dt, sh, shd = st_head * dd // F, st_token * dd // F, st_head * sd // F, st_token * sd // F
        rows = []
        for pages, length in kit.sequences:
            t = np.arange(length)
            page, pos = np.asarray(pages)[t // N], t % N
            h = np.arange(H)
            cell = (page * st0)[:, None, None]
            data = cache[data_base + cell + (pos * dt)[:, None, None] + (h * dh)[None, :, None] + np.arange(dd)]
            scales = cache[scale_base + cell + (pos * shd)[:, None, None] + (h * sh)[None, :, None] + np.arange(sd)]
            rows.append(dequantize(data, scales, gs))
        out.append(np.concatenate(rows))
    return out


def attend(kit, k, v):
    """Decode attention over the probes in float64: probe b's query over its sequence's rows."""
    cu, group = kit.cu_seqlens, kit.q_heads // kit.dims.heads
    out = np.zeros(kit.expected_out.shape, dtype=F32)
    with np.errstate(invalid="ignore"):
        for b, s in enumerate(kit.probe_sequence):
            kk = np.repeat(k[cu[s]:cu[s + 1]], group, axis=1).astype(np.float64)  # (L, q_heads, D)
            vv = np.repeat(v[cu[s]:cu[s + 1]], group, axis=1).astype(np.float64)
            logits = np.einsum("lhd,hd->hl", kk, kit.q_f32[b].astype(np.float64)) * kit.softmax_scale
            p = np.exp(logits - logits.max(axis=1, keepdims=True))
            out[b] = np.einsum("hl,lhd->hd", p, vv) / p.sum(axis=1)[:, None]
    return out


# ---- the kit -------------------------------------------------------------------------------
def test_the_kits_arrays(kit):
    d = kit.dims
    rows, H, D = kit.rows, d.heads, d.head_dim
    assert kit.dtype == "bf16" and kit.k.dtype == np.uint16 and kit.k.shape == (rows, H, D)
    assert not kit.k.flags.writeable and not kit.cache[0].flags.writeable
    np.testing.assert_array_equal(kit.k_f32, kit.k.view(ml_dtypes.bfloat16).astype(F32))
    assert kit.slots.dtype == np.int64 and kit.slots.shape == (rows,)
    assert (kit.slots < 0).sum() == rows - kit.tokens > 0
    assert kit.seq_lens.sum() == kit.tokens == kit.read_rows.shape[0]
    assert kit.cu_seqlens[-1] == kit.tokens and kit.block_tables.dtype == np.int32
    # The dense output rows are the stored rows in sequence order, at the pages of the block tables.
    for s, (length, table) in enumerate(zip(kit.seq_lens, kit.block_tables)):
        t = np.arange(length)
        rows_s = kit.read_rows[kit.cu_seqlens[s]:kit.cu_seqlens[s + 1]]
        np.testing.assert_array_equal(kit.slots[rows_s], table[t // d.tokens_per_page] * d.tokens_per_page
                                      + t % d.tokens_per_page)
    dense = np.arange(kit.tokens)
    sequence = np.searchsorted(kit.cu_seqlens, dense, side="right") - 1
    np.testing.assert_array_equal(kit.row_sequence[kit.read_rows], sequence)
    np.testing.assert_array_equal(kit.row_position[kit.read_rows], dense - kit.cu_seqlens[sequence])
    assert (kit.row_sequence[kit.slots < 0] == -1).all()
    # What a reader must return is the reference's quantization of those rows.
    for side_rows, gs, expected in ((kit.k_f32, kit.k_global_scale, kit.expected_k),
                                    (kit.v_f32, kit.v_global_scale, kit.expected_v)):
        data, scales = nvfp4kv.reference.quantize(side_rows[kit.read_rows], gs)
        np.testing.assert_array_equal(nvfp4kv.reference.dequantize(data, scales, gs), expected)
    assert [b.shape for b in kit.cache] == [(b.bytes,) for b in kit.layout.layout.buffers]
    assert kit.buffer_names == ["kv"] and kit.poison == 0x88
    assert all((b == 0x88).all() for b in kit.empty_buffers())
    assert kit.q.shape == kit.expected_out.shape == (kit.probes, kit.q_heads, D)
    assert kit.probe_isolates.dtype == bool and kit.probe_isolates.all()
    np.testing.assert_array_equal(kit.probe_seq_lens, kit.seq_lens[kit.probe_sequence])
    assert kit.bytes_differing["reciprocal-multiply"] > 0 and kit.probe_blocks > 0
    assert kit.k_quant == pytest.approx(1 / kit.k_global_scale)


def test_the_views_keep_the_kit_alive(layout):
    k, cache = conformance.gen(layout).k, conformance.gen(layout, seed=3).cache
    gc.collect()
    assert k.base is not None and k[0, 0, 0] != 0 and cache[0].size == layout.layout.buffers[0].bytes
    assert (cache[0] != 0x88).any()


def test_fp16_and_gqa_kits(layout):
    kit = conformance.gen(layout, dtype=np.float16, tokens=40, q_heads=4, seed=7)
    assert kit.dtype == "fp16" and kit.k.dtype == np.float16 and kit.tokens == 40 and kit.q_heads == 4
    np.testing.assert_array_equal(kit.k_f32, kit.k.astype(F32))
    assert conformance.check_read_attention(kit, kit.expected_out).ok
    assert conformance.check_read_attention(kit, attend(kit, kit.expected_k, kit.expected_v)).ok


def test_files_load_back(layout, kit, tmp_path):
    written = conformance.gen(layout, tmp_path / "kit")
    np.testing.assert_array_equal(np.load(tmp_path / "kit" / "k.npy"), kit.k)
    np.testing.assert_array_equal(np.load(tmp_path / "kit" / "block_tables.npy"), kit.block_tables)
    np.testing.assert_array_equal(np.load(tmp_path / "kit" / "probe_block_tables.npy"), kit.probe_block_tables)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "kit" / "cache" / "kv.bin", np.uint8), written.cache[0])
    by_name = conformance.load_kit(tmp_path / "kit", "vllm-packed-nhd-rows")  # at the manifest's sizes
    for again in (conformance.load_kit(tmp_path / "kit", layout), by_name):
        np.testing.assert_array_equal(again.cache[0], kit.cache[0])
        np.testing.assert_array_equal(again.q, kit.q)
    other = nvfp4kv.load("flashinfer-nhd", **SIZES)
    with pytest.raises(nvfp4kv.ArgumentError, match="places bytes unlike"):
        conformance.load_kit(tmp_path / "kit", other)


# ---- check_write -----------------------------------------------------------------------------
def test_the_kits_own_buffers_are_exact(kit):
    for buffers in (kit.cache, {"kv": kit.cache[0]}, kit.cache[0]):
        report = conformance.check_write(kit, buffers)
        assert report.ok, report.text()
        assert report.verdicts == {"k_data": "exact", "k_scale": "exact", "v_data": "exact", "v_scale": "exact"}
        assert report.writer_layout is None and report.writer_layout_json is None
        assert report.to_dict()["ok"] is True and json.loads(report.json())["layout"] == "vllm-packed-nhd-rows"
        assert "check-write: PASS (every byte exact)" in report.text()


def test_buffers_by_name_or_in_the_layouts_order():
    # FlashInfer's NHD cache: four per-layer buffers; the kit writes layer 1 of 2.
    layout = nvfp4kv.load("flashinfer-nhd", **dict(SIZES, layers=2))
    kit = conformance.gen(layout, layer=1)
    assert kit.buffer_names == ["k_data", "k_scale", "v_data", "v_scale"]
    by_name = dict(zip(reversed(kit.buffer_names), reversed(kit.cache)))
    assert conformance.check_write(kit, by_name).ok
    k_data, k_scale, v_data, v_scale = kit.cache
    swapped = conformance.check_write(kit, (v_data, k_scale, k_data, v_scale))
    assert swapped.verdicts == {"k_data": "misplaced", "k_scale": "exact", "v_data": "misplaced", "v_scale": "exact"}
    assert swapped.regions["k_data"]["writer_map"]["map"]["buffer"] == "v_data"
    with pytest.raises(nvfp4kv.ArgumentError, match=r'buffers\["k_scale"\]: holds 32768 bytes; buffer "k_scale" of '
                                                    r"the layout is 4096 \(one layer's allocation\)"):
        conformance.check_write(kit, dict(by_name, k_scale=k_data))


def test_vllm_token_major_writer_is_misplaced_and_its_map_inferred(kit):
    report = conformance.check_write(kit, vllm_write(kit))
    assert not report.ok
    assert set(report.verdicts.values()) == {"misplaced"}, report.text()
    for name, region in report.regions.items():
        assert region["found_elsewhere"] > 0, name
        fit = region["writer_map"]
        assert fit["fitted"] and fit["explained"] == fit["observations"] > 0, name
    # The writer takes its NHD strides from H heads, where the rows hold 2H slots of F bytes,
    # and puts the scales after all of a side's data.
    assert "k_data token stride is 128 (H*dd), the layout says 288 (2*H*F)" in report.differences
    assert "k_data head stride is 64 (dd), the layout says 72 (F)" in report.differences
    assert "k_scale offset is 2048 (H*N*dd), the layout says 64" in report.differences
    k_data = report.regions["k_data"]["writer_map"]["map"]
    assert (k_data["token"], k_data["head"]) == (128, 64)
    # Its V writes land on the K rows that follow and overwrite them: those K elements are found nowhere.
    assert report.regions["k_data"]["not_found"] > 0
    # The inferred map is vLLM's writer, and it is unsound.
    writer = report.writer_layout
    assert isinstance(writer, nvfp4kv.Layout)
    assert nvfp4kv.compare(writer, nvfp4kv.load("vllm-packed-nhd-writer-sm12x", **SIZES)).agree
    assert not nvfp4kv.compare(writer, kit.layout).agree
    assert "REJECTED" in report.writer_layout_check
    assert not nvfp4kv.check_report(nvfp4kv.from_json(report.writer_layout_json)).ok
    assert report.to_dict()["writer_layout"]["name"] == writer.name
    example = report.regions["k_data"]["examples"][0]
    assert example["expected"]["buffer"] == "kv" and example["region"] == "k_data"
    assert "check-write: FAIL (k_data, k_scale, v_data, v_scale misplaced)" in report.text()


def test_the_fixed_writer_is_rounding_only(kit):
    # Physical rows, FlashInfer's rounding: bytes unlike nvfp4kv's, and right.
    report = conformance.check_write(kit, vllm_write(kit, physical_rows=True))
    assert report.ok, report.text()
    assert report.verdicts["k_data"] == "rounding-only" and report.verdicts["k_scale"] == "exact"
    assert report.regions["k_data"]["policy"] == "reciprocal-multiply"
    assert sum(r["rounding"] for r in report.regions.values()) == kit.bytes_differing["reciprocal-multiply"]
    assert all(r["wrong"] == 0 for r in report.regions.values())


# ---- check_read ------------------------------------------------------------------------------
def test_the_right_reader_is_right(kit):
    assert conformance.check_read_rows(kit, kit.expected_k, kit.expected_v).ok
    k, v = vllm_read(kit, physical_rows=True)
    np.testing.assert_array_equal(k, kit.expected_k)
    for convert in (lambda a: a, lambda a: a.astype(np.float16), lambda a: a.astype(ml_dtypes.bfloat16),
                    lambda a: a.astype(ml_dtypes.bfloat16).view(np.uint16)):
        report = conformance.check_read_rows(kit, convert(k), convert(v))
        assert report.ok and report.mode == "rows", report.text()
    assert report.sides["K"]["correct"] == report.sides["K"]["elements"] == kit.expected_k.size


def test_torch_cpu_tensors_cross_through_dlpack(kit):
    torch = pytest.importorskip("torch")
    assert conformance.check_write(kit, [torch.from_numpy(kit.cache[0].copy())]).ok
    k = torch.from_numpy(kit.expected_k.copy()).bfloat16()
    v = torch.from_numpy(kit.expected_v.copy()).half()
    assert conformance.check_read_rows(kit, k, v).ok
    assert conformance.check_read_attention(kit, torch.from_numpy(kit.expected_out.copy()).bfloat16()).ok
    # k's uint16 bit patterns are torch's bf16.
    assert torch.equal(torch.from_numpy(kit.k.copy()).view(torch.bfloat16).float(), torch.from_numpy(kit.k_f32))


def test_vllm_split_data_scale_names_the_aliased_bytes(kit):
    k, v = vllm_read(kit)
    report = conformance.check_read_rows(kit, k, v, max_examples=32)
    assert not report.ok
    ks = report.sides["K"]
    assert ks["blocks_misread"] > 0 and ks["aliased"] > 0 and ks["wrong_data"] > 0
    aliased = [e for e in report.examples if e["side"] == "K" and e["aliased"]]
    assert any("_scale[" in e["data_owner"] or "_data[" in e["scale_owner"] for e in aliased), report.text()
    assert "k_data token stride is 256 (2*H*dd), the layout says 288 (2*H*F)" in report.differences
    assert "k_data" in report.reader_maps and report.reader_layout is not None
    vllm = nvfp4kv.load("vllm-packed-nhd-reader-sm120", **SIZES)
    assert nvfp4kv.compare(report.reader_layout, vllm).misplaced_per_region["k_data"] == 0
    assert json.loads(report.reader_layout_json)["name"] == report.reader_layout.name
    assert "aliased data/scale" in report.text()


def test_attention_through_the_wrong_views_is_caught(kit):
    right = conformance.check_read_attention(kit, attend(kit, *vllm_read(kit, physical_rows=True)))
    assert right.ok and right.mode == "attention", right.text()
    wrong = conformance.check_read_attention(kit, attend(kit, *vllm_read(kit)))
    assert not wrong.ok
    a = wrong.attention
    assert a["correct"] < a["probe_rows"] == kit.probes * kit.q_heads
    assert a["non_finite"] > 0  # the views read E4M3 NaN scales
    # A reader that returns another token's V row is traced to it.
    out = kit.expected_out.copy()
    seq = kit.probe_sequence
    b = int(np.flatnonzero((seq[:-1] == seq[1:]))[0])
    out[b] = kit.expected_out[b + 1]
    shifted = conformance.check_read_attention(kit, out)
    assert not shifted.ok and shifted.attention["wrong_token"] == kit.q_heads, shifted.text()


# ---- argument errors ---------------------------------------------------------------------------
def strided(a):
    """a's values in a non-contiguous array of a's shape."""
    return np.ascontiguousarray(np.swapaxes(a, 0, 1)).swapaxes(0, 1)


@pytest.mark.parametrize("call, message", [
    (lambda kit, l: conformance.check_write(kit, [np.zeros(10, np.uint8)]), r"buffers\[0\]: holds 10 bytes; buffer \"kv\""),
    (lambda kit, l: conformance.check_write(kit, [kit.cache[0].astype(np.int32)]), r"buffers\[0\]: expected uint8"),
    (lambda kit, l: conformance.check_write(kit, [np.repeat(kit.cache[0], 2)[::2]]), r"buffers\[0\]: must be contiguous"),
    (lambda kit, l: conformance.check_write(kit, {"kvv": kit.cache[0]}), r"no buffer \"kvv\" \(did you mean \"kv\"\?\)"),
    (lambda kit, l: conformance.check_write(kit, {}), r"buffers: no array for buffer \"kv\""),
    (lambda kit, l: conformance.check_write(kit, []), r"buffers: expected 1 array\(s\)"),
    (lambda kit, l: conformance.check_write(kit, "kv.bin"), r"buffers: expected a uint8 array"),
    (lambda kit, l: conformance.check_write(kit, kit.cache, max_examples=-1), r"max_examples"),
    (lambda kit, l: conformance.check_write("kit", kit.cache), r"kit: expected an nvfp4kv.conformance.Kit"),
    (lambda kit, l: conformance.check_read_rows(kit, kit.expected_k[:-1], kit.expected_v),
     r"k: expected shape \(128, 2, 128\), got a cpu float32 array of shape \(127, 2, 128\)"),
    (lambda kit, l: conformance.check_read_rows(kit, kit.expected_k, kit.expected_v.astype(np.int32)),
     r"v: expected float32 or float16 or bfloat16"),
    (lambda kit, l: conformance.check_read_rows(kit, strided(kit.expected_k), kit.expected_v), r"k: must be contiguous"),
    (lambda kit, l: conformance.check_read_attention(kit, kit.expected_out[:, :1]), r"out: expected shape \(128, 2, 128\)"),
    (lambda kit, l: conformance.gen(l, dtype="fp8"), r"dtype: expected \"bf16\" or \"fp16\", got \"fp8\""),
    (lambda kit, l: conformance.gen(l, tokens=-1), r"tokens: expected 0"),
    (lambda kit, l: conformance.gen(l, tokens=100000), r"tokens= must be in \[1, "),
    (lambda kit, l: conformance.gen(l, tokens=400), r"lower tokens= or raise pages="),
    (lambda kit, l: conformance.gen(l, layer=1), r"layer 1 is outside the layout's \[0, 1\)"),
    (lambda kit, l: conformance.gen(l, q_heads=3), r"q_heads= must be a multiple of the 2 kv heads"),
    (lambda kit, l: conformance.load_kit("/nonexistent-kit", l), r"cannot read /nonexistent-kit/manifest.json"),
])
def test_argument_errors(kit, layout, call, message):
    with pytest.raises(nvfp4kv.ArgumentError, match=message):
        call(kit, layout)


def test_an_unsound_layout_has_no_kit():
    with pytest.raises(nvfp4kv.LayoutRejected):
        conformance.gen(nvfp4kv.load("vllm-packed-nhd-writer-upstream", **SIZES))
