"""nvfp4kv in Hugging Face transformers: a KV cache that stays NVFP4 and an attention
function that reads it in place.

    import nvfp4kv.transformers as nt                       # registers attn_implementation "nvfp4kv"
    model = AutoModelForCausalLM.from_pretrained(name, attn_implementation="nvfp4kv")
    cache = nt.KVCache(model.config, max_tokens=4096, device="cuda")
    out = model.generate(**inputs, past_key_values=cache, max_new_tokens=64)

``KVCache.update()`` quantizes each layer's new keys and values into the pages (nvfp4kv's
store: the kernel on a GPU, the bit-identical CPU reference on the host) and hands back no
dequantized copy. The attention function then reads the pages: one query token runs the fused
paged decode (``Cache.decode``); a longer chunk runs paged prefill/extend attention
(``Cache.attention``: the prefill kernel on a GPU, the CPU reference on the host), causal over
each sequence's stored tokens, this chunk's included, so a prefix computed in one chunk or in
many attends to the same quantized K/V. Left-padded batches work: padding tokens are never
stored or attended with, each sequence keeps its own length and block table, and padding rows
come back as zeros.

The cache only works with ``attn_implementation="nvfp4kv"`` (the attention function and its
mask function are registered when this module is imported): any other attention would see only
the new chunk. The attention function refuses to run without the cache, by name.
"""
from __future__ import annotations

import argparse
import json
import re
import math
import os
import sys
import threading
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

import numpy as np
import torch
from transformers import AttentionInterface, AttentionMaskInterface, DynamicCache
from transformers.cache_utils import Cache, CacheLayerMixin

import nvfp4kv

__all__ = ["KVCache", "attention", "padding_mask", "calibrate", "NAME"]

NAME = "nvfp4kv"
"""The attn_implementation name this module registers."""

# Per thread: the padding mask the mask function saw for the forward pass about to run (the
# cache turns it into slots at the first layer's update), and the cache whose update ran last
# (the attention function that follows reads it; transformers hands it no cache argument).
_state = threading.local()


def padding_mask(batch_size: int, q_length: int, kv_length: int, q_offset: int = 0, kv_offset: int = 0,
                 mask_function: Any = None, attention_mask: Optional[torch.Tensor] = None, **kwargs) -> Any:
    """The mask function registered as "nvfp4kv" (AttentionMaskInterface): the 2-D padding mask
    (batch, kv_length) bool, or None when nothing is padded. The cache reads it to leave padding
    out of the pages; causality and windows come from the cache's own positions."""
    mask = None
    if attention_mask is not None:
        mask = attention_mask.to(torch.bool)[:, -kv_length:]
    _state.padding = (mask, q_length)
    return mask


def _kv_dims(config: Any) -> Tuple[int, int, int]:
    """(layers, kv heads, head dim) from a transformers config (the text config of a multimodal one)."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    layers = int(text.num_hidden_layers)
    q_heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or q_heads)
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // q_heads
    return layers, kv_heads, int(head_dim)


def _sliding_layers(config: Any, layers: int) -> List[bool]:
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    types = getattr(text, "layer_types", None)
    if types is None:
        return [False] * layers
    return [t == "sliding_attention" for t in types]


class _Layer(CacheLayerMixin):
    """One model layer's view of the shared KVCache (what transformers' generic code asks a layer)."""

    is_compileable = False
    is_croppable = False
    supports_early_init = False

    def __init__(self, owner: "KVCache", index: int, sliding: bool):
        super().__init__()
        self._owner, self._index, self.is_sliding = owner, index, sliding

    def lazy_initialization(self, key_states, value_states) -> None:
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        return self._owner.update(key_states, value_states, self._index)

    def get_mask_sizes(self, query_length, *args) -> Tuple[int, int]:
        if isinstance(query_length, torch.Tensor):  # older transformers passed cache_position
            query_length = int(query_length.shape[0])
        return self._owner.positions + int(query_length), 0

    def get_seq_length(self) -> int:
        return self._owner.positions

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        self._owner._reset_sequences()

    def reorder_cache(self, beam_idx) -> None:
        raise NotImplementedError("nvfp4kv.transformers.KVCache: beam search is not supported")


def _format_doc(format: Any) -> Optional[Dict[str, Any]]:
    """A cache format (dict, JSON text or path) as a dict, or None where it does not parse (then
    nvfp4kv.with_format, given the original, says why)."""
    try:
        if isinstance(format, dict):
            return dict(format)
        if isinstance(format, os.PathLike) or (isinstance(format, str) and not format.lstrip().startswith("{")):
            with open(format, "r", encoding="utf-8") as f:
                return json.load(f)
        if isinstance(format, str):
            return json.loads(format)
    except (OSError, ValueError):
        return None
    return None


def _element_groups(doc: Optional[Dict[str, Any]], layers: int) -> Dict[Tuple[str, str], List[int]]:
    """The model's layers by (K element, V element) of the format, in order of first appearance.
    A malformed format makes one group: with_format then names what is wrong with it."""
    every = {("nvfp4", "nvfp4"): list(range(layers))}
    entries = doc.get("layers") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or len(entries) not in (1, layers) or \
            not all(isinstance(e, dict) for e in entries):
        return every

    def element(entry: Dict[str, Any], side: str) -> str:
        t = entry.get(side)
        e = t.get("element", "nvfp4") if isinstance(t, dict) else "nvfp4"
        return e if e in ("nvfp4", "fp8_e4m3") else "nvfp4"

    groups: Dict[Tuple[str, str], List[int]] = {}
    for layer in range(layers):
        entry = entries[0 if len(entries) == 1 else layer]
        groups.setdefault((element(entry, "k"), element(entry, "v")), []).append(layer)
    return groups


def _group_format(doc: Dict[str, Any], members: List[int], layers: int, heads: int, dim: int) -> Dict[str, Any]:
    """The format of one group of layers: their entries, and their rows of K's mean and channel scale."""
    out = dict(doc)
    out["layers"] = [doc["layers"][layer] for layer in members]
    for key in ("k_mean", "k_channel_scale"):
        if doc.get(key) is not None:
            x = np.asarray(doc[key], dtype=np.float64).reshape(-1)
            if x.size == layers * heads * dim:  # otherwise with_format names the size
                out[key] = x.reshape(layers, heads, dim)[members].reshape(-1)
    return out


def _without_elements(doc: Dict[str, Any]) -> Dict[str, Any]:
    """The format with every layer's element left to its default (the rest judged as written)."""
    out = dict(doc)
    out["layers"] = [{side: {k: v for k, v in e[side].items() if k != "element"} if isinstance(e.get(side), dict)
                      else e.get(side) for side in e} if isinstance(e, dict) else e for e in doc["layers"]]
    return out


def _with_group_format(valid: Any, doc: Dict[str, Any], members: List[int], layers: int, heads: int,
                       dim: int) -> Any:
    """with_format for one group of layers; an error it raises names the model's layers."""
    try:
        return nvfp4kv.with_format(valid, _group_format(doc, members, layers, heads, dim))
    except Exception as e:  # noqa: BLE001 - re-raised as it came, its layer numbers the model's
        if not e.args or not isinstance(e.args[0], str):
            raise
        text = re.sub(r"layers\[(\d+)\]", lambda m: "layers[%d]" % members[int(m.group(1))]
                      if int(m.group(1)) < len(members) else m.group(0), e.args[0])
        raise type(e)(text, *e.args[1:]) from None


def _layers_of(scales: Any, members: List[int], layers: int) -> Any:
    """Global scales for a group of layers: one value for all, or the members' of a per-layer list
    (a list of another length is passed on whole, and the group's cache says what it needs)."""
    if hasattr(scales, "detach"):  # a torch tensor, on any device: its values on the host
        scales = scales.detach().to("cpu", dtype=torch.float64).numpy()
    a = np.asarray(scales, dtype=np.float64)
    if a.ndim == 0:
        return float(a)
    flat = a.reshape(-1)
    return [float(flat[layer]) for layer in members] if flat.size == layers else [float(x) for x in flat]


class KVCache(Cache):
    """A transformers Cache whose keys and values live in one nvfp4kv cache (all layers).

    config:      the model's config (num_hidden_layers, num_key_value_heads, head_dim).
    max_tokens:  tokens the cache must hold, all sequences together (each sequence also
                 rounds up to whole pages); or memory_bytes, the budget for all layers.
    device:      "cpu" (the CPU reference) or "cuda"/"cuda:N" (the kernels); default: CUDA
                 when nvfp4kv can run its kernels here, else the CPU.
    layout:      None for nvfp4kv's native layout, or a preset name / JSON path / Layout,
                 instantiated for this model's layers, heads and head dim and proven by
                 nvfp4kv.check before anything is stored.
    tokens_per_page: page size (16 by default).
    rule:        the store's scale rule, "standard" or "4over6" (without ``format``).
    format:      the cache format (nvfp4kv.with_format: a dict, JSON text or path): per layer and
                 tensor the element format (NVFP4 or FP8 E4M3), the scale rule, a Hadamard rotation,
                 K smoothing mu and K's channel scale lambda; the writer and every reader take it
                 from the one layout object.
                 Layers whose K/V elements differ live in one native cache per combination
                 (``writers``, ``route(layer)``). The CPU reference and the CUDA kernels implement
                 every format. Its rules replace ``rule``.
    calibration: a calibration file (``nvfp4kv calibrate``): its recommended format and global
                 scales, after checking it was made for this model's layers, kv heads and head dim
                 (a mismatch raises before anything is allocated).
    global_scales: (k, v) dequant multipliers, one float each or one per layer (e.g.
                 nvfp4kv.reference.recommend_global_scale(amax) from calibration); default 1.0.
    dtype:       the precision rows reach the kernels in (torch.bfloat16 or torch.float16;
                 the CPU path converts the same way, so both quantize the same values).
    """

    def __init__(self, config: Any, *, max_tokens: Optional[int] = None, memory_bytes: Optional[int] = None,
                 device: Any = None, layout: Any = None, tokens_per_page: int = 16, rule: str = "standard",
                 global_scales: Optional[Tuple[Any, Any]] = None, dtype: torch.dtype = torch.bfloat16,
                 format: Any = None, calibration: Optional[str] = None):
        layers, kv_heads, head_dim = _kv_dims(config)
        if calibration is not None:
            if format is not None or global_scales is not None:
                raise ValueError("KVCache: calibration= brings the format and the global scales; give neither beside it")
            cal = nvfp4kv.load_calibration(calibration, layers=layers, kv_heads=kv_heads, head_dim=head_dim)
            format = cal["format"]
            global_scales = ([p["k_global_scale"] for p in cal["per_layer"]],
                             [p["v_global_scale"] for p in cal["per_layer"]])
        if (max_tokens is None) == (memory_bytes is None):
            raise ValueError("KVCache: give exactly one of max_tokens= and memory_bytes=")
        if rule not in ("standard", "4over6"):
            raise ValueError("KVCache: rule must be 'standard' or '4over6', got %r" % (rule,))
        if dtype not in (torch.bfloat16, torch.float16):
            raise ValueError("KVCache: dtype must be torch.bfloat16 or torch.float16, got %r" % (dtype,))
        if device is None:
            device = "cuda" if nvfp4kv.has_cuda and nvfp4kv.cuda_available()[0] else "cpu"
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        pages = None
        if max_tokens is not None:
            if max_tokens <= 0:
                raise ValueError("KVCache: max_tokens must be positive, got %d" % max_tokens)
            pages = -(-int(max_tokens) // tokens_per_page)
        # The layers grouped by what their K and V bytes hold (a layout holds one element format
        # per side): one nvfp4kv cache per group, each layer stored and read in its group's.
        doc = _format_doc(format) if format is not None else None
        groups = _element_groups(doc, layers)
        if len(groups) > 1 and layout is not None:
            raise ValueError("KVCache: the format stores layers in %d element formats (%s); a layout of one's own holds "
                             "one per side, so leave layout= out (the native layout is planned per group)"
                             % (len(groups), ", ".join("K %s V %s" % g for g in groups)))
        if len(groups) > 1:
            # The whole format judged once against every layer (elements aside: each group's
            # layout holds its own), so an error names the model's layer, not a group's.
            nvfp4kv.with_format(nvfp4kv.plan(layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                                             tokens_per_page=tokens_per_page, pages=1).layout,
                                _without_elements(doc))
        if memory_bytes is not None and len(groups) > 1:
            per_page = sum(nvfp4kv.plan(layers=len(ls), kv_heads=kv_heads, head_dim=head_dim,
                                        tokens_per_page=tokens_per_page, pages=1, k_element=g[0],
                                        v_element=g[1]).bytes_per_page for g, ls in groups.items())
            pages = int(memory_bytes) // per_page
            if pages < 1:
                raise ValueError("KVCache: memory_bytes=%d holds no page: one page of every layer needs %d bytes"
                                 % (memory_bytes, per_page))
            memory_bytes = None
        if format is not None and rule != "standard":
            raise ValueError("KVCache: give the scale rules in format=, not rule= (the format's rules apply)")
        self.writers: List[Any] = []
        self._route: List[Tuple[int, int]] = [(0, 0)] * layers  # model layer -> (group, layer in the group)
        for g, ((k_element, v_element), members) in enumerate(groups.items()):
            if layout is None:
                valid = nvfp4kv.plan(layers=len(members), kv_heads=kv_heads, head_dim=head_dim,
                                     tokens_per_page=tokens_per_page, pages=pages, memory_bytes=memory_bytes,
                                     k_element=k_element, v_element=v_element).layout
            else:
                valid = self._sized_layout(layout, layers, kv_heads, head_dim, tokens_per_page, pages, memory_bytes)
            if format is not None:  # one group: the format as given, so the library's parser judges it
                if len(groups) == 1:
                    valid = nvfp4kv.with_format(valid, format)
                else:
                    valid = _with_group_format(valid, doc, members, layers, kv_heads, head_dim)
            self.writers.append(nvfp4kv.Cache(valid, "cpu" if self.device.type == "cpu" else str(self.device)))
            for local, layer in enumerate(members):
                self._route[layer] = (g, local)
        # The writers store, the readers attend: the same caches, unless a test stages a reader
        # that disagrees with its writer (over the same buffers) to prove it is caught.
        self.readers: List[Any] = list(self.writers)
        d = self.writers[0].dims
        self.layers_count, self.kv_heads, self.head_dim = layers, kv_heads, head_dim
        self.tokens_per_page, self.pages = d.tokens_per_page, d.pages
        self.rule, self.dtype = rule, dtype
        if global_scales is not None:
            for g, members in enumerate(groups.values()):
                self.writers[g].set_global_scales(*(_layers_of(s, members, layers) for s in global_scales))
        super().__init__(layers=[_Layer(self, i, s) for i, s in enumerate(_sliding_layers(config, layers))])
        self._reset_sequences()

    @property
    def writer(self) -> Any:
        """The nvfp4kv cache every layer is stored in (when all layers share their element formats)."""
        return self._single("writer")

    @writer.setter
    def writer(self, cache: Any) -> None:
        self._single("writer")
        self.writers[0] = cache

    @property
    def reader(self) -> Any:
        """The nvfp4kv cache every layer is read from (when all layers share their element formats)."""
        return self._single("reader")

    @reader.setter
    def reader(self, cache: Any) -> None:
        self._single("reader")
        self.readers[0] = cache

    def _single(self, what: str) -> Any:
        if len(self.writers) != 1:
            raise AttributeError("KVCache: its layers live in %d caches (one per element format); use %ss[group] and "
                                 "route(layer)" % (len(self.writers), what))
        return (self.writers if what == "writer" else self.readers)[0]

    def route(self, layer: int) -> Tuple[int, int]:
        """(group, layer within the group's cache) of a model layer: writers[group] stores it."""
        return self._route[layer]

    @staticmethod
    def _sized_layout(layout, layers, kv_heads, head_dim, tokens_per_page, pages, memory_bytes):
        if memory_bytes is not None and not isinstance(layout, (nvfp4kv.Layout, nvfp4kv.ValidLayout, nvfp4kv.Plan)):
            raise ValueError("KVCache: a layout by name needs max_tokens= (its page count), not memory_bytes=")
        if isinstance(layout, str):
            layout = nvfp4kv.load(layout, layers=layers, heads=kv_heads, head_dim=head_dim,
                                  tokens_per_page=tokens_per_page, pages=pages)
        valid = nvfp4kv.check(layout)
        d = valid.dims
        if (d.layers, d.heads, d.head_dim) != (layers, kv_heads, head_dim):
            raise ValueError("KVCache: layout %r is for layers %d, kv heads %d, head dim %d; the model has %d, %d, %d"
                             % (valid.layout.name, d.layers, d.heads, d.head_dim, layers, kv_heads, head_dim))
        return valid

    # ---- sequence bookkeeping --------------------------------------------------------------
    def _reset_sequences(self) -> None:
        self.positions = 0            # the padded timeline transformers counts (get_seq_length)
        self.batch: Optional[int] = None
        self._free = list(range(self.pages))
        self._pages: List[List[int]] = []
        self._lengths = np.zeros(0, np.int64)      # (batch,) stored tokens per sequence
        self._table: Optional[torch.Tensor] = None  # (batch, pages) int32 on the device
        self._seq_lens: Optional[torch.Tensor] = None
        self._slots: Optional[torch.Tensor] = None  # this step's (batch * q,) int64, -1 = padding
        self._query_pos: Optional[torch.Tensor] = None  # (batch, q) int64 cache position of each query, -1 = padding
        self._out: Optional[torch.Tensor] = None
        self._q_lens: List[int] = []                    # this step's real tokens per sequence
        self._cu_q: Optional[torch.Tensor] = None       # (batch + 1,) int32 offsets of their rows
        self._row_index: Optional[torch.Tensor] = None  # (sum q_lens,) int64 their rows in batch * q
        for w in self.writers:
            w.reset_status()

    @property
    def lengths(self) -> np.ndarray:
        """Tokens stored per sequence (padding excluded)."""
        return self._lengths.copy()

    @property
    def block_table(self) -> torch.Tensor:
        """(batch, pages) int32: the pages of each sequence in order (unused entries 0)."""
        return self._table

    def _begin_step(self, batch: int, q: int) -> None:
        """Slots for this forward's q tokens per sequence: padding (where the mask function saw
        0) gets -1, every other token the next position of its sequence."""
        padding, q_seen = getattr(_state, "padding", (None, None))
        _state.padding = (None, None)
        if self.batch is None:
            self.batch = batch
            self._pages = [[] for _ in range(batch)]
            self._lengths = np.zeros(batch, np.int64)
            self._table = torch.zeros(batch, self.pages, dtype=torch.int32, device=self.device)
        elif batch != self.batch:
            raise ValueError("KVCache: holds %d sequences, this step has %d (reset() it for a new batch)"
                             % (self.batch, batch))
        valid = np.ones((batch, q), bool)
        if padding is not None and q_seen == q:
            if tuple(padding.shape) != (batch, self.positions + q):
                raise ValueError("KVCache: the attention mask is %s; expected (%d, %d) (batch, past + new tokens)"
                                 % (tuple(padding.shape), batch, self.positions + q))
            valid = padding[:, -q:].cpu().numpy()
        rank = np.cumsum(valid, axis=1) - 1
        pos = np.where(valid, self._lengths[:, None] + rank, -1)   # (batch, q)
        new_len = self._lengths + valid.sum(1)
        n = self.tokens_per_page
        grew = False
        for b in range(batch):
            need = -(-int(new_len[b]) // n)
            while len(self._pages[b]) < need:
                if not self._free:
                    raise RuntimeError("KVCache: out of pages (%d of %d tokens each); make it larger (max_tokens=)"
                                       % (self.pages, n))
                self._pages[b].append(self._free.pop(0))
                grew = True
        if grew:
            table = np.zeros((batch, self.pages), np.int32)
            for b, pages in enumerate(self._pages):
                table[b, : len(pages)] = pages
            self._table.copy_(torch.from_numpy(table))
        slots = np.full((batch, q), -1, np.int64)
        for b in range(batch):
            ok = pos[b] >= 0
            pages = np.asarray(self._pages[b], np.int64)
            slots[b, ok] = pages[pos[b, ok] // n] * n + pos[b, ok] % n
        self._slots = torch.from_numpy(slots.reshape(-1)).to(self.device)
        self._query_pos = torch.from_numpy(pos).to(self.device)
        # This step's rows that are real tokens, as Cache.attention takes them: sequence b's
        # q_lens[b] rows (its newest tokens, in order) at cu_q[b] .. of the packed query.
        self._q_lens = [int(x) for x in valid.sum(1)]
        self._cu_q = torch.from_numpy(np.concatenate([[0], np.cumsum(self._q_lens)]).astype(np.int32)).to(self.device)
        self._row_index = torch.from_numpy(np.flatnonzero(valid.reshape(-1)).astype(np.int64)).to(self.device)
        self._lengths = new_len
        self._seq_lens = torch.from_numpy(new_len.astype(np.int32)).to(self.device)
        self.positions += q

    # ---- transformers' Cache interface -------------------------------------------------------
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """Quantize this step's keys and values (batch, kv heads, q, D) into layer
        ``layer_idx``'s pages. Returns the inputs themselves: no dequantized copy exists."""
        batch, heads, q, dim = key_states.shape
        if (heads, dim) != (self.kv_heads, self.head_dim):
            raise ValueError("KVCache: keys have %d heads of %d; the cache was made for %d of %d"
                             % (heads, dim, self.kv_heads, self.head_dim))
        if layer_idx == 0:
            self._begin_step(batch, q)
        elif self._slots is None or self._slots.numel() != batch * q:
            raise RuntimeError("KVCache: layer %d updated before layer 0 of this step" % layer_idx)
        k = self._rows(key_states)
        v = self._rows(value_states)
        group, local = self._route[layer_idx]
        self.writers[group].store(k, v, self._slots, local, rule=self.rule)
        _state.cache = self
        return key_states, value_states

    def _rows(self, x: torch.Tensor) -> torch.Tensor:
        """(batch, heads, q, D) -> (batch * q, heads, D) contiguous in the cache's dtype and device."""
        return x.transpose(1, 2).to(device=self.device, dtype=self.dtype).reshape(-1, x.shape[1], x.shape[3]) \
            .contiguous()

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.positions

    def get_mask_sizes(self, query_length, layer_idx: int = 0) -> Tuple[int, int]:
        return self.layers[0].get_mask_sizes(query_length)

    def get_query_offset(self, layer_idx: int = 0) -> int:
        return self.positions

    def get_max_length(self, layer_idx: Optional[int] = None) -> int:
        return -1

    def reset(self) -> None:
        """Forget every sequence (the pages are reused; their bytes are overwritten as tokens come)."""
        self._reset_sequences()

    @property
    def batch_size(self) -> int:
        return -1 if self.batch is None else self.batch

    @property
    def is_compileable(self) -> bool:
        return False

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("nvfp4kv.transformers.KVCache: crop (assisted decoding) is not supported")

    def bytes_per_token(self) -> float:
        """Cache bytes per token, all layers: K and V data and scales (9 D / 16 per head and side
        for NVFP4; the format's bits per value where it has one)."""
        bits = sum(w.layout.bits_per_value * w.dims.layers for w in self.writers) / self.layers_count
        return self.layers_count * self.kv_heads * 2 * self.head_dim * bits / 8

    # ---- reading ----------------------------------------------------------------------------
    def gather(self, layer: int, dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """Every stored token of ``layer`` dequantized: (batch, kv heads, max length, D) K and V,
        sequence b's tokens in [0, lengths[b]), zeros after. On the GPU in the cache's dtype;
        on the CPU in float32 (the dequantized values exactly) unless ``dtype`` says otherwise."""
        if self.batch is None:
            raise RuntimeError("KVCache: nothing stored yet")
        if dtype is None:
            dtype = torch.float32 if self.device.type == "cpu" else self.dtype
        lengths = self._lengths
        total, longest = int(lengths.sum()), int(lengths.max())
        cu = torch.from_numpy(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)).to(self.device)
        k_rows = torch.empty(total, self.kv_heads, self.head_dim, dtype=dtype, device=self.device)
        v_rows = torch.empty_like(k_rows)
        group, local = self._route[layer]
        self.readers[group].gather(self._table, cu, local, k_rows, v_rows)
        k = torch.zeros(self.batch, longest, self.kv_heads, self.head_dim, dtype=dtype, device=self.device)
        v = torch.zeros_like(k)
        index = torch.from_numpy(np.concatenate([b * longest + np.arange(n) for b, n in enumerate(lengths)])
                                 .astype(np.int64)).to(self.device)
        k.view(-1, self.kv_heads, self.head_dim).index_copy_(0, index, k_rows)
        v.view(-1, self.kv_heads, self.head_dim).index_copy_(0, index, v_rows)
        return k.transpose(1, 2), v.transpose(1, 2)

    def decode(self, layer: int, query: torch.Tensor, scaling: float, window: int = 0, softcap: float = 0.0,
               sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Fused paged decode of one query token per sequence: query (batch, q heads, D) ->
        (batch, q heads, D) in the cache's dtype (float32 on the CPU)."""
        q = query.to(device=self.device, dtype=self.dtype if self.device.type == "cuda" else torch.float32)
        q = q.contiguous()
        out = torch.empty_like(q)
        if sinks is not None:
            sinks = sinks.to(device=self.device, dtype=torch.float32).contiguous()
        group, local = self._route[layer]
        self.readers[group].decode(q, self._table, self._seq_lens, local, out, softmax_scale=float(scaling),
                          window=int(window), softcap=float(softcap), sinks=sinks)
        return out

    def attend(self, layer: int, query: torch.Tensor, scaling: float, window: int = 0, softcap: float = 0.0,
               sinks: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Paged causal attention of this step's chunk over the stored tokens (``Cache.attention``):
        query (batch, q heads, q, D) -> (batch, q, q heads, D) in the cache's dtype (float32 on the
        CPU); the rows of padding tokens are zeros."""
        batch, q_heads, q_len, dim = query.shape
        if batch * q_len != self._query_pos.numel():
            raise RuntimeError("KVCache: attention over %d x %d queries, but this step stored %s"
                               % (batch, q_len, tuple(self._query_pos.shape)))
        dtype = self.dtype if self.device.type == "cuda" else torch.float32
        rows = query.transpose(1, 2).to(device=self.device, dtype=dtype).reshape(batch * q_len, q_heads, dim)
        rows = rows.index_select(0, self._row_index).contiguous()
        out = torch.empty_like(rows)
        if sinks is not None:
            sinks = sinks.to(device=self.device, dtype=torch.float32).contiguous()
        if rows.shape[0] > 0:
            group, local = self._route[layer]
            self.readers[group].attention(rows, self._cu_q, self._q_lens, self._table, self._seq_lens, local, out,
                                  softmax_scale=float(scaling), window=int(window), softcap=float(softcap),
                                  sinks=sinks)
        full = torch.zeros(batch * q_len, q_heads, dim, dtype=dtype, device=self.device)
        full.index_copy_(0, self._row_index, out)
        return full.view(batch, q_len, q_heads, dim)

    def query_positions(self) -> torch.Tensor:
        """(batch, q) int64: where each of this step's tokens sits in its sequence (-1: padding)."""
        return self._query_pos


def _active_cache(module: Any) -> KVCache:
    cache = getattr(_state, "cache", None)
    if cache is None:
        raise RuntimeError('attn_implementation="nvfp4kv" needs past_key_values=nvfp4kv.transformers.KVCache(...) '
                           "(and use_cache=True): the keys and values live there")
    return cache


def attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
              attention_mask: Any, scaling: Optional[float] = None, dropout: float = 0.0,
              sliding_window: Optional[int] = None, softcap: Optional[float] = None, **kwargs) -> Tuple[torch.Tensor, None]:
    """The attention function registered as "nvfp4kv" (AttentionInterface): attends over the
    KVCache's pages for layer ``module.layer_idx``. query (batch, q heads, q, D); key and value
    are what KVCache.update returned (this step's rows) and are not read. Returns
    (batch, q, q heads, D) in query's dtype."""
    cache = _active_cache(module)
    _state.cache = None  # each update serves exactly one attention call
    layer = int(module.layer_idx)
    batch, q_heads, q_len, dim = query.shape
    if scaling is None:
        scaling = dim ** -0.5
    window = int(sliding_window or 0)
    sinks = kwargs.get("s_aux", getattr(module, "sinks", None))
    if q_len == 1:
        out = cache.decode(layer, query[:, :, 0], scaling, window, float(softcap or 0.0), sinks)
        return out.to(query.dtype).unsqueeze(1).to(query.device), None
    out = cache.attend(layer, query, scaling, window, float(softcap or 0.0), sinks)
    return out.to(query.dtype).to(query.device), None


AttentionInterface.register(NAME, attention)
AttentionMaskInterface.register(NAME, padding_mask)


# ---- calibration from a model and a text ------------------------------------------------------
CALIBRATE_NAME = "nvfp4kv_calibrate"
"""The attn_implementation ``calibrate`` runs the model with: each attention module's own eager
attention (the model's exact semantics: soft-capping, sinks, windows), recording each layer's
post-RoPE queries on the way."""
CALIBRATION_TOKENS = 2048
"""Tokens per layer nvfp4kv.calibrate measures (the first ones of the samples)."""
KL_TOKENS = 512
"""Tokens calibrate measures each layer's model KL on by default (the first ones of the samples)."""


class _SampleCache(DynamicCache):
    """A DynamicCache that also keeps the new post-RoPE K and V rows of each layer (sequence 0) as
    float32 (tokens, kv heads, D) pieces."""

    def __init__(self, config: Any, pieces: Dict[str, List[np.ndarray]]):
        super().__init__(config=config)
        self.pieces = pieces

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        for name, x in (("k", key_states), ("v", value_states)):
            self.pieces.setdefault("%s_%d" % (name, layer_idx), []).append(
                x[0].transpose(0, 1).float().cpu().numpy())
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _eager_of(module: torch.nn.Module):
    """The eager attention function of the model family ``module`` belongs to (each modeling file
    defines its own: soft-capping and sinks live there), or None."""
    return getattr(sys.modules.get(type(module).__module__), "eager_attention_forward", None)


def _record_queries(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: Any, scaling: Optional[float] = None, **kwargs):
    """The attention function registered as "nvfp4kv_calibrate": records query (sequence 0) for
    ``module.layer_idx``, scaled so that q.k / sqrt(D) is the model's own logit (its scaling may be
    another than 1/sqrt(D): Gemma's query_pre_attn_scalar), then runs the module's own eager
    attention."""
    pieces = getattr(_state, "calibration", None)
    if pieces is not None:
        dim = query.shape[-1]
        factor = 1.0 if scaling is None else float(scaling) * math.sqrt(dim)
        pieces.setdefault("q_%d" % int(module.layer_idx), []).append(
            (query[0].transpose(0, 1).float() * factor).cpu().numpy())
    eager = _eager_of(module)
    if eager is None:
        raise nvfp4kv.UnsupportedError("calibrate: %s has no eager_attention_forward in %s to run the model with"
                                       % (type(module).__name__, type(module).__module__))
    return eager(module, query, key, value, attention_mask, scaling=scaling, **kwargs)


AttentionInterface.register(CALIBRATE_NAME, _record_queries)
AttentionMaskInterface.register(CALIBRATE_NAME, AttentionMaskInterface._global_mapping["eager"])


class _Progress:
    """One line on stderr that a person can follow: "nvfp4kv calibrate: [#####     ] 1024/2048 tokens"."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.tty = enabled and sys.stderr.isatty()

    def show(self, done: int, what: str = "tokens") -> None:
        if not self.enabled:
            return
        bar = "#" * (20 * done // max(self.total, 1))
        line = "nvfp4kv calibrate: [%-20s] %d/%d %s" % (bar, done, self.total, what)
        sys.stderr.write(("\r" + line) if self.tty else line + "\n")
        sys.stderr.flush()

    def end(self, line: str) -> None:
        if self.enabled:
            sys.stderr.write(("\r" if self.tty else "") + line + "\n")
            sys.stderr.flush()


def _rotation_block(rotation: Any, dim: int) -> int:
    """cache_format.hpp's rotation_block: 0 for none, the size, or for "head" D where D is a
    power of two, else the largest power of two dividing D."""
    if rotation in (None, "none", 0):
        return 0
    if rotation == "head":
        return dim if dim & (dim - 1) == 0 else dim & -dim
    return int(rotation)


def _hadamard(x: np.ndarray, n: int, scale: Any) -> np.ndarray:
    """Blocks of n along the last axis through Sylvester's Hadamard matrix, in x's precision, in the
    writer's order (core/transform.hpp): butterflies of span 1, 2, 4, ..., then one multiplication
    by `scale` (float(1/sqrt(n)) for the writer, 1/sqrt(n) in float64 for a reader)."""
    shape = x.shape
    y = x.reshape(-1, n).copy()
    h = 1
    while h < n:
        z = y.reshape(-1, n // (2 * h), 2, h)
        a, b = z[:, :, 0, :].copy(), z[:, :, 1, :].copy()
        z[:, :, 0, :], z[:, :, 1, :] = a + b, a - b
        h *= 2
    return (y * y.dtype.type(scale)).reshape(shape)


def _through_format(x: torch.Tensor, side_format: Dict[str, Any], global_scale: float,
                    mu: Optional[np.ndarray] = None, lam: Optional[np.ndarray] = None) -> torch.Tensor:
    """K or V (batch, heads, tokens, D) as a cache of ``side_format`` (one side of one layer of a
    cache format's JSON) gives them back, simulated on the host: FP8 E4M3 with the per-tensor scale
    ``global_scale`` (after mu), or NVFP4 through the layer's transforms as the CPU store and gather
    apply them (rows rounded to bfloat16 as the store takes them, minus mu and rotated in float32 in
    the writer's order, nvfp4kv.reference.quantize / dequantize with ``global_scale`` and the rule,
    the rotation undone and mu added back in float64). mu: (heads, D) for K smoothing, or None;
    lam: (heads, D), K's channel scale (divided out after mu in float32, multiplied back in
    float64 before mu), or None."""
    from nvfp4kv import reference
    b, h, t, d = x.shape
    gs = float(global_scale)
    rows = x.transpose(1, 2).to(torch.bfloat16).float().reshape(-1, h, d).cpu().numpy()
    mu = np.zeros((h, d), np.float32) if mu is None else np.asarray(mu, np.float32)
    rows = rows - mu  # one float32 rounding per element (nothing where mu is zero)
    lam = None if lam is None else np.asarray(lam, np.float32)
    if lam is not None:
        rows = rows / lam  # one float32 division per element, as the store
    if side_format.get("element") == "fp8_e4m3":  # core/transform.hpp: e4m3(x * (1 / scale)), back as e4m3 * scale
        inv = np.float32(1) / np.float32(gs)
        codes = torch.from_numpy(rows * inv).clamp(-448, 448).to(torch.float8_e4m3fn)
        back = (codes.float() * torch.tensor(gs, dtype=torch.float32)).double().numpy()
        back = (back if lam is None else back * lam.astype(np.float64)) + mu
    else:
        n = _rotation_block(side_format.get("rotation"), d)
        if n:  # core/transform.hpp's hadamard_scale: 2^-(k/2), times float(1/sqrt(2)) for odd k
            k = n.bit_length() - 1
            scale = np.float32(2.0 ** -(k // 2)) * (np.float32(0.70710678118654752440) if k % 2 else np.float32(1))
            rows = _hadamard(rows, n, scale)
        back = reference.dequantize(*reference.quantize(rows, gs, side_format.get("rule", "standard")), gs)
        back = back.astype(np.float64)
        if n:
            back = _hadamard(back, n, 1.0 / math.sqrt(n))
        if lam is not None:
            back = back * lam.astype(np.float64)
        back = back + mu
    y = torch.from_numpy(back.astype(np.float32)).view(b, t, h, d).transpose(1, 2)
    return y.to(x.device, x.dtype)


class _SidesCache(DynamicCache):
    """A DynamicCache that keeps the K and V of the (layer, side) pairs in ``sides`` ("k" or "v") as
    the calibration ``cal``'s format gives them back (_through_format with its global scales, K
    mean and K channel scale); every other side exact."""

    def __init__(self, config: Any, cal: Dict[str, Any], sides: Set[Tuple[int, str]]):
        super().__init__(config=config)
        self.sides = sides
        layers, heads, dim = _kv_dims(config)
        fmt = cal["format"]
        self.formats = [fmt["layers"][l if len(fmt["layers"]) > 1 else 0] for l in range(layers)]
        mean, lam = fmt.get("k_mean"), fmt.get("k_channel_scale")
        self.mu = np.asarray(mean, np.float32).reshape(layers, heads, dim) if mean is not None else None
        self.lam = np.asarray(lam, np.float32).reshape(layers, heads, dim) if lam is not None else None
        self.scales = [(p["k_global_scale"], p["v_global_scale"]) for p in cal["per_layer"]]

    def update(self, key_states, value_states, layer_idx, *args, **kwargs):
        if (layer_idx, "k") in self.sides:
            key_states = _through_format(key_states, self.formats[layer_idx]["k"], self.scales[layer_idx][0],
                                         None if self.mu is None else self.mu[layer_idx],
                                         None if self.lam is None else self.lam[layer_idx])
        if (layer_idx, "v") in self.sides:
            value_states = _through_format(value_states, self.formats[layer_idx]["v"], self.scales[layer_idx][1])
        return super().update(key_states, value_states, layer_idx, *args, **kwargs)


def _model_kl(model: Any, ids: torch.Tensor, chunk: int, cal: Dict[str, Any], bar: "_Progress",
              measure: str = "alone") -> Dict[str, List[float]]:
    """Each layer's model-level sensitivity over ``ids`` (one sequence), of its K and of its V, from
    the mean over the tokens of KL(P_exact || P) of the next-token distributions, P_exact with every
    layer's K/V exact. ``measure`` "alone": P with only that layer's K (or only its V) through
    ``cal``'s format (its best NVFP4 mode, calibrated global scales); 2 x layers + 1 passes.
    "saved": what keeping that side exact saves with every other side through the format, the KL of
    P with every side quantized less the KL of P with all but that one (0 where it saves nothing);
    2 x layers + 2 passes. All runs go in the same chunks through the same attention, so a side the
    format keeps exactly measures 0."""
    layers, _, _ = _kv_dims(model.config)
    every = {(layer, side) for layer in range(layers) for side in "kv"}

    def logits(sides: Set[Tuple[int, str]]) -> List[torch.Tensor]:
        cache = _SidesCache(model.config, cal, sides)
        return [model(ids[start:start + chunk][None], past_key_values=cache, use_cache=True).logits[0].float()
                for start in range(0, ids.numel(), chunk)]

    def kl_of(ref: List[torch.Tensor], sides: Set[Tuple[int, str]]) -> float:
        total = 0.0  # log-probabilities and KL in float64, chunk by chunk
        for exact, got in zip(ref, logits(sides)):
            want = torch.log_softmax(exact.double(), dim=-1)
            total += float((want.exp() * (want - torch.log_softmax(got.double(), dim=-1))).sum())
        return total / ids.numel()

    kl: Dict[str, List[float]] = {"k": [], "v": []}
    with torch.no_grad():
        ref = logits(set())  # kept as float32 logits
        everything = kl_of(ref, every) if measure == "saved" else 0.0
        for layer in range(layers):
            for side in "kv":
                if measure == "saved":
                    kl[side].append(max(everything - kl_of(ref, every - {(layer, side)}), 0.0))
                else:
                    kl[side].append(max(kl_of(ref, {(layer, side)}), 0.0))  # >= 0 but for rounding
            bar.show(layer + 1, "layers: model KL of K and V")
    return kl


def calibrate(model: Any, tokens: Any = None, *, text: Union[str, "os.PathLike[str]", None] = None,
              tokenizer: Any = None, bits: float = 4.5, samples: int = CALIBRATION_TOKENS, chunk: int = 512,
              out: Optional[str] = None, progress: bool = True, model_kl: Union[bool, str] = False,
              kl_tokens: Optional[int] = None) -> Dict[str, Any]:
    """A calibration file (docs/calibration.md) for ``model`` from a text: the model runs over the
    first ``samples`` tokens as one sequence (in chunks of ``chunk``, through each layer's own eager
    attention), its post-RoPE K, V and queries of every layer are recorded, and ``nvfp4kv.calibrate``
    measures them (the model's own queries probe each mode's attention error, not the keys' stand-in).
    With ``model_kl`` (off by default: docs/calibration.md says why) each layer's model-level
    sensitivity is measured too: the model
    runs again over the first ``kl_tokens`` of those tokens once with exact K/V and, per layer,
    once with only that layer's K and once with only its V through its best NVFP4 mode; the mean
    next-token KL divergence from the exact run is that layer's ``k_model_kl`` and ``v_model_kl``,
    and the policy spends FP8 on K, then V, of the layers where it is largest (docs/calibration.md).
    ``model_kl="saved"`` measures instead what keeping each side exact saves with every other side
    through its best mode (2 x layers + 2 passes; measured worse on SmolLM2, docs/calibration.md).

    tokens:     the token ids, a 1-D sequence (list, NumPy or PyTorch), or
    text:       the text itself (a str), or a file's path (a pathlib.Path), with ``tokenizer``: its
                ids as the tokenizer gives them (BOS first where it adds one).
    bits:       bits per value to spend ([4.5, 8]); samples: tokens measured (16 to 2048).
    kl_tokens:  tokens the model-level sensitivity is measured on (16 to ``samples``; None: 512 or
                ``samples`` if fewer): 2 x layers + 1 forward passes over them.
    out:        where to write the file (only once everything was measured and checked).
    progress:   a progress line on stderr.
    Everything is checked before the model runs. Returns the calibration as a dict;
    ``KVCache(config, calibration=out, ...)`` takes the file."""
    if (tokens is None) == (text is None):
        raise ValueError("calibrate: give exactly one of tokens= and text= (with tokenizer=)")
    if not 4.5 <= float(bits) <= 8.0:
        raise nvfp4kv.ArgumentError("calibrate: bits: a budget of bits per value in [4.5, 8] (NVFP4 to FP8), got %g"
                                    % float(bits))
    samples, chunk = int(samples), int(chunk)
    if not 16 <= samples <= CALIBRATION_TOKENS or chunk < 1:
        raise ValueError("calibrate: samples must be in [16, %d] (what is measured) and chunk >= 1, got %d and %d"
                         % (CALIBRATION_TOKENS, samples, chunk))
    kl_tokens = min(KL_TOKENS, samples) if kl_tokens is None else int(kl_tokens)
    if model_kl not in (False, True, "alone", "saved"):
        raise ValueError("calibrate: model_kl: False, True (\"alone\") or \"saved\", got %r" % (model_kl,))
    measure = "saved" if model_kl == "saved" else "alone"
    if model_kl and not 16 <= kl_tokens <= samples:
        raise ValueError("calibrate: kl_tokens must be in [16, samples = %d], got %d" % (samples, kl_tokens))
    if text is not None:
        if tokenizer is None:
            raise ValueError("calibrate: text= needs tokenizer= (the model's)")
        if isinstance(text, os.PathLike):
            with open(text, encoding="utf-8") as f:
                text = f.read()
        ids = np.asarray(tokenizer(text).input_ids, np.int64)
        what = "the text has %d tokens" % ids.size
    else:
        ids = np.asarray(tokens.cpu() if isinstance(tokens, torch.Tensor) else tokens, np.int64)
        what = "tokens= holds %d ids" % ids.size
    if ids.ndim != 1:
        raise ValueError("calibrate: tokens must be one sequence (1-D), got shape %s" % (ids.shape,))
    if ids.size < samples:
        raise ValueError("calibrate: %s; %d are measured (give more text or fewer samples=)" % (what, samples))
    ids = torch.from_numpy(ids[:samples]).to(model.device)
    layers, _, _ = _kv_dims(model.config)
    pieces: Dict[str, List[np.ndarray]] = {}
    before = model.config._attn_implementation
    bar = _Progress(samples, progress)
    cache = _SampleCache(model.config, pieces)
    try:
        model.set_attn_implementation(CALIBRATE_NAME)
        _state.calibration = pieces
        with torch.no_grad():
            for start in range(0, samples, chunk):
                model(ids[start:start + chunk][None], past_key_values=cache, use_cache=True)
                bar.show(min(start + chunk, samples))
    finally:
        _state.calibration = None
        model.set_attn_implementation(before)
    missing = [name for name in ("%s_%d" % (t, l) for l in range(layers) for t in "kvq") if name not in pieces]
    if missing:
        raise RuntimeError("calibrate: the model never handed %s to its cache or attention (is it a decoder with "
                           "one KV cache per layer?)" % ", ".join(missing[:4]))
    arrays = {name: np.concatenate(parts) for name, parts in pieces.items()}
    bar.end("nvfp4kv calibrate: %d tokens of %d layers recorded; measuring the NVFP4 modes" % (samples, layers))
    kl = None
    if model_kl:
        modes = nvfp4kv.calibrate(arrays, bits=4.5)  # each layer's best mode and its global scales, no FP8
        bar.end("nvfp4kv calibrate: model KL of each layer's K and V in its best mode (%s) on %d tokens (%d forward "
                "passes)" % (measure, kl_tokens, 2 * layers + (2 if measure == "saved" else 1)))
        layer_bar = _Progress(layers, progress)
        try:
            model.set_attn_implementation(CALIBRATE_NAME)  # the same eager attention, recording nothing
            kl = _model_kl(model, ids[:kl_tokens], chunk, modes, layer_bar, measure)
        finally:
            model.set_attn_implementation(before)
    result = nvfp4kv.calibrate(arrays, bits=bits, out=out, model_kl=kl)
    bar.end("nvfp4kv calibrate: %.2f bits per value%s" % (result["bits_per_value"],
                                                          ", written to %s" % out if out else ""))
    return result


def main(argv: Optional[Sequence[str]] = None) -> int:
    """python -m nvfp4kv.transformers calibrate --model DIR_OR_GGUF_FOLDER [--gguf-file F] --text FILE
    [--bits B] [--samples N] --out FILE"""
    ap = argparse.ArgumentParser(prog="python -m nvfp4kv.transformers",
                                 description="nvfp4kv with a Hugging Face transformers model")
    sub = ap.add_subparsers(dest="command", required=True)
    c = sub.add_parser("calibrate", help="a calibration file from a model and a text (docs/calibration.md)")
    c.add_argument("--model", required=True, help="a save_pretrained folder or a hub name, or the GGUF's folder")
    c.add_argument("--gguf-file", help="the GGUF file inside --model's folder")
    c.add_argument("--text", help="a UTF-8 text file (tokenized by the model's tokenizer)")
    c.add_argument("--tokens", help="instead of --text: a .npy of token ids (1-D)")
    c.add_argument("--bits", type=float, default=4.5, help="bits per value to spend, in [4.5, 8] (default 4.5)")
    c.add_argument("--samples", type=int, default=CALIBRATION_TOKENS, help="tokens measured, 16 to 2048 (default 2048)")
    c.add_argument("--chunk", type=int, default=512, help="tokens per forward pass (default 512)")
    c.add_argument("--kl-tokens", type=int, default=None,
                   help="tokens each layer's model KL is measured on (default %d, at most --samples)" % KL_TOKENS)
    c.add_argument("--model-kl", action="store_true",
                   help="measure each layer's K and V model KL (2 x layers + 1 more forward passes) and rank layers "
                   "for FP8 by it instead of by attention error")
    c.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    c.add_argument("--out", required=True, help="the calibration file to write (JSON)")
    args = ap.parse_args(argv)
    if (args.text is None) == (args.tokens is None):
        ap.error("give exactly one of --text and --tokens")
    from transformers import AutoModelForCausalLM, AutoTokenizer
    extra = {"gguf_file": args.gguf_file} if args.gguf_file else {}
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, args.dtype), **extra).eval()
    if args.text is not None:
        with open(args.text, encoding="utf-8") as f:  # a mistyped path fails here, not as a 3-token text
            text = f.read()
        tokenizer = AutoTokenizer.from_pretrained(args.model, **extra)
        result = calibrate(model, text=text, tokenizer=tokenizer, bits=args.bits, samples=args.samples,
                           chunk=args.chunk, out=args.out, model_kl=args.model_kl, kl_tokens=args.kl_tokens)
    else:
        result = calibrate(model, np.load(args.tokens, allow_pickle=False), bits=args.bits, samples=args.samples,
                           chunk=args.chunk, out=args.out, model_kl=args.model_kl, kl_tokens=args.kl_tokens)
    formats = json.loads(json.dumps(result["format"]))["layers"]
    print("calibrated %d layers on %d tokens: %.2f bits per value; written: %s"
          % (result["layers"], result["samples"], result["bits_per_value"], args.out))
    for layer, (p, f) in enumerate(zip(result["per_layer"], formats if len(formats) > 1 else formats * result["layers"])):
        kl = "" if p["k_model_kl"] is None else "  model KL K %.3g V %.3g" % (p["k_model_kl"], p["v_model_kl"])
        print("  layer %2d  best %-28s error %.3g%s  K %-9s V %s" % (layer, p["best_mode"], p["errors"][p["best_mode"]],
                                                                   kl, f["k"]["element"], f["v"]["element"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
