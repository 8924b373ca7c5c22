"""nvfp4kv: NVFP4 KV caches whose layout is a value.

A layout maps every (layer, page, token, side, head, column) of a paged cache to
(buffer, byte). ``check`` proves one sound (in bounds, no byte owned twice)
before anything may use it; a ``Cache`` exists only for a proven layout, and
its store, gather and decode-attention kernels ask that one layout for every byte.

    import nvfp4kv
    plan = nvfp4kv.plan(layers=32, kv_heads=8, head_dim=128, memory_bytes=8 << 30)
    cache = nvfp4kv.Cache(plan, device="cuda")
    cache.store(k, v, slot_mapping, layer)          # (tokens, heads, D) bf16 rows
    cache.decode(q, block_table, seq_lens, layer, out)

``nvfp4kv.conformance`` checks an engine's own writer and reader against the
layout it claims (docs/conformance.md). Tensors cross through DLPack (PyTorch,
CuPy, JAX, NumPy) without a copy.
``has_cuda`` says whether this build has the CUDA kernels; without them
layouts, planning and the CPU reference (host caches) all work.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from . import _core, _streams, reference
from ._core import (
    ArgumentError,
    BufferInfo,
    CheckReport,
    CompareReport,
    CudaError,
    Dims,
    Error,
    Layout,
    LayoutError,
    LayoutSpec,
    Misplacement,
    Plan,
    UnsupportedError,
    ValidLayout,
)

__version__ = "0.1.0"
has_cuda: bool = _core.has_cuda
"""Whether this build has the CUDA kernels (nvcc was found when it was built)."""
build_info: str = _core.build_info
"""What this build contains, e.g. "nvfp4kv 0.1.0: CUDA kernels for sm_90a, ...". """

__all__ = [
    "ArgumentError", "BufferInfo", "Cache", "CheckReport", "CompareReport", "CudaError", "Dims", "Error",
    "Layout", "LayoutError", "LayoutRejected", "LayoutSpec", "Misplacement", "Plan", "UnsupportedError",
    "ValidLayout", "build_info", "calibrate", "check", "load_calibration", "with_format", "check_report", "compare", "cuda_available", "from_json",
    "conformance", "has_cuda", "load", "load_spec", "plan", "presets", "reference", "show",
]


class LayoutRejected(LayoutError):
    """check() refused a layout. ``report`` is the CheckReport: ``problems`` (the
    first is the verdict), ``collision`` (two elements and the byte they share)."""

    def __init__(self, layout_name: str, report: CheckReport):
        super().__init__("layout \"%s\" %s" % (layout_name, report.summary()))
        self.report = report


def cuda_available() -> Tuple[bool, str]:
    """(True, "") when a GPU that runs the kernels is here, else (False, why)."""
    ok, why = _core.cuda_device_available()
    return bool(ok), str(why)


# ---- layouts -------------------------------------------------------------------
def presets() -> List[Tuple[str, str]]:
    """(name, summary) of every built-in layout (layouts/*.json)."""
    return _core.list_presets()


def load_spec(name_or_path: str) -> LayoutSpec:
    """A preset by name, or a JSON layout description by path; sizes may stay open."""
    return _core.load_spec(str(name_or_path))


def load(name_or_path: str, *, layers: Optional[int] = None, pages: Optional[int] = None,
         tokens_per_page: Optional[int] = None, heads: Optional[int] = None,
         head_dim: Optional[int] = None, k_element: Optional[str] = None,
         v_element: Optional[str] = None) -> Layout:
    """A concrete Layout from a preset name or a JSON file, binding the sizes the
    description leaves open (given ones override its defaults) and, with k_element /
    v_element ("nvfp4" or "fp8_e4m3"), what each side's bytes hold. Not yet checked."""
    return _instantiate(load_spec(name_or_path), layers, pages, tokens_per_page, heads, head_dim, k_element, v_element)


def from_json(text: str, *, layers: Optional[int] = None, pages: Optional[int] = None,
              tokens_per_page: Optional[int] = None, heads: Optional[int] = None,
              head_dim: Optional[int] = None, k_element: Optional[str] = None,
              v_element: Optional[str] = None) -> Layout:
    """A concrete Layout from JSON text (docs/layouts.md), as ``load``."""
    return _instantiate(_core.parse_layout_spec(text), layers, pages, tokens_per_page, heads, head_dim, k_element,
                        v_element)


def _instantiate(spec: LayoutSpec, layers, pages, tokens_per_page, heads, head_dim, k_element=None,
                 v_element=None) -> Layout:
    # The library's messages name the CLI's flags; _core says them as keyword arguments.
    return spec.instantiate(layers=layers, pages=pages, tokens_per_page=tokens_per_page, heads=heads,
                            head_dim=head_dim, k_element=k_element, v_element=v_element)


def check_report(layout: Layout) -> CheckReport:
    """The proof's report without raising (``report.ok`` says the verdict)."""
    report, _ = _core.check(_as_layout(layout))
    return report


def check(layout: Union[Layout, ValidLayout, Plan]) -> ValidLayout:
    """Prove a layout sound, exactly over the whole allocation, or raise
    LayoutRejected carrying the diagnostics (``.report``)."""
    if isinstance(layout, ValidLayout):
        return layout
    if isinstance(layout, Plan):
        return layout.layout
    report, valid = _core.check(layout)
    if valid is None:
        raise LayoutRejected(layout.name, report)
    return valid


def with_format(layout: Union[Layout, ValidLayout, Plan], format: Any) -> ValidLayout:
    """The proven layout with a cache format attached (docs/format.md, "Cache formats"): what
    each tensor's bytes mean (NVFP4 or FP8 E4M3, scale rule, Hadamard rotation, K smoothing, K's
    channel scale). ``format`` is a dict in the format's JSON form (``k_mean`` and
    ``k_channel_scale`` may be numpy arrays, any shape, C order), its JSON text, or a path to a file holding it. Checked against the layout's sizes;
    a bad field raises LayoutError naming it. A Cache over the result stores and reads through
    the format (the CPU reference and the CUDA kernels implement every format; decode and the
    mixed call's decode routes read FP8 beside NVFP4 only in the native layouts' fp16-split
    code order)."""
    import json as _json
    valid = check(layout)
    if isinstance(format, dict):
        doc = dict(format)
        doc.setdefault("nvfp4kv_format", 1)
        for key in ("k_mean", "k_channel_scale"):
            if key in doc and doc[key] is not None:
                # JSON has no NaN or Inf: they travel as text, which the parser refuses naming the element.
                doc[key] = [float(x) if math.isfinite(x) else repr(float(x)) for x in _np_flat(doc[key])]
        text = _json.dumps(doc)
    elif isinstance(format, os.PathLike) or (isinstance(format, str) and not format.lstrip().startswith("{")):
        with open(format, "r", encoding="utf-8") as f:
            text = f.read()
    elif isinstance(format, str):
        text = format
    else:
        raise TypeError("with_format: format must be a dict, JSON text or a path, got %s" % type(format).__name__)
    return _core._with_format(valid, text)


def calibrate(samples: Any, bits: float = 4.5, out: Optional[str] = None,
              model_kl: Optional[Dict[str, Sequence[float]]] = None) -> Dict[str, Any]:
    """A calibration (docs/calibration.md) from post-RoPE K/V samples: ``samples`` is a path to an
    .npz (numpy.savez) or a .safetensors file, read as ``nvfp4kv calibrate`` reads it (float32,
    float16 or bf16: in an .npz bf16 as uint16 bit patterns), or a mapping of arrays k_0, v_0, k_1,
    v_1, ... (tokens, kv heads, D), with optional q_0, ... (tokens, q heads, D), taken as float32.
    Per layer: K/V amax, global scales, the K mean, the error of every NVFP4 mode, and the
    recommended format for ``bits`` bits per value (FP8 for K on the layers of largest error while
    the budget allows). ``model_kl``: {"k": [...], "v": [...]}, per layer the model-level
    sensitivity of its K and of its V (the model's mean next-token KL divergence when only that
    layer's K, or only its V, is quantized), recorded in the file and ranking the layers for FP8
    instead of the attention error. Written to ``out`` when given (only after every array was
    checked); returned as a dict. From a transformers model and a text (which measures model_kl
    too): nvfp4kv.transformers.calibrate."""
    import json as _json
    import numpy as _np
    if not 4.5 <= float(bits) <= 8.0:  # before any file is read or array copied
        raise ArgumentError("calibrate: --bits: a budget of bits per value in [4.5, 8] (NVFP4 to FP8), got %g"
                            % float(bits))
    kl = {"k": [], "v": []}
    if model_kl is not None:
        if not hasattr(model_kl, "keys") or sorted(model_kl.keys()) != ["k", "v"]:
            raise ArgumentError("calibrate: model_kl: a mapping {\"k\": [...], \"v\": [...]} (one value per layer "
                                "each), got %r" % (model_kl,))
        kl = {side: [float(x) for x in model_kl[side]] for side in "kv"}
    if isinstance(samples, (str, os.PathLike)):
        text = _core._calibrate_file(os.fspath(samples), float(bits), kl["k"], kl["v"])
    else:
        arrays = {}
        for name, a in samples.items():
            if hasattr(a, "detach"):  # a PyTorch tensor, bfloat16 included
                a = a.detach().float().cpu().numpy()
            a = _np.asarray(a)
            if a.dtype.kind != "f" and a.dtype.name != "bfloat16":  # ml_dtypes' bfloat16 converts exactly
                raise ArgumentError("calibrate: %s holds %s values; arrays are float32, float16 or bfloat16 (bf16 bit "
                                    "patterns as uint16 are read from files, not from arrays)" % (name, a.dtype))
            arrays[str(name)] = _np.ascontiguousarray(a, dtype=_np.float32)
        text = _core._calibrate(arrays, float(bits), kl["k"], kl["v"])
    if out is not None:
        with open(out, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    return _json.loads(text)


def load_calibration(path: str, *, layers: int = 0, kv_heads: int = 0, head_dim: int = 0) -> Dict[str, Any]:
    """A calibration file, checked field by field (a malformed or newer file raises LayoutError
    naming the field) and, given the sizes, against a cache's layers, kv heads and head dim
    (ArgumentError saying which differs)."""
    import json as _json
    return _json.loads(_core._load_calibration(str(path), layers, kv_heads, head_dim))


def _np_flat(x: Any):
    import numpy as _np
    return _np.asarray(x, dtype=_np.float32).reshape(-1)


def compare(writer: Union[Layout, ValidLayout], reader: Union[Layout, ValidLayout],
            max_examples: int = 5) -> CompareReport:
    """Writer against reader: the elements the two place at different
    (buffer, byte), counted exactly over all layers and pages. Run it before
    letting one engine's reader attend over another's writes."""
    return _core.compare(_as_layout(writer), _as_layout(reader), max_examples)


def plan(*, layers: int, kv_heads: int, head_dim: int, tokens_per_page: int = 16,
         memory_bytes: Optional[int] = None, pages: Optional[int] = None, tp_size: int = 1, tp_rank: int = 0,
         cross_layer: bool = False, interleave_v_scales: bool = False, k_element: str = "nvfp4",
         v_element: str = "nvfp4") -> Plan:
    """nvfp4kv's native layout for this rank: from a memory budget (all layers)
    or a page count to a proven layout, bytes per page and token capacity. k_element and
    v_element ("nvfp4" or "fp8_e4m3") say what each side's bytes hold: FP8 rows are D bytes
    with no block scales (the global scale is the per-tensor scale)."""
    return _core.plan(layers, kv_heads, head_dim, tokens_per_page, memory_bytes, pages, tp_size, tp_rank,
                      cross_layer, interleave_v_scales, k_element, v_element)


def show(layout: Union[Layout, ValidLayout, Plan], layer: int = 0, page: int = 0) -> str:
    """What ``nvfp4kv layout show`` prints: the layout, its verdict and a byte map of one page."""
    concrete = _as_layout(layout)
    report = check_report(concrete)
    d = concrete.dims
    lines = ["%s: %s" % (concrete.name, concrete.summary),
             "dims: layers %d, pages %d, tokens per page %d, heads %d, head dim %d"
             % (d.layers, d.pages, d.tokens_per_page, d.heads, d.head_dim),
             "elements: K %s, V %s" % (d.k_element, d.v_element),
             "buffers: " + ", ".join("%s %d bytes%s" % (b.name, b.bytes, " per layer" if b.per_layer else "")
                                     for b in concrete.buffers),
             "check: " + report.summary(), ""]
    return "\n".join(lines) + concrete.byte_map(layer, page)


def _as_layout(layout: Union[Layout, ValidLayout, Plan]) -> Layout:
    if isinstance(layout, Plan):
        return layout.layout.layout
    if isinstance(layout, ValidLayout):
        return layout.layout
    return layout


# ---- the cache -------------------------------------------------------------------
def _device_of(array: Any) -> Tuple[bool, int]:
    kind, index = array.__dlpack_device__() if hasattr(array, "__dlpack_device__") else (1, 0)
    return int(kind) in (2, 13), int(index)


def _parse_device(device: Any) -> Tuple[bool, int]:
    if isinstance(device, int):
        return True, device
    text = str(device)
    if text == "cpu":
        return False, 0
    if text == "cuda":
        return True, -1
    if text.startswith("cuda:") and text[5:].isdigit():
        return True, int(text[5:])
    raise ValueError("device: expected 'cpu', 'cuda', 'cuda:N' or an ordinal, got %r" % (device,))


def _require_array(a: Any) -> None:
    """A list or a scalar where an array belongs: said plainly, not as nanobind's signature mismatch."""
    if a is not None and not hasattr(a, "__dlpack__") and not hasattr(a, "__array_interface__"):
        raise TypeError("expected an array (NumPy, PyTorch, CuPy, JAX: anything with __dlpack__), got a %s; "
                        "np.asarray(x, dtype=...) makes one" % type(a).__name__)


class Cache:
    """The buffers of one proven layout, its per-layer global scales and status
    counters, and the operations on them.

    ``Cache(layout, device="cuda")`` allocates (zeroed); ``buffers=[...]`` adopts
    caller-owned memory instead: one array per layout buffer, or for a per-layer
    buffer a list of one array per layer (contiguous, >= the buffer's bytes,
    16-byte aligned on the GPU). ``layout`` may be a Layout (checked here: an
    unsound one raises LayoutRejected and no Cache exists), a ValidLayout or a
    Plan. ``device="cpu"`` keeps the cache in host memory and runs the CPU
    reference (NumPy arrays). ``global_scales`` may adopt a (layers, 2) float32
    array of K and V dequant multipliers; otherwise the cache owns one (all 1.0,
    see set_global_scales).

    GPU operations run on ``stream`` (an int, torch/CuPy stream, or
    __cuda_stream__), else on the current stream of the framework whose tensors
    were passed (PyTorch's for torch tensors), else the legacy default stream.
    They never synchronise or allocate, so they can be captured in a CUDA graph.
    Data-dependent problems (bad slots, pages, scales) are counted in ``status()``.
    """

    def __init__(self, layout: Union[Layout, ValidLayout, Plan], device: Any = None, *,
                 buffers: Optional[Sequence[Any]] = None, global_scales: Any = None):
        valid = check(layout)
        if device is None:
            device = "cuda" if buffers is None else None
        if device is None:
            first = buffers[0]
            first = first[0] if isinstance(first, (list, tuple)) else first
            cuda, index = _device_of(first)
        else:
            cuda, index = _parse_device(device)
        if cuda and not has_cuda:
            raise UnsupportedError("device %r: this nvfp4kv was built without CUDA (%s): use device='cpu'"
                                   % (device, build_info))
        if cuda and buffers is None:
            ok, why = _core.cuda_device_available()
            if not ok:
                raise UnsupportedError("no CUDA GPU (%s): use device='cpu' for a cache in host memory run by the "
                                       "CPU reference" % why)
        self._c = _core.Cache(valid, cuda, index, None if buffers is None else list(buffers), global_scales)

    @property
    def layout(self) -> ValidLayout:
        return self._c.layout

    @property
    def dims(self) -> Dims:
        return self._c.layout.dims

    @property
    def device(self) -> str:
        """'cuda:N' or 'cpu'."""
        return self._c.device

    def store(self, k: Any, v: Any, slots: Any, layer: int, *, rule: str = "standard", stream: Any = None,
              k_scale: Any = None, v_scale: Any = None) -> None:
        """Quantize K and V rows into the cache: one launch.

        k, v:   (tokens, heads, D) bf16 or fp16 (fp32 too on a CPU cache); D and
                heads packed, any token stride (the same for both; a multiple of
                8 elements and 16-byte aligned rows on the GPU).
        slots:  (tokens,) int32 or int64: page * tokens_per_page + token; < 0 is
                padding (skipped), >= capacity is skipped and counted.
        layer:  0 <= layer < layers.
        rule:   "standard" or "4over6".
        k_scale, v_scale: optional one-element float32 arrays on the cache's
                device overriding this layer's global scales.
        """
        self._c.store(k, v, slots, layer, rule, self._stream(stream, k, v, slots, k_scale, v_scale), k_scale, v_scale)

    def gather(self, block_table: Any, cu_seqlens: Any, layer: int, k_out: Any, v_out: Any, *,
               stream: Any = None) -> None:
        """Dequantize the pages of a batch to dense rows: sequence i fills rows
        [cu_seqlens[i], cu_seqlens[i+1]) of the outputs.

        block_table: (batch, max_pages) int32 page ids, rows packed.
        cu_seqlens:  (batch + 1,) int32 offsets.
        k_out, v_out: (rows, heads, D) bf16 or fp16 (fp32 too on a CPU cache),
                contiguous; rows >= cu_seqlens[-1] (on the GPU the caller's
                promise: the offsets live in device memory). Entries outside
                [0, pages) give NaN rows and are counted in status()["bad_pages"].
        """
        self._c.gather(block_table, cu_seqlens, layer, k_out, v_out, self._stream(stream, k_out, block_table, cu_seqlens, v_out))

    def decode(self, q: Any, block_table: Any, seq_lens: Any, layer: int, out: Any, *,
               cu_seqlens: Any = None, softmax_scale: Optional[float] = None, window: int = 0,
               softcap: float = 0.0, sinks: Any = None, lse: Any = None, workspace: Any = None,
               stream: Any = None) -> None:
        """Paged decode attention, one query token per sequence, over this layer's pages:
        out[b, h] = sum_t softmax_t(softcap(softmax_scale * q[b, h] . K[t, h / G])) V[t, h / G]
        with G = q_heads / kv heads (1 to 16), K and V the dequantized cache.

        q:           (batch, q_heads, D) bf16 or fp16 (fp32 too on a CPU cache), heads packed,
                     any row stride (a multiple of 8 elements on the GPU).
        block_table: (batch, max_pages) int32 page ids, rows packed.
        seq_lens:    (batch,) int32 lengths, or None and cu_seqlens (batch + 1,) int32 offsets.
        out:         (batch, q_heads, D) of q's dtype, contiguous.
        softmax_scale: default 1 / sqrt(D). window > 0: the last `window` tokens only;
        softcap > 0: logits become softcap * tanh(logit / softcap); sinks: (q_heads,)
        float32 logits that join the denominator only; lse: (batch, q_heads) float32
        output, the natural log of the denominator.
        workspace:   uint8 device array of >= decode_workspace_bytes(...) bytes, 256-byte
                     aligned; by default the cache keeps one, grown on first use of a
                     larger shape (so run a shape once before capturing it in a CUDA graph).
        Bad pages, lengths or scales give NaN outputs and are counted in status().
        """
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.dims.head_dim)
        stream = self._stream(stream, q, out, block_table, seq_lens, cu_seqlens, sinks, lse, workspace)
        self._c.decode(q, block_table, seq_lens, cu_seqlens, layer, out, float(softmax_scale), int(window),
                       float(softcap), sinks, lse, workspace, stream)

    def decode_workspace_bytes(self, batch: int, q_heads: int, block_table_stride: int) -> int:
        """Workspace bytes a GPU decode of this shape needs (0: sequences are not split)."""
        return self._c.decode_workspace_bytes(batch, q_heads, block_table_stride)

    def attention(self, q: Any, cu_seqlens_q: Any, q_lens: Any, block_table: Any, seq_lens: Any, layer: int,
                  out: Any, *, cu_seqlens: Any = None, softmax_scale: Optional[float] = None, window: int = 0,
                  softcap: float = 0.0, sinks: Any = None, lse: Any = None, workspace: Any = None,
                  stream: Any = None) -> None:
        """Paged attention for one forward's batch of any q lengths (prefill, extend, chunked
        prefill, speculative verification and decode together), causal over this layer's pages.
        Sequence s has q_lens[s] new tokens, rows cu_seqlens_q[s] .. of q and out, and seq_lens[s]
        tokens in its pages, the new ones included (store them first); its query i sits at
        position seq_lens[s] - q_lens[s] + i and attends to the tokens up to it (the last `window`
        of them with a window). On the GPU, runs of q length 1 go to decode attention and the
        others to the prefill kernel.

        q:            (rows, q_heads, D) bf16 or fp16 (fp32 too on a CPU cache), rows = sum(q_lens).
        cu_seqlens_q: (batch + 1,) int32 row offsets, on the cache's device.
        q_lens:       the same lengths as a host sequence of ints (they choose the kernels).
        block_table:  (batch, max_pages) int32; seq_lens: (batch,) int32 kv lengths, or None and
                      cu_seqlens (batch + 1,) int32 offsets.
        out:          (rows, q_heads, D) of q's dtype, contiguous; lse: (rows, q_heads) float32.
        Options and workspace as decode (attention_workspace_bytes). Bad pages or lengths (a q
        length above its kv length included) give NaN rows and are counted in status().
        """
        if softmax_scale is None:
            softmax_scale = 1.0 / math.sqrt(self.dims.head_dim)
        stream = self._stream(stream, q, out, cu_seqlens_q, block_table, seq_lens, cu_seqlens, sinks, lse, workspace)
        self._c.attention(q, cu_seqlens_q, [int(n) for n in q_lens], block_table, seq_lens, cu_seqlens, layer, out,
                          float(softmax_scale), int(window), float(softcap), sinks, lse, workspace, stream)

    def attention_workspace_bytes(self, q_lens: Any, q_heads: int, block_table_stride: int) -> int:
        """Workspace bytes a GPU attention call over these q lengths needs (0: none)."""
        return self._c.attention_workspace_bytes([int(n) for n in q_lens], q_heads, block_table_stride)

    def status(self) -> Dict[str, int]:
        """The counters every call adds to (synchronises with the device):
        stored, padding, out_of_range, non_finite, bad_pages, bad_global_scale, bad_lengths."""
        return self._c.status()

    def reset_status(self, stream: Any = None) -> None:
        """Zero the counters (asynchronously on the GPU; capturable)."""
        self._c.reset_status(self._stream(stream))

    def set_global_scales(self, k: Union[float, Sequence[float]], v: Union[float, Sequence[float]]) -> None:
        """Set the K and V dequant multipliers of every layer (one float for all,
        or one per layer); e.g. reference.recommend_global_scale(amax). Setup
        time: copies synchronously."""
        layers = self.dims.layers
        ks = [float(k)] * layers if isinstance(k, (int, float)) else [float(x) for x in k]
        vs = [float(v)] * layers if isinstance(v, (int, float)) else [float(x) for x in v]
        self._c.set_global_scales(ks, vs)

    @property
    def global_scales(self) -> Any:
        """(layers, 2) float32 on the cache's device: [layer, 0] is K's dequant
        multiplier, [layer, 1] V's. A DLPack array (NumPy on the CPU); writes
        through it (torch.from_dlpack(...).copy_(...)) are seen by the next call."""
        return self._c.global_scales()

    def buffer(self, index: int = 0, layer: int = 0) -> Any:
        """One allocation as a flat uint8 DLPack array (NumPy on the CPU): buffer
        ``index`` of the layout, ``layer``'s one when it is per layer."""
        return self._c.buffer(index, layer)

    def _stream(self, stream: Any, *arrays: Any) -> int:
        for a in arrays:  # every call passes its arrays here first
            _require_array(a)
        return _streams.resolve(stream, *arrays) if self.device != "cpu" else 0

    def __repr__(self) -> str:
        return "<nvfp4kv.Cache '%s' on %s>" % (self.layout.name, self.device)


# After everything above: nvfp4kv.conformance uses check() and load().
from . import conformance  # noqa: E402
