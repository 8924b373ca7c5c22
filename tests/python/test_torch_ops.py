"""nvfp4kv.torch_ops: store and decode as torch.library custom ops. torch.compile traces a step
that stores and attends with no graph break and gives the eager result; the output is attention
over the reference-dequantized K/V; on the GPU the compiled step is captured in a CUDA graph."""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="nvfp4kv.torch_ops needs PyTorch")

import nvfp4kv  # noqa: E402
from nvfp4kv import reference, torch_ops  # noqa: E402

K_SCALE, V_SCALE = 0.004, 0.003


def setup(device):
    cache = nvfp4kv.Cache(nvfp4kv.plan(layers=2, kv_heads=2, head_dim=64, pages=8), device)
    cache.set_global_scales(K_SCALE, V_SCALE)
    handle = torch_ops.register(cache)
    g = torch.Generator().manual_seed(0)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    q, k, v = (torch.randn(*shape, generator=g).to(device, dtype) for shape in ((1, 4, 64), (20, 2, 64), (20, 2, 64)))
    pages = [3, 1]
    slots = torch.tensor([pages[t // 16] * 16 + t % 16 for t in range(20)], dtype=torch.int64, device=device)
    table = torch.tensor([pages], dtype=torch.int32, device=device)
    lens = torch.tensor([20], dtype=torch.int32, device=device)
    buffers = torch_ops.pages(handle, 1)

    def step(q, k, v):
        torch.ops.nvfp4kv.store(buffers, k, v, slots, handle, 1, "standard")
        return torch.ops.nvfp4kv.decode(buffers, q, table, lens, handle, 1, 0.125, 0, 0.0) * 2.0

    return handle, step, (q, k, v)


def expected(q, k, v):
    """2 x attention of q over the K/V the reference quantizes and dequantizes, in float64."""
    kd = reference.dequantize(*reference.quantize(k.float().cpu().numpy(), K_SCALE), K_SCALE).astype(np.float64)
    vd = reference.dequantize(*reference.quantize(v.float().cpu().numpy(), V_SCALE), V_SCALE).astype(np.float64)
    kd, vd = np.repeat(kd, 2, axis=1), np.repeat(vd, 2, axis=1)
    logits = np.einsum("hd,thd->ht", q[0].float().cpu().numpy().astype(np.float64), kd) * 0.125
    p = np.exp(logits - logits.max(1, keepdims=True))
    return 2.0 * np.einsum("ht,thd->hd", p / p.sum(1, keepdims=True), vd)


def test_a_compiled_step_has_no_graph_break_and_the_eager_result():
    handle, step, args = setup("cpu")
    try:
        eager = step(*args)
        torch._dynamo.reset()
        assert torch._dynamo.explain(step)(*args).graph_break_count == 0
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")(*args)
        assert torch.equal(compiled, eager)
        want = expected(*args)
        np.testing.assert_allclose(eager[0].numpy(), want, rtol=0, atol=1e-5 * np.abs(want).max())
    finally:
        torch_ops.unregister(handle)


def test_an_unknown_handle_is_named():
    with pytest.raises(ValueError, match="no cache has handle 987654"):
        torch_ops.pages(987654, 0)


@pytest.mark.gpu
def test_the_compiled_step_is_captured_in_a_cuda_graph():
    handle, step, args = setup("cuda")
    try:
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            eager = compiled(*args)  # warm-up: the decode workspace is sized here
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = compiled(*args)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, eager)
        want = expected(*args)
        np.testing.assert_allclose(out[0].float().cpu().numpy(), want, rtol=0, atol=2e-2 * np.abs(want).max())
    finally:
        torch_ops.unregister(handle)
