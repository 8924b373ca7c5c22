"""What a newcomer meets first from Python: the errors say what to do, in Python's words."""
import os
import subprocess
import sys
import sysconfig

import numpy as np
import pytest

import nvfp4kv
from nvfp4kv import conformance

SIZES = dict(layers=1, pages=16, tokens_per_page=16, heads=2, head_dim=128)


@pytest.mark.skipif(nvfp4kv.cuda_available()[0], reason="a CUDA GPU is here: the default device works")
def test_the_default_device_without_a_gpu_says_use_cpu():
    plan = nvfp4kv.plan(layers=2, kv_heads=2, head_dim=128, pages=4)
    with pytest.raises(nvfp4kv.UnsupportedError, match=r"use device='cpu'"):
        nvfp4kv.Cache(plan)
    assert nvfp4kv.Cache(plan, device="cpu").device == "cpu"


def test_dtypes_are_named_as_numpy_names_them():
    cache = nvfp4kv.Cache(nvfp4kv.plan(layers=1, kv_heads=2, head_dim=128, pages=4), device="cpu")
    k = np.zeros((3, 2, 128), np.float64)
    with pytest.raises(nvfp4kv.ArgumentError, match=r"k: expected .*got a cpu float64 array of shape \(3, 2, 128\)") as e:
        cache.store(k, k, np.arange(3, dtype=np.int64), 0)
    assert "code" not in str(e.value)


def test_a_list_where_an_array_belongs_is_said_plainly():
    cache = nvfp4kv.Cache(nvfp4kv.plan(layers=1, kv_heads=2, head_dim=128, pages=4), device="cpu")
    k = np.zeros((3, 2, 128), np.float32)
    with pytest.raises(TypeError, match=r"expected an array .*got a list; np.asarray"):
        cache.store(k, k, [0, 1, 2], 0)
    kit = conformance.gen(nvfp4kv.load("vllm-packed-nhd-rows", **SIZES))
    with pytest.raises(TypeError, match=r"expected an array .*got a list"):
        conformance.check_read_rows(kit, kit.expected_k.tolist(), kit.expected_v)


def test_errors_name_keyword_arguments_not_cli_flags(tmp_path):
    with pytest.raises(nvfp4kv.LayoutError) as e:
        nvfp4kv.load("vllm-legacy-hnd", layers=1)
    assert "pages=" in str(e.value) and "--" not in str(e.value)
    kit = conformance.gen(nvfp4kv.load("vllm-packed-nhd-rows", **SIZES), tmp_path / "kit")
    with pytest.raises(nvfp4kv.ArgumentError) as e:
        conformance.load_kit(tmp_path / "kit", nvfp4kv.load("vllm-legacy-nhd", **SIZES))
    assert "layout=" in str(e.value) and "--" not in str(e.value), str(e.value)
    del kit


def test_arrays_kept_past_exit_report_no_leak():
    code = ("import numpy as np, nvfp4kv\n"
            "c = nvfp4kv.Cache(nvfp4kv.plan(layers=1, kv_heads=2, head_dim=128, pages=4), device='cpu')\n"
            "b, g = np.from_dlpack(c.buffer(0)), np.from_dlpack(c.global_scales)\n"
            "views = [c.buffer(0), c.global_scales]\n"
            "del c\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/")
    assert run.returncode == 0, run.stderr
    assert "leak" not in run.stderr, run.stderr


def test_pip_installs_the_nvfp4kv_command_with_the_build_facts():
    exe = os.path.join(sysconfig.get_path("scripts"), "nvfp4kv")
    assert os.access(exe, os.X_OK), "pip install . put no nvfp4kv command in " + sysconfig.get_path("scripts")
    out = subprocess.run([exe, "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == nvfp4kv.build_info  # the version, CUDA version and GPU targets, or CPU only
    assert out.startswith("nvfp4kv " + nvfp4kv.__version__ + ": ")
    assert ("CUDA kernels for sm_" in out) == nvfp4kv.has_cuda, out


def test_as_e4m3_needs_only_declared_dependencies():
    from importlib import metadata
    assert any(r.startswith("ml_dtypes") or r.startswith("ml-dtypes") for r in metadata.requires("nvfp4kv"))
    codes = nvfp4kv.reference.as_e4m3(np.array([0x38], np.uint8))
    assert float(codes[0]) == 1.0
