"""The conformance kit from Python: test an engine's own writer and reader
against the layout it claims (docs/conformance.md), NumPy in, a report out.

    import nvfp4kv
    from nvfp4kv import conformance
    layout = nvfp4kv.load("vllm-packed-nhd-rows", layers=1, pages=16, heads=2, tokens_per_page=16, head_dim=128)
    kit = conformance.gen(layout)                # or gen(layout, "kit/") to write the files too
    buffers = kit.empty_buffers()                # one uint8 array per layout buffer, all kit.poison
    ...                                          # the engine stores kit.k / kit.v through kit.slots into them
    report = conformance.check_write(kit, buffers)
    print(report.text()); report.ok; report.verdicts; report.writer_layout

The same library does the work as `nvfp4kv conformance gen | check-write |
check-read`; the reports are the CLI's (``text()`` what it prints, ``json()``
its --json report, docs/cli-json.md). bf16 arrays are uint16 bit patterns, as in
the kit's .npy files (NumPy has no bf16: ``torch.from_numpy(a).view(torch.bfloat16)``).
"""
from __future__ import annotations

import json as _json
import os
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np

from . import ArgumentError, Dims, Layout, Plan, ValidLayout, _core, _require_array, check
from . import load as _load_layout

__all__ = ["Kit", "ReadReport", "WriteReport", "check_read_attention", "check_read_rows", "check_write", "gen",
           "load_kit"]

LayoutLike = Union[Layout, ValidLayout, Plan]


def _bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    return (bits.astype(np.uint32) << 16).view(np.float32)


def _from_core(name: str, doc: Optional[str] = None) -> Any:
    """A read-only property: the wrapped _core object's attribute ``name``."""
    return property(lambda self: getattr(self._k, name), doc=doc)


class Kit:
    """A conformance kit: inputs for an engine's writer and reader whose every
    16-element block carries a recoverable signature, and what nvfp4kv's
    reference makes of them through the layout. Made by ``gen`` or ``load_kit``.

    Arrays are read-only NumPy views (C order) unless said otherwise. With
    H kv heads, D the head dim, R the stored tokens and P the probes:

    Writer's inputs:
      k, v:        (rows, H, D) uint16 bf16 bit patterns, or float16 (``dtype``);
                   k_f32 / v_f32 the same values as float32 (exact, copies)
      slots:       (rows,) int64: page * tokens_per_page + position; -1 is padding
                   (row_sequence, row_position: each row's sequence and position in it)
      k_global_scale, v_global_scale: the dequant multipliers (vLLM's k_scale);
                   k_quant / v_quant their float32 reciprocals (FlashInfer's global_sf)
      layer:       the layer to store into; poison: the byte every buffer holds first
      cache:       the expected buffers, one flat uint8 view per layout buffer
                   (``buffer_names``): nvfp4kv's reference store, poison elsewhere
    Reader's:
      block_tables (S, max_pages) int32 (-1 past the end), seq_lens (S,) int32,
      cu_seqlens (S + 1,) int32: the stored rows as S sequences;
      read_rows (R,) int64: the input row of each dense output row;
      expected_k, expected_v (R, H, D) float32: what a reader must return
    Attention probes:
      q (P, q_heads, D) like k (q_f32 as float32); probe_block_tables (P, max_pages)
      int32, probe_seq_lens (P,) int32, softmax_scale; expected_out (P, q_heads, D)
      float32; probe_isolates (P, q_heads) bool: the query singles its token out
    """

    poison: int = int(_core.conformance_poison)

    def __init__(self, core: Any):
        self._k = core

    # ---- what it is for
    layout = _from_core("layout", "The ValidLayout the kit was generated for.")
    dtype = _from_core("dtype", "'bf16' or 'fp16': the element type of k, v and q.")
    layer = _from_core("layer", "The layer the writer stores into and the reader reads.")
    seed = _from_core("seed")

    @property
    def dims(self) -> Dims:
        return self._k.layout.dims

    # ---- the writer's inputs
    rows = _from_core("rows", "Input rows, padding rows included.")
    k = _from_core("k", "(rows, H, D): K rows to store, uint16 bf16 bit patterns or float16.")
    v = _from_core("v", "(rows, H, D): V rows to store, like k.")
    slots = _from_core("slots", "(rows,) int64: page * tokens_per_page + position; -1 for padding.")
    row_sequence = _from_core("row_sequence", "(rows,) int64: each row's index in ``sequences``; -1 for padding.")
    row_position = _from_core("row_position", "(rows,) int64: each row's position in its sequence; -1 for padding.")

    @property
    def tokens(self) -> int:
        """Stored rows (R): the rows with a slot, in sequences."""
        return int(self._k.read_rows.shape[0])

    @property
    def k_f32(self) -> np.ndarray:
        """(rows, H, D) float32: k's values, exactly (a copy)."""
        return self._as_f32(self._k.k)

    @property
    def v_f32(self) -> np.ndarray:
        """(rows, H, D) float32: v's values, exactly (a copy)."""
        return self._as_f32(self._k.v)

    @property
    def k_global_scale(self) -> float:
        """K's dequant multiplier (x ~= e2m1 * scale * k_global_scale)."""
        return float(self._k.k_global_scale)

    @property
    def v_global_scale(self) -> float:
        return float(self._k.v_global_scale)

    @property
    def k_quant(self) -> float:
        """float32(1) / k_global_scale: K's quant multiplier (FlashInfer's global_sf)."""
        return float(np.float32(1) / np.float32(self._k.k_global_scale))

    @property
    def v_quant(self) -> float:
        return float(np.float32(1) / np.float32(self._k.v_global_scale))

    @property
    def buffer_names(self) -> List[str]:
        return [b.name for b in self.layout.layout.buffers]

    @property
    def cache(self) -> List[np.ndarray]:
        """One flat uint8 array per layout buffer (one layer's allocation for a
        per-layer buffer): the rows as nvfp4kv's reference stores them, poison
        in every byte no stored element owns."""
        return list(self._k.cache)

    def empty_buffers(self) -> List[np.ndarray]:
        """Writable uint8 arrays sized like ``cache``, every byte ``poison``: what
        an engine's writer stores into before its buffers go to check_write."""
        return [np.full(b.shape, self.poison, dtype=np.uint8) for b in self._k.cache]

    # ---- the reader's
    read_rows = _from_core("read_rows", "(R,) int64: the input row of each dense output row.")
    expected_k = _from_core("read_k", "(R, H, D) float32: the cache's K rows in sequence order, dequantized.")
    expected_v = _from_core("read_v", "(R, H, D) float32: the cache's V rows in sequence order, dequantized.")

    @property
    def sequences(self) -> List[Tuple[List[int], int]]:
        """(pages, length) of each sequence: page k holds positions [k N, (k + 1) N)."""
        return [(list(pages), int(length)) for pages, length, _ in self._k.sequences]

    @property
    def block_tables(self) -> np.ndarray:
        """(S, max_pages) int32: each sequence's pages in order, -1 past its end."""
        seqs = self._k.sequences
        table = np.full((len(seqs), max([1] + [len(p) for p, _, _ in seqs])), -1, dtype=np.int32)
        for i, (pages, _, _) in enumerate(seqs):
            table[i, :len(pages)] = pages
        return table

    @property
    def seq_lens(self) -> np.ndarray:
        """(S,) int32: tokens per sequence."""
        return np.array([length for _, length, _ in self._k.sequences], dtype=np.int32)

    @property
    def cu_seqlens(self) -> np.ndarray:
        """(S + 1,) int32: sequence i is rows [cu[i], cu[i+1]) of a reader's dense output."""
        return np.concatenate([[0], np.cumsum(self.seq_lens)]).astype(np.int32)

    # ---- attention probes
    q_heads = _from_core("q_heads")
    q = _from_core("q", "(P, q_heads, D): one decode query per probe, uint16 bf16 bit patterns or float16.")
    probe_sequence = _from_core("probe_sequence", "(P,) int32: the sequence each probe attends over.")
    probe_position = _from_core("probe_position", "(P,) int32: the position in its sequence each probe singles out.")
    expected_out = _from_core("expected_out", "(P, q_heads, D) float32: fp64 reference decode attention over the cache.")

    @property
    def probes(self) -> int:
        return int(self._k.probe_sequence.shape[0])

    @property
    def softmax_scale(self) -> float:
        return float(self._k.softmax_scale)

    @property
    def q_f32(self) -> np.ndarray:
        """(P, q_heads, D) float32: q's values, exactly (a copy)."""
        return self._as_f32(self._k.q)

    @property
    def probe_block_tables(self) -> np.ndarray:
        """(P, max_pages) int32: the pages each probe attends over."""
        return self.block_tables[self._k.probe_sequence]

    @property
    def probe_seq_lens(self) -> np.ndarray:
        """(P,) int32: the tokens each probe attends over."""
        return self.seq_lens[self._k.probe_sequence]

    @property
    def probe_isolates(self) -> np.ndarray:
        """(P, q_heads) bool: the query's margin held after rounding it to dtype."""
        return self._k.probe_isolates.astype(bool)

    # ---- facts about the signatures
    probe_blocks = _from_core("probe_blocks", "Stored blocks whose element 15 is a rounding probe.")
    scale_rows_unique = _from_core("scale_rows_unique", "Whether every row of scales is unique (False only at D < 64).")

    @property
    def bytes_differing(self) -> Dict[str, int]:
        """Per rounding policy, the stored bytes it writes unlike nvfp4kv."""
        return dict(self._k.bytes_differing)

    def write(self, out_dir: Union[str, os.PathLike]) -> None:
        """Write the kit's files (docs/conformance.md) into out_dir, created if missing."""
        self._k.write(os.fspath(out_dir))

    def _as_f32(self, a: np.ndarray) -> np.ndarray:
        return a.astype(np.float32) if self.dtype == "fp16" else _bf16_bits_to_f32(a)

    def __repr__(self) -> str:
        return "<nvfp4kv.conformance.Kit '%s' %s: %d rows (%d stored), layer %d, %d probes>" % (
            self.layout.name, self.dtype, self.rows, self.tokens, self.layer, self.probes)


_DTYPES = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16"}


def _dtype_name(dtype: Any) -> str:
    if isinstance(dtype, str):
        name = dtype
    else:
        try:
            name = np.dtype(dtype).name  # np.float16, ml_dtypes.bfloat16
        except TypeError:
            name = str(dtype).replace("torch.", "")
    return _DTYPES.get(name, name)


def gen(layout: LayoutLike, out_dir: Optional[Union[str, os.PathLike]] = None, *, tokens: int = 0,
        dtype: Any = "bf16", layer: int = 0, q_heads: int = 0, seed: int = 1) -> Kit:
    """Generate a conformance kit for a layout (checked here: an unsound one
    raises LayoutRejected), and write its files into out_dir when given.

    tokens:  rows to store (0: half the cache, at most 512); padding rows come on top.
    dtype:   "bf16" or "fp16" (or np.float16 / a "bfloat16" dtype): rows and queries.
    layer:   the layer the writer stores into and the reader reads.
    q_heads: query heads of the attention probes, a multiple of the kv heads (0: as many).
    seed:    of the sequence lengths and the page order.
    """
    kit = Kit(_core.conformance_generate(check(layout), int(tokens), _dtype_name(dtype), int(layer), int(q_heads),
                                         int(seed)))
    if out_dir is not None:
        kit.write(out_dir)
    return kit


def load_kit(dir: Union[str, os.PathLike], layout: Union[LayoutLike, str]) -> Kit:
    """The kit in dir (from ``gen`` or ``nvfp4kv conformance gen``), generated
    again from its manifest. ``layout`` is the layout it was generated for: a
    Layout at the kit's sizes, or a preset name or JSON file, bound to the sizes
    the manifest records. Raises ArgumentError when the layout places bytes
    otherwise or the cache files are not what this nvfp4kv generates."""
    path = os.fspath(dir)
    if isinstance(layout, (str, os.PathLike)):
        layers, pages, n, heads, head_dim = _core.conformance_kit_dims(path)
        layout = _load_layout(os.fspath(layout), layers=layers, pages=pages, tokens_per_page=n, heads=heads,
                              head_dim=head_dim)
    return Kit(_core.conformance_load_kit(path, check(layout)))


class _Report:
    """What the two kinds of report share: the verdict, the CLI's text and JSON."""

    def __init__(self, core: Any):
        self._r = core
        self._dict: Optional[Dict[str, Any]] = None

    @property
    def ok(self) -> bool:
        return bool(self._r.ok)

    def text(self) -> str:
        """What the CLI prints."""
        return self._r.text()

    def json(self) -> str:
        """The CLI's --json report (docs/cli-json.md), without its envelope."""
        return self._r.json()

    def to_dict(self) -> Dict[str, Any]:
        """json(), parsed."""
        if self._dict is None:
            self._dict = _json.loads(self._r.json())
        return self._dict

    @property
    def differences(self) -> List[str]:
        """The inferred map against the layout, one sentence per field that differs."""
        return [d["text"] for d in self.to_dict()["differences"]]

    def __str__(self) -> str:
        return self.text()


class WriteReport(_Report):
    """What check_write found, region by region (k_data, k_scale, v_data, v_scale).

    ok:        every region exact or rounding-only and nothing written outside
               the stored rows' cells
    verdicts:  region -> "exact", "rounding-only" or "misplaced"
    regions:   region -> its part of the JSON report: bytes, exact, rounding,
               wrong, found_elsewhere, not_found, policy, examples, writer_map
    differences: the inferred map against the layout, one sentence each
    writer_layout: the layout with each misplaced region's inferred map (a
               Layout for nvfp4kv.compare / check), or None; writer_layout_json
               its JSON text; writer_layout_check check()'s verdict on it
    text(), json(), to_dict(): the CLI's text, its --json report, and that parsed
    """

    @property
    def writer_layout(self) -> Optional[Layout]:
        return self._r.writer_layout

    @property
    def writer_layout_json(self) -> Optional[str]:
        return self._r.writer_layout_json

    @property
    def regions(self) -> Dict[str, Dict[str, Any]]:
        return {r["region"]: r for r in self.to_dict()["regions"]}

    @property
    def verdicts(self) -> Dict[str, str]:
        return {r["region"]: r["verdict"] for r in self.to_dict()["regions"]}

    @property
    def writer_layout_check(self) -> Optional[str]:
        return self._r.writer_layout_check if self._r.writer_layout is not None else None

    def __repr__(self) -> str:
        return "<nvfp4kv.conformance.WriteReport %s: %s>" % (
            "PASS" if self.ok else "FAIL", ", ".join("%s %s" % kv for kv in self.verdicts.items()))


class ReadReport(_Report):
    """What check_read_rows or check_read_attention found.

    ok:        every block read right (rows), every probe output right (attention)
    mode:      "rows" or "attention"
    sides:     {"K": counts, "V": counts}: elements, correct, blocks,
               blocks_misread, wrong_data, wrong_scale, aliased, unidentified (rows)
    attention: probe counts (probe_rows, correct, wrong_token, v_misread,
               non_finite, unidentified, not_isolating) and examples
    examples:  misread blocks: the bytes and the scale each used, and whose they are
    reader_maps, differences, reader_layout (a Layout or None), reader_layout_json:
               the reader's map, inferred from where its misread bytes came from
    text(), json(), to_dict(): the CLI's text, its --json report, and that parsed
    """

    @property
    def mode(self) -> str:
        return self._r.mode

    @property
    def sides(self) -> Dict[str, Dict[str, int]]:
        return self.to_dict()["sides"]

    @property
    def attention(self) -> Dict[str, Any]:
        return self.to_dict()["attention"]

    @property
    def examples(self) -> List[Dict[str, Any]]:
        return self.to_dict()["examples"]

    @property
    def reader_maps(self) -> Dict[str, Dict[str, Any]]:
        return self.to_dict()["reader_maps"]

    @property
    def reader_layout(self) -> Optional[Layout]:
        return self._r.reader_layout

    @property
    def reader_layout_json(self) -> Optional[str]:
        return self._r.reader_layout_json

    def __repr__(self) -> str:
        return "<nvfp4kv.conformance.ReadReport (%s) %s>" % (self.mode, "PASS" if self.ok else "FAIL")


def check_write(kit: Kit, buffers: Any, max_examples: int = 8) -> WriteReport:
    """Check an engine's writer: ``buffers`` as it left them after storing
    kit.k and kit.v through kit.slots into layer kit.layer, with the kit's
    global scales, into buffers first filled with kit.poison (kit.empty_buffers()).

    buffers: a list of uint8 arrays, one per layout buffer in the layout's
             order, or a dict buffer name -> array (or one array for a
             one-buffer layout). Each on the CPU (NumPy or any DLPack array),
             contiguous, of any shape, exactly the buffer's bytes (for a
             per-layer buffer, layer kit.layer's allocation).
    max_examples: misplaced elements reported per region.
    """
    return WriteReport(_core.conformance_check_write(_kit_core(kit), buffers, int(max_examples)))


def _reader_array(a: Any) -> Any:
    """NumPy bf16 (ml_dtypes) or uint16 bf16 bit patterns as float32; anything else as it is."""
    _require_array(a)
    if isinstance(a, np.ndarray) and a.dtype.name == "bfloat16":
        return a.astype(np.float32)
    if isinstance(a, np.ndarray) and a.dtype == np.uint16:
        return _bf16_bits_to_f32(a)
    return a


def check_read_rows(kit: Kit, k: Any, v: Any, max_examples: int = 8) -> ReadReport:
    """Check an engine's reader on the kit's cache (``kit.cache``): its K and V
    rows dequantized, (R, H, D) in sequence order (kit.block_tables,
    kit.seq_lens), float32, float16, bfloat16 (torch, ml_dtypes) or uint16 bf16
    bit patterns, on the CPU, contiguous. Each element must equal
    kit.expected_k / expected_v; each misread block is traced to the data and
    scale bytes it used."""
    return ReadReport(_core.conformance_check_read_rows(_kit_core(kit), _reader_array(k), _reader_array(v),
                                                        int(max_examples)))


def check_read_attention(kit: Kit, out: Any, max_examples: int = 8) -> ReadReport:
    """Check an engine's decode attention over the kit's probes: ``out``
    (P, q_heads, D) as the reader computed it for queries kit.q over
    kit.probe_block_tables / kit.probe_seq_lens with kit.softmax_scale (dtypes
    as check_read_rows). A right output is the V row of the token the probe
    singles out; a wrong one is traced (another token's V, V bytes from elsewhere)."""
    return ReadReport(_core.conformance_check_read_attention(_kit_core(kit), _reader_array(out), int(max_examples)))


def _kit_core(kit: Any) -> Any:
    if not isinstance(kit, Kit):
        raise ArgumentError("kit: expected an nvfp4kv.conformance.Kit (from gen or load_kit), got %s"
                            % type(kit).__name__)
    return kit._k
