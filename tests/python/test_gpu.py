"""The GPU through the Python front end, with PyTorch tensors (and CuPy and
JAX where installed): stores and gathers bit-exact with the CPU reference on
the same front end, decode attention and mixed-batch attention within the bounds
tests/gpu/test_decode.cpp measured against the fp64 reference, PyTorch's current stream, CUDA graphs, and
the argument checks that run before any launch. Skipped without a GPU."""
import os

import numpy as np
import pytest

import nvfp4kv

pytestmark = pytest.mark.gpu

DIMS = dict(layers=2, pages=64, heads=2, tokens_per_page=16, head_dim=128)
# tests/gpu/test_decode.cpp: measured worst cases against the fp64 reference, with a margin.
REL_L2_BOUND = {"bfloat16": 6e-3, "float16": 2e-3}


@pytest.fixture(scope="module")
def torch():
    import torch

    torch.manual_seed(0)
    return torch


def twins(torch, preset, **dims):
    """The same layout on the GPU and in host memory, with the same global scales."""
    layout = nvfp4kv.check(nvfp4kv.load(preset, **{**DIMS, **dims}))
    gpu, cpu = nvfp4kv.Cache(layout, "cuda"), nvfp4kv.Cache(layout, "cpu")
    for c in (gpu, cpu):
        c.set_global_scales([0.003, 0.0021], [0.0017, 0.004])
    return gpu, cpu


def device_bytes(torch, cache, index, layer):
    return torch.from_dlpack(cache.buffer(index, layer)).cpu().numpy()


def kv_rows(torch, tokens, dtype, heads=2, dim=128):
    k = (torch.randn(tokens, heads, dim, device="cuda") * 3).to(dtype)
    v = (torch.randn(tokens, heads, dim, device="cuda") * torch.rand(tokens, 1, 1, device="cuda") * 4).to(dtype)
    return k, v


@pytest.mark.parametrize("preset", ["nvfp4kv-native", "trtllm", "flashinfer-nhd", "vllm-legacy-hnd-writer-upstream"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_store_and_gather_are_bit_exact_with_the_reference(torch, preset, dtype):
    gpu, cpu = twins(torch, preset)
    k, v = kv_rows(torch, 300, getattr(torch, dtype))
    slots = torch.randperm(64 * 16, device="cuda")[:300]
    slots[5] = -1  # padding
    for rule in ("standard", "4over6"):
        layer = 1 if rule == "standard" else 0
        gpu.store(k, v, slots, layer, rule=rule)
        cpu.store(k.cpu(), v.cpu(), slots.cpu(), layer, rule=rule)
    torch.cuda.synchronize()
    for i in range(len(gpu.layout.layout.buffers)):
        for layer in range(2):
            np.testing.assert_array_equal(device_bytes(torch, gpu, i, layer), cpu.buffer(i, layer))
    assert gpu.status() == cpu.status()
    pages = torch.unique(slots[slots >= 0] // 16).to(torch.int32)
    table = pages[None, :].contiguous()
    cu = torch.tensor([0, pages.numel() * 16], dtype=torch.int32, device="cuda")
    outs = [torch.full((pages.numel() * 16, 2, 128), float("nan"), dtype=k.dtype, device="cuda") for _ in range(2)]
    gpu.gather(table, cu, 1, *outs)
    host = [o.cpu() for o in outs]
    cpu.gather(table.cpu(), cu.cpu(), 1, *host)
    torch.cuda.synchronize()
    for o, h in zip(outs, host):
        assert torch.equal(o.cpu().view(torch.int16), h.view(torch.int16))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_decode_matches_the_fp64_reference(torch, dtype):
    gpu, cpu = twins(torch, "nvfp4kv-native")
    lengths = [37, 200, 1, 64]
    pages = torch.randperm(64, device="cuda").to(torch.int32)
    table = torch.zeros(4, 13, dtype=torch.int32, device="cuda")
    slots, used = [], 0
    for b, n in enumerate(lengths):
        need = (n + 15) // 16
        table[b, :need] = pages[used:used + need]
        used += need
        slots.append((table[b, torch.arange(n, device="cuda") // 16].long() * 16 + torch.arange(n, device="cuda") % 16))
    slots = torch.cat(slots)
    k, v = kv_rows(torch, slots.numel(), getattr(torch, dtype))
    gpu.store(k, v, slots, 0)
    cpu.store(k.cpu(), v.cpu(), slots.cpu(), 0)
    q = torch.randn(4, 8, 128, device="cuda").to(getattr(torch, dtype))
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, 8), float("nan"), device="cuda")
    sinks = torch.randn(8, device="cuda")
    gpu.decode(q, table, seq_lens, 0, out, lse=lse, sinks=sinks)
    ref = np.zeros((4, 8, 128), np.float32)
    ref_lse = np.zeros((4, 8), np.float32)
    cpu.decode(q.float().cpu().numpy(), table.cpu().numpy(), np.array(lengths, np.int32), 0, ref, lse=ref_lse,
               sinks=sinks.cpu().numpy())
    got = out.float().cpu().numpy()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_BOUND[dtype], rel
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-3)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_attention_of_a_mixed_batch_matches_the_fp64_reference(torch, dtype):
    """Cache.attention: q lengths 1 (decode), 5 (an extend), 0 and 64 (= its kv length) in one call."""
    gpu, cpu = twins(torch, "nvfp4kv-native")
    lengths, q_lens = [37, 200, 1, 64], [1, 5, 0, 64]
    pages = torch.randperm(64, device="cuda").to(torch.int32)
    table = torch.zeros(4, 13, dtype=torch.int32, device="cuda")
    slots, used = [], 0
    for b, n in enumerate(lengths):
        need = (n + 15) // 16
        table[b, :need] = pages[used:used + need]
        used += need
        slots.append((table[b, torch.arange(n, device="cuda") // 16].long() * 16 + torch.arange(n, device="cuda") % 16))
    slots = torch.cat(slots)
    k, v = kv_rows(torch, slots.numel(), getattr(torch, dtype))
    gpu.store(k, v, slots, 0)
    cpu.store(k.cpu(), v.cpu(), slots.cpu(), 0)
    rows = sum(q_lens)
    cu_q = np.concatenate([[0], np.cumsum(q_lens)]).astype(np.int32)
    q = torch.randn(rows, 8, 128, device="cuda").to(getattr(torch, dtype))
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((rows, 8), float("nan"), device="cuda")
    gpu.attention(q, torch.from_numpy(cu_q).cuda(), q_lens, table, seq_lens, 0, out, lse=lse, window=100)
    ref = np.zeros((rows, 8, 128), np.float32)
    ref_lse = np.zeros((rows, 8), np.float32)
    cpu.attention(q.float().cpu().numpy(), cu_q, q_lens, table.cpu().numpy(), np.array(lengths, np.int32), 0, ref,
                  lse=ref_lse, window=100)
    got = out.float().cpu().numpy()
    rel = np.linalg.norm(got - ref) / np.linalg.norm(ref)
    assert rel < REL_L2_BOUND[dtype], rel
    np.testing.assert_allclose(lse.cpu().numpy(), ref_lse, atol=1e-3)
    assert gpu.status()["bad_lengths"] == 0 and gpu.status()["bad_pages"] == 0


def test_runs_on_pytorch_current_stream(torch):
    gpu, cpu = twins(torch, "nvfp4kv-native")
    src_k, src_v = kv_rows(torch, 64, torch.bfloat16)
    k, v = torch.zeros_like(src_k), torch.zeros_like(src_v)
    slots = torch.arange(64, device="cuda")
    side = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        # The copies wait behind a long sleep on this stream: a store on any other
        # stream would read the zeros and write different bytes.
        torch.cuda._sleep(100_000_000)
        k.copy_(src_k)
        v.copy_(src_v)
        gpu.store(k, v, slots, 0)
    side.synchronize()
    cpu.store(src_k.cpu(), src_v.cpu(), slots.cpu(), 0)
    np.testing.assert_array_equal(device_bytes(torch, gpu, 0, 0), cpu.buffer(0, 0))
    # an explicit stream argument is used as given
    other = torch.cuda.Stream()
    gpu.store(k, v, slots, 1, stream=other)
    other.synchronize()
    cpu.store(src_k.cpu(), src_v.cpu(), slots.cpu(), 1)
    np.testing.assert_array_equal(device_bytes(torch, gpu, 0, 1), cpu.buffer(0, 1))


def test_a_decode_step_replays_as_a_cuda_graph(torch):
    gpu, _ = twins(torch, "nvfp4kv-native")
    batch, q_heads = 3, 8
    k_in, v_in = torch.zeros(batch, 2, 128, dtype=torch.bfloat16, device="cuda"), torch.zeros(
        batch, 2, 128, dtype=torch.bfloat16, device="cuda")
    q = torch.zeros(batch, q_heads, 128, dtype=torch.bfloat16, device="cuda")
    slots = torch.zeros(batch, dtype=torch.int64, device="cuda")
    table = torch.arange(batch * 20, dtype=torch.int32, device="cuda").reshape(batch, 20)
    seq_lens = torch.ones(batch, dtype=torch.int32, device="cuda")
    out = torch.zeros_like(q)

    def step():
        gpu.store(k_in, v_in, slots, 0)
        gpu.decode(q, table, seq_lens, 0, out)

    def feed(t, seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        k_in.copy_(torch.randn(k_in.shape, generator=g, device="cuda"))
        v_in.copy_(torch.randn(v_in.shape, generator=g, device="cuda"))
        q.copy_(torch.randn(q.shape, generator=g, device="cuda"))
        slots.copy_(table[:, t // 16].long() * 16 + t % 16)
        seq_lens.fill_(t + 1)

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: sizes the decode workspace before capture
        feed(0, 0)
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    eager_cache, _ = twins(torch, "nvfp4kv-native")
    eager_out = torch.zeros_like(out)
    for t in range(40):  # t = 0 again: the eager cache gets the warm-up's token too
        feed(t, t)
        out.fill_(float("nan"))
        eager_out.fill_(float("nan"))
        graph.replay()
        eager_cache.store(k_in, v_in, slots, 0)
        eager_cache.decode(q, table, seq_lens, 0, eager_out)
        torch.cuda.synchronize()
        assert torch.equal(out, eager_out), t


def test_argument_errors_come_before_any_launch(torch):
    gpu, _ = twins(torch, "nvfp4kv-native")
    k, v = kv_rows(torch, 8, torch.bfloat16)
    slots = torch.arange(8, device="cuda")
    padded = torch.zeros(8, 260, dtype=torch.bfloat16, device="cuda")[:, :256].unflatten(1, (2, 128))  # stride 260
    cases = [
        ("k: must be on the cache's device cuda:", lambda: gpu.store(k.cpu(), v, slots, 0)),
        ("slots: must be on the cache's device", lambda: gpu.store(k, v, slots.cpu(), 0)),
        ("k: expected bfloat16 or float16", lambda: gpu.store(k.float(), v.float(), slots, 0)),
        ("k: must start at a 16-byte aligned address",
         lambda: gpu.store(torch.zeros(8 * 256 + 1, dtype=torch.bfloat16, device="cuda")[1:].view(8, 2, 128), v, slots, 0)),
        ("k: the token stride must be a multiple of 8", lambda: gpu.store(padded, padded, slots, 0)),
        ("out: must be on the cache's device",
         lambda: gpu.decode(torch.zeros(1, 4, 128, dtype=torch.bfloat16, device="cuda"),
                            torch.zeros(1, 2, dtype=torch.int32, device="cuda"),
                            torch.ones(1, dtype=torch.int32, device="cuda"), 0,
                            torch.zeros(1, 4, 128, dtype=torch.bfloat16))),
    ]
    torch.cuda.synchronize()
    before = device_bytes(torch, gpu, 0, 0)
    for message, call in cases:
        with pytest.raises(nvfp4kv.ArgumentError) as info:
            call()
        assert message in str(info.value), (message, str(info.value))
    torch.cuda.synchronize()
    np.testing.assert_array_equal(device_bytes(torch, gpu, 0, 0), before)
    assert gpu.status()["stored"] == 0


def test_adopting_torch_buffers_and_the_e4m3_view(torch):
    layout = nvfp4kv.check(nvfp4kv.load("flashinfer-hnd", **DIMS))
    owned = [torch.zeros(2, b.bytes, dtype=torch.uint8, device="cuda") for b in layout.layout.buffers]
    cache = nvfp4kv.Cache(layout, buffers=[list(t.unbind(0)) if b.per_layer else t
                                           for t, b in zip(owned, layout.layout.buffers)])
    assert cache.device.startswith("cuda")
    k, v = kv_rows(torch, 16, torch.bfloat16)
    cache.store(k, v, torch.arange(16, device="cuda"), 1)
    torch.cuda.synchronize()
    names = [b.name for b in layout.layout.buffers]
    k_scales = owned[names.index("k_scale")][1]
    assert k_scales.any() and not owned[names.index("k_scale")][0].any()
    view = nvfp4kv.reference.as_e4m3(k_scales)
    assert view.dtype == torch.float8_e4m3fn and view.data_ptr() == k_scales.data_ptr()
    assert torch.equal(view.view(torch.uint8), k_scales)
    # global scales written through DLPack are what the next call reads
    torch.from_dlpack(cache.global_scales)[1].fill_(0.5)
    assert float(torch.from_dlpack(cache.global_scales)[1, 0]) == 0.5


def test_cupy_arrays_cross_without_a_copy(torch):
    cupy = pytest.importorskip("cupy")
    gpu, cpu = twins(torch, "nvfp4kv-native")
    k, v = kv_rows(torch, 32, torch.float16)
    ck, cv = cupy.from_dlpack(k), cupy.from_dlpack(v)
    assert ck.data.ptr == k.data_ptr()
    gpu.store(ck, cv, cupy.arange(32, dtype=cupy.int32), 0)  # CuPy's current stream
    cupy.cuda.get_current_stream().synchronize()
    cpu.store(k.cpu(), v.cpu(), np.arange(32, dtype=np.int32), 0)
    np.testing.assert_array_equal(cupy.asnumpy(cupy.from_dlpack(gpu.buffer(0, 0))), cpu.buffer(0, 0))


def test_jax_arrays_as_inputs(torch):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    try:
        device = jax.devices("gpu")[0]
    except RuntimeError as e:
        pytest.skip("JAX has no GPU backend here: %s" % e)
    gpu, cpu = twins(torch, "nvfp4kv-native")
    k, v = kv_rows(torch, 16, torch.bfloat16)
    jk, jv = (jax.device_put(jax.dlpack.from_dlpack(t.cpu()), device) for t in (k, v))
    jslots = jax.device_put(jax.numpy.arange(16, dtype=jax.numpy.int32), device)
    for a in (jk, jv, jslots):
        a.block_until_ready()  # JAX runs on its own streams; the store runs on the default one
    gpu.store(jk, jv, jslots, 0)
    torch.cuda.synchronize()
    cpu.store(k.cpu(), v.cpu(), np.arange(16, dtype=np.int32), 0)
    np.testing.assert_array_equal(device_bytes(torch, gpu, 0, 0), cpu.buffer(0, 0))
