"""Which CUDA stream a call runs on: the one given, else the current stream of
the framework whose tensors were passed (PyTorch, CuPy), else the legacy default
stream. Frameworks are looked up by the arrays' types, never imported here
unless the caller's arrays come from them."""
from __future__ import annotations

from typing import Any


def handle(stream: Any) -> int:
    """A stream as the integer cudaStream_t: an int, a torch.cuda.Stream,
    a cupy.cuda.Stream, or anything with __cuda_stream__()."""
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
        return int(stream.cuda_stream)
    if hasattr(stream, "ptr"):  # cupy.cuda.Stream
        return int(stream.ptr)
    raise TypeError(
        "stream: expected an int (cudaStream_t), a torch.cuda.Stream, a cupy.cuda.Stream "
        "or an object with __cuda_stream__, got %s" % type(stream).__name__
    )


def resolve(stream: Any, *arrays: Any) -> int:
    if stream is not None:
        return handle(stream)
    for a in arrays:
        module = type(a).__module__
        if module.startswith("torch") and getattr(a, "is_cuda", False):
            import torch

            return int(torch.cuda.current_stream(a.device).cuda_stream)
        if module.startswith("cupy"):
            import cupy

            return int(cupy.cuda.get_current_stream().ptr)
    return 0
