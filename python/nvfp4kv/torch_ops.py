"""nvfp4kv's store and decode as torch.library custom ops, so torch.compile traces a step that
calls them without a graph break (and a CUDA graph captures what it compiles).

    from nvfp4kv import torch_ops
    handle = torch_ops.register(cache)            # an nvfp4kv.Cache; its buffers become tensors
    pages = torch_ops.pages(handle, layer)        # what store mutates and decode reads
    torch.ops.nvfp4kv.store(pages, k, v, slots, handle, layer, "standard")
    out = torch.ops.nvfp4kv.decode(pages, q, block_table, seq_lens, handle, layer, scale, 0, 0.0)

A cache is named by an integer handle (an op takes tensors and numbers, not Python objects);
``pages`` are the layer's cache buffers as torch tensors: the store declares them mutated and
decode takes them as inputs, so a compiler keeps the two in order. The fake (meta)
implementations give decode's output shape and nothing else. The DLPack methods on
``nvfp4kv.Cache`` remain for users without torch.
"""
from __future__ import annotations

import itertools
from typing import Dict, List

import torch

import nvfp4kv

_caches: Dict[int, nvfp4kv.Cache] = {}
_handles = itertools.count(1)


def register(cache: nvfp4kv.Cache) -> int:
    """A handle the ops know ``cache`` by (kept until ``unregister``)."""
    handle = next(_handles)
    _caches[handle] = cache
    return handle


def unregister(handle: int) -> None:
    _caches.pop(handle, None)


def _cache(handle: int) -> nvfp4kv.Cache:
    try:
        return _caches[handle]
    except KeyError:
        raise ValueError("nvfp4kv ops: no cache has handle %d (torch_ops.register gives one)" % handle) from None


def pages(handle: int, layer: int) -> List[torch.Tensor]:
    """Layer ``layer``'s buffers of a registered cache as flat uint8 tensors (no copy)."""
    cache = _cache(handle)
    return [torch.from_dlpack(cache.buffer(i, layer)) for i in range(len(cache.layout.layout.buffers))]


@torch.library.custom_op("nvfp4kv::store", mutates_args=("pages",))
def store(pages: List[torch.Tensor], k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor, handle: int, layer: int,
          rule: str) -> None:
    """Cache.store: k, v (tokens, heads, D) rows into ``layer`` at ``slots``."""
    _cache(handle).store(k, v, slots, layer, rule=rule)


@store.register_fake
def _store_fake(pages, k, v, slots, handle, layer, rule) -> None:
    return None


@torch.library.custom_op("nvfp4kv::decode", mutates_args=())
def decode(pages: List[torch.Tensor], q: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, handle: int,
           layer: int, softmax_scale: float, window: int, softcap: float) -> torch.Tensor:
    """Cache.decode: q (batch, q heads, D) -> out of q's shape and dtype."""
    out = torch.empty_like(q)
    _cache(handle).decode(q, block_table, seq_lens, layer, out, softmax_scale=softmax_scale, window=window,
                          softcap=softcap)
    return out


@decode.register_fake
def _decode_fake(pages, q, block_table, seq_lens, handle, layer, softmax_scale, window, softcap):
    return torch.empty_like(q)
