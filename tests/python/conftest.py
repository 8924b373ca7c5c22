"""pytest configuration: tests marked `gpu` need nvfp4kv's CUDA kernels, a GPU
that runs them and PyTorch with CUDA; elsewhere they are skipped, each with the
reason (pytest -rs prints them)."""
import pytest

import nvfp4kv


def gpu_unavailable_reason():
    if not nvfp4kv.has_cuda:
        return "nvfp4kv was built without CUDA (%s)" % nvfp4kv.build_info
    ok, why = nvfp4kv.cuda_available()
    if not ok:
        return why
    try:
        import torch
    except ImportError:
        return "PyTorch is not installed"
    if not torch.cuda.is_available():
        return "PyTorch sees no CUDA device"
    return None


def pytest_report_header(config):
    reason = gpu_unavailable_reason()
    return ["nvfp4kv: %s" % nvfp4kv.build_info,
            "nvfp4kv GPU tests: " + ("run" if reason is None else "skipped (%s)" % reason)]


def pytest_collection_modifyitems(config, items):
    reason = gpu_unavailable_reason()
    if reason is None:
        return
    skip = pytest.mark.skip(reason="GPU test skipped: " + reason)
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
