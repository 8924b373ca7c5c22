"""Independent cross-check of the CPU reference against ml_dtypes.

A small quantizer written here with numpy and ml_dtypes' float4_e2m1fn and
float8_e4m3fn implements the documented block rule (docs/format.md); the C++
reference must produce the same bytes for every block, for both scale rules and
several global scales. Usage: crosscheck_mldtypes.py PATH/TO/nvfp4kv_quantize_blocks
"""
import subprocess
import sys

import ml_dtypes
import numpy as np

F4 = ml_dtypes.float4_e2m1fn
F8 = ml_dtypes.float8_e4m3fn
f32 = np.float32


def e4m3(v):
    # ml_dtypes turns values above 464 into NaN; the format rule is satfinite.
    return np.minimum(v, f32(448)).astype(F8)


def quantize_with(x, sf, gs):
    sf_f = sf.astype(f32)
    block_scale = sf_f * gs
    with np.errstate(divide="ignore"):
        inv = np.where(sf_f == 0, f32(0), f32(1) / block_scale).astype(f32)
    q = (x * inv[:, None]).astype(F4)
    codes = q.view(np.uint8) & 0xF
    xhat = (q.astype(f32) * sf_f[:, None]) * gs
    err = np.zeros(len(x), dtype=f32)
    for i in range(16):  # element order, like the reference
        d = xhat[:, i] - x[:, i]
        err = err + d * d
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8)
    return packed, sf.view(np.uint8), err


def quantize(blocks, gs, rule):
    gs = f32(gs)
    x = np.where(np.isfinite(blocks), blocks, f32(0)).astype(f32)
    target = np.max(np.abs(x), axis=1) * (f32(1) / gs)
    p6, s6, e6 = quantize_with(x, e4m3(target / f32(6)), gs)
    if rule == "standard":
        return p6, s6
    p4, s4, e4 = quantize_with(x, e4m3(target / f32(4)), gs)
    pick4 = e4 < e6
    return np.where(pick4[:, None], p4, p6), np.where(pick4, s4, s6)


def make_blocks(rng, n):
    spread = np.exp2(rng.uniform(-24, 24, size=(n, 1))).astype(f32)
    normal = (rng.standard_normal((n, 16)) * spread).astype(f32)
    heavy = (rng.standard_t(2.5, size=(n, 16)) * spread).astype(f32)
    # Values exactly on E2M1 midpoints of a power-of-two block scale exercise ties.
    mids = np.array([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5, 6], dtype=f32)
    ties = (rng.choice(mids, size=(n, 16)) * rng.choice([-1, 1], size=(n, 16))).astype(f32)
    ties *= np.exp2(rng.integers(-12, 12, size=(n, 1))).astype(f32)
    sparse = normal * (rng.random((n, 16)) < 0.2)
    special = normal.copy()
    special[rng.random((n, 16)) < 0.05] = np.nan
    special[rng.random((n, 16)) < 0.03] = np.inf
    special[rng.random((n, 16)) < 0.03] = -np.inf
    zeros = np.zeros((8, 16), dtype=f32)
    return np.concatenate([normal, heavy, ties, sparse, special, zeros]).astype(f32)


def main():
    tool = sys.argv[1]
    rng = np.random.default_rng(20261202)
    blocks = make_blocks(rng, 4000)
    total = 0
    failures = 0
    for gs in [1.0, 1.0 / 2688, 0.37, 1e-3, 3.0e2, float(np.max(np.abs(blocks[np.isfinite(blocks)]))) / 2688]:
        for rule in ["standard", "4over6"]:
            out = subprocess.run([tool, repr(float(f32(gs))), rule], input=blocks.tobytes(),
                                 capture_output=True, check=True).stdout
            got = np.frombuffer(out, dtype=np.uint8).reshape(-1, 9)
            packed, scales = quantize(blocks, f32(float(f32(gs))), rule)
            bad = np.nonzero((got[:, :8] != packed).any(axis=1) | (got[:, 8] != scales))[0]
            total += len(blocks)
            if len(bad):
                failures += len(bad)
                b = bad[0]
                print(f"MISMATCH gs={gs} rule={rule}: {len(bad)} blocks differ; first block {b}:")
                print("  input    ", blocks[b].tolist())
                print("  reference", got[b].tolist())
                print("  ml_dtypes", packed[b].tolist() + [int(scales[b])])
    print(f"ml_dtypes cross-check: {total - failures} of {total} blocks identical "
          f"(6 global scales x 2 rules x {len(blocks)} blocks)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
