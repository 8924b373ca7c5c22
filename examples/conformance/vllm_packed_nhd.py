#!/usr/bin/env python3
"""An engine's own writer and reader, for docs/conformance.md's worked example.

vLLM's packed NVFP4 KV cache is one uint8 tensor (B, 2H, N, F) per layer (B pages,
H kv heads, N tokens per page, F = D/2 + D/16 bytes per row: data then scales),
slots 0..H-1 holding K and H..2H-1 holding V. Stored NHD (stride order
(0, 2, 1, 3)) it is physically (B, N, 2H, F): token-major. This file does what
vLLM's code does with it, written from its index arithmetic, with numpy only:

  write: reshape_and_cache_nvfp4 (csrc/libtorch_stable/nvfp4_kv_cache_kernels.cu),
         its NHD strides computed from num_heads, linear V scales (the SM12x path);
         each block rounded as FlashInfer's cvt_warp_fp16_to_fp4 does (reciprocals
         multiplied, given the quant multiplier global_sf = 1 / scale)
  read:  nvfp4_split_data_scale (vllm/utils/torch_utils.py): as_strided views of
         the side's bytes with strides times dd/F for data and sd/F for scales
  attend: decode attention over the probes, K and V read through those views

--physical-rows makes each address the tensor's physical rows instead, as the
layout vllm-packed-nhd-rows describes them: the fixed writer and reader.

usage: vllm_packed_nhd.py write KIT OUT.bin [--physical-rows]
       vllm_packed_nhd.py read KIT K.npy V.npy [--physical-rows]
       vllm_packed_nhd.py attend KIT OUT.npy [--physical-rows]
"""
import argparse
import json
import os

import numpy as np

F32 = np.float32
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=F32)


def e4m3_values():
    """The value of every E4M3 (fn) code 0..255 (NaN for 0x7F and 0xFF)."""
    v = np.zeros(256, dtype=F32)
    for code in range(256):
        e, m = (code >> 3) & 15, code & 7
        mag = m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7)
        v[code] = np.nan if (code & 0x7F) == 0x7F else (-mag if code & 0x80 else mag)
    return v


E4M3 = e4m3_values()
POSITIVE = E4M3[:0x7F]  # codes 0..126, increasing


def e4m3_encode(x):
    """Round non-negative float32 to the nearest E4M3 code, ties to the even code, saturating at 448."""
    x = np.minimum(x, F32(448))
    hi = np.clip(np.searchsorted(POSITIVE, x), 0, 126)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = x - POSITIVE[lo], POSITIVE[hi] - x
    return np.where((d_hi < d_lo) | ((d_hi == d_lo) & (hi % 2 == 0)), hi, lo).astype(np.uint8)


def e2m1_encode(y):
    """cvt.rn.satfinite.e2m1x2: round to nearest, ties to even, saturate at 6; the sign kept."""
    a = np.abs(y)
    mag = ((a > 0.25).astype(np.uint8) + (a >= 0.75) + (a > 1.25) + (a >= 1.75) + (a > 2.5) + (a >= 3.5) + (a > 5))
    return mag.astype(np.uint8) | np.where(np.signbit(y), 8, 0).astype(np.uint8)


def quantize(x, global_sf):
    """cvt_warp_fp16_to_fp4 on (..., 16) float32 blocks: (packed bytes (..., 8), scale codes (...))."""
    vec_max = np.max(np.abs(x), axis=-1)
    sf = e4m3_encode(global_sf * (vec_max * F32(1 / 6)))
    sf_value = E4M3[sf]
    output_scale = np.where(sf == 0, F32(0), F32(1) / (sf_value * (F32(1) / global_sf))).astype(F32)
    q = e2m1_encode(x * output_scale[..., None])
    return (q[..., 0::2] | (q[..., 1::2] << 4)).astype(np.uint8), sf


def load(kit):
    with open(os.path.join(kit, "manifest.json")) as f:
        m = json.load(f)
    d = m["dims"]
    return m, d["pages"], d["heads"], d["tokens_per_page"], d["head_dim"]


def addresses(kit_dims, physical_rows):
    """Per side (0 K, 1 V): functions (page, token, head) -> byte of data row / scale row."""
    B, H, N, D = kit_dims
    dd, sd = D // 2, D // 16
    F = dd + sd
    P = 2 * H * N * F  # bytes per page
    if physical_rows:  # the tensor's rows (B, N, 2H, F): row (t, slot) holds data then scales
        return [(lambda p, t, h, s=s: p * P + (t * 2 * H + s * H + h) * F,
                 lambda p, t, h, s=s: p * P + (t * 2 * H + s * H + h) * F + dd) for s in (0, 1)]
    # reshape_and_cache_nvfp4_dispatch: key_cache / value_cache = kv_cache[:, :H] / [:, H:]
    # viewed [num_blocks, block_size, num_heads, full_dim]; NHD, so the strides come from num_heads.
    data_block_offset_stride, data_head_stride = H * dd, dd
    scale_block_offset_stride, scale_head_stride = H * sd, sd
    data_per_kv = H * N * dd
    value_offset = H * F  # kv_cache[:, H:] of the token-major tensor
    return [(lambda p, t, h, side=s * value_offset: side + p * P + h * data_head_stride + t * data_block_offset_stride,
             lambda p, t, h, side=s * value_offset: side + data_per_kv + p * P + h * scale_head_stride
             + t * scale_block_offset_stride) for s in (0, 1)]


def write(kit, out, physical_rows):
    m, B, H, N, D = load(kit)
    rows = {"k": np.load(os.path.join(kit, "k.f32.npy")), "v": np.load(os.path.join(kit, "v.f32.npy"))}
    slots = np.load(os.path.join(kit, "slot_mapping.npy"))
    cache = np.full(B * 2 * H * N * (D // 2 + D // 16), m["poison"], dtype=np.uint8)
    where = addresses((B, H, N, D), physical_rows)
    for side, name in enumerate(("k", "v")):
        packed, scales = quantize(rows[name].reshape(len(slots), H, D // 16, 16), F32(m["global_scale"][name + "_quant"]))
        data_at, scale_at = where[side]
        for i, slot in enumerate(slots):
            if slot < 0:
                continue  # padding
            p, t = divmod(int(slot), N)
            for h in range(H):
                cache[data_at(p, t, h) + np.arange(D // 2)] = packed[i, h].reshape(-1)
                cache[scale_at(p, t, h) + np.arange(D // 16)] = scales[i, h]
    cache.tofile(out)


def side_views(cache, kit_dims, physical_rows):
    """(data, scales) per side as (B, H, N, dd) / (B, H, N, sd) uint8 views, as the reader sees them."""
    B, H, N, D = kit_dims
    dd, sd = D // 2, D // 16
    F = dd + sd
    kv = np.lib.stride_tricks.as_strided(cache, shape=(B, 2 * H, N, F), strides=(2 * H * N * F, F, 2 * H * F, 1))
    views = []
    for side in (kv[:, :H], kv[:, H:]):  # kv_cache.split(H, dim=1)
        if physical_rows:
            views.append((side[..., :dd], side[..., dd:]))
            continue
        # nvfp4_split_data_scale: strides scaled by dd/F (data) and sd/F (scales from dim1*dim2*dd on)
        base = side.__array_interface__["data"][0] - cache.__array_interface__["data"][0]
        st = side.strides
        data = np.lib.stride_tricks.as_strided(cache[base:], shape=(B, H, N, dd),
                                               strides=(st[0], st[1] * dd // F, st[2] * dd // F, 1))
        scales = np.lib.stride_tricks.as_strided(cache[base + H * N * dd:], shape=(B, H, N, sd),
                                                 strides=(st[0], st[1] * sd // F, st[2] * sd // F, 1))
        views.append((data, scales))
    return views


def dequantize(data, scales, global_scale):
    """(..., dd) bytes and (..., sd) scale codes -> (..., D) float32."""
    codes = np.stack([data & 15, data >> 4], axis=-1).reshape(*data.shape[:-1], -1)
    values = np.where(codes & 8, -1, 1).astype(F32) * E2M1[codes & 7]
    return values * np.repeat(E4M3[scales], 16, axis=-1) * F32(global_scale)


def read_rows(kit, physical_rows):
    m, B, H, N, D = load(kit)
    cache = np.fromfile(os.path.join(kit, m["buffers"][0]["file"]), dtype=np.uint8)
    views = side_views(cache, (B, H, N, D), physical_rows)
    tables, lens = np.load(os.path.join(kit, "block_tables.npy")), np.load(os.path.join(kit, "seq_lens.npy"))
    out = []
    for side, name in enumerate(("k", "v")):
        data, scales = views[side]
        rows = []
        for table, n in zip(tables, lens):
            for t in range(n):
                p = table[t // N]
                rows.append(dequantize(data[p, :, t % N], scales[p, :, t % N], m["global_scale"][name]))
        out.append(np.stack(rows))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["write", "read", "attend"])
    ap.add_argument("kit")
    ap.add_argument("files", nargs="+")
    ap.add_argument("--physical-rows", action="store_true", help="address the tensor's physical rows (the fix)")
    a = ap.parse_args()
    if a.what == "write":
        write(a.kit, a.files[0], a.physical_rows)
        return
    k, v = read_rows(a.kit, a.physical_rows)
    if a.what == "read":
        np.save(a.files[0], k)
        np.save(a.files[1], v)
        return
    # Decode attention over the probes: probe b singles out token b of the sequences
    # taken in order, and attends over all of its sequence's tokens.
    m, B, H, N, D = load(a.kit)
    q = np.load(os.path.join(a.kit, "probe_q.f32.npy")).astype(np.float64)
    first = np.concatenate([[0], np.cumsum(np.load(os.path.join(a.kit, "seq_lens.npy")))])
    out = np.zeros(q.shape, dtype=F32)
    group = q.shape[1] // H
    for b in range(q.shape[0]):
        s = int(np.searchsorted(first, b, side="right")) - 1
        kk, vv = k[first[s]:first[s + 1]].astype(np.float64), v[first[s]:first[s + 1]].astype(np.float64)
        for hq in range(q.shape[1]):
            logits = kk[:, hq // group] @ q[b, hq] * m["softmax_scale"]
            p = np.exp(logits - logits.max())
            out[b, hq] = (p @ vv[:, hq // group]) / p.sum()
    np.save(a.files[0], out)


if __name__ == "__main__":
    main()
