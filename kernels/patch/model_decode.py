"""A layer block's decode step with the KV cache written by the block and attended by a kernel of its own.

At one position per sequence a layer block (:mod:`.model_layer`, :mod:`.model_moe_layer`) ran its pre
graph, mlx-lm's ``cache.update_and_fetch``, mlx-lm's attention and its post graph. On MLX 0.32's CUDA
backend the attention over the cache's slices goes through cuDNN, whose per-call graph update is the
largest single host cost of the step (some 28 us a layer: 19 % of a Llama-3-8B 4-bit decode loop's samples
on an NVIDIA H200, ``benchmarks/results/h200_decode_host_profile.txt``), and ``update_and_fetch`` is a
third of the model call's Python. Where the cache is mlx-lm's ``KVCache`` (its ``update_and_fetch`` source
checked) with room for the new position, :class:`DecodeGraph` writes the new keys and values where
``update_and_fetch`` writes them, as it writes them (``cache.keys[..., prev:prev + 1, :] = keys``: MLX's
SliceUpdate, in place), and then runs the attention over the buffers' first ``offset`` positions and the
step's own keys and values (:mod:`kernelfleet.kernels.catalog.decode_attention`, one launch reading the
buffers whole: no slices) and the post graph as one ``mx.compile``d graph, whose shapes change only when
the cache grows (every 256 positions, a step that mlx-lm's own ``update_and_fetch`` takes), so one trace
serves every step between.

The writes stay outside the compiled graphs: inside one they would be ``mx.slice_update`` at the offset
as an array, whose copy (MLX's DynamicSliceUpdate, ``copy_gg_dynamic_nd``) took 35.6 us of GPU time a call
on the H200 and made the step no faster (``benchmarks/results/h200_model_llama4bit_decode_graph_ab.txt``).
Nor is the layer one graph with the writes after it (the attention reads the step's own position from
its keys and values, so it need not wait for them): measured by turns on the H200 that was slower,
0.962x [0.950, 0.993] at 4 bits, 0.980x at 8 (``benchmarks/results/h200_model_decode_one_graph_ab.txt``).
Nor does the kernel write the buffers itself: MLX would not know, and an array sharing the buffers (a
``copy.deepcopy`` of the cache, as mlx-lm's prompt cache makes) would change with them.

It runs where custom kernels run on a backend of :data:`BACKENDS` (CUDA: where it was measured; on Metal
MLX's own decode attention is a vector kernel without cuDNN's host cost, and this kernel is unmeasured
against it on a Mac; the tests run it on the Metal emulator) and the attention is the plain one mlx-lm
calls at a decode step: no mask, a head dim the kernel takes, the cache in the queries' dtype, one
sequence and at most :data:`MAX_POSITIONS` positions (the measured range: see :data:`MAX_BATCH`). Anything
else (a full cache, another cache class, a mask, a prefill, a batch, a longer context) keeps the block's
path around mlx-lm's cache and attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import mlx.core as mx

from ..catalog import decode_attention
from ..common import dtype_name
from ..spec import GpuBackend
from .model_patterns import source_has

# mlx-lm's KVCache.update_and_fetch (mlx-lm 0.32): where it has room, the new positions written at the offset
CACHE_LINES = (
    "prev = self.offset",
    "self.offset += keys.shape[2]",
    "self.keys[..., prev : self.offset, :] = keys",
    "self.values[..., prev : self.offset, :] = values",
)


BACKENDS: tuple[GpuBackend, ...] = ("cuda",)  # where a block runs its own decode attention
# Where it was measured: one sequence (batch 1, where the step is host time; at batch 8 the first design
# read 1.025x [0.902, 1.202] the block without it) up to 640 positions. Its GPU time grows with the
# positions (one group a query head, 19 us at 600 under ncu on the H200), and from some 1,500 positions a
# Llama-3-8B 4-bit step's GPU time would pass its host time: past MAX_POSITIONS, MLX's attention again
MAX_BATCH = 1
MAX_POSITIONS = 1024
REPORT_NOTE = "; its own decode attention"  # over mlx-lm's KVCache


@cache
def kv_cache_class() -> type | None:
    """mlx-lm's ``KVCache`` where its ``update_and_fetch`` is the one this graph replaces, else None (its
    source read once a process, not at each layer's bind)."""
    try:
        from mlx_lm.models.cache import KVCache
    except ImportError:
        return None
    return KVCache if source_has(KVCache.update_and_fetch, *CACHE_LINES) else None


@dataclass
class DecodeGraph:
    """One layer block's decode step at ``batch`` sequences (the module docstring): ``post`` is the block's
    post graph function, ``heads`` its (query heads, KV heads, head dim). ``shared(key, build)`` is the
    patch's graph under ``key``, built once (``Router.graph``), so every layer of the block's shape
    traces one graph, as its pre and post graphs are; ``key`` is the block's."""

    post: Callable[..., Any]
    batch: int
    heads: tuple[int, int, int]
    dtype: mx.Dtype
    backend: GpuBackend
    cache_class: Any  # mlx-lm's KVCache (kv_cache_class)
    shared: Callable[[Any, Callable[[], Any]], Any]
    key: tuple[Any, ...]
    _graphs: dict[float, tuple[Callable[..., Any], Callable[..., Any]]] = field(default_factory=dict,
                                                                               repr=False)

    def takes(self, cache: Any, mask: Any) -> bool:
        """Whether this step runs here: mlx-lm's ``KVCache`` with room for one more position, at most
        :data:`MAX_POSITIONS` of them, no mask."""
        if mask is not None or cache.__class__ is not self.cache_class or cache.keys is None:
            return False
        keys, offset = cache.keys, cache.offset
        return offset < keys.shape[2] and offset < MAX_POSITIONS and keys.dtype == self.dtype \
            and cache.values.dtype == self.dtype

    def graph(self, scale: float, plain: bool) -> Callable[..., Any]:
        """The attention and the post graph as one function (``plain``: uncompiled, while launches are
        intercepted) for attention's ``scale``."""
        got = self._graphs.get(scale)
        if got is None:
            key = (*self.key, self.dtype, scale)
            got = self._graphs[scale] = self.shared(key, lambda: self._build(scale))
        return got[0] if plain else got[1]

    def _build(self, scale: float) -> tuple[Callable[..., Any], Callable[..., Any]]:
        heads, kv_heads, hd = self.heads
        attend = decode_attention.make(self.backend, self.batch, heads, kv_heads, hd, dtype_name(self.dtype),
                                       scale)
        post = self.post

        def attend_post(rows: mx.array, q: mx.array, k_new: mx.array, v_new: mx.array, keys: mx.array,
                        values: mx.array, at: mx.array, *arrays: mx.array) -> mx.array:
            out: mx.array = post(rows, attend([q, k_new, v_new, keys, values, at])[0], *arrays)
            return out
        return attend_post, mx.compile(attend_post)

    def run(self, pre: Callable[..., Any], x: mx.array, at: mx.array, cache: Any, scale: float,
            arrays: tuple[tuple[mx.array, ...], ...], plain: bool) -> mx.array:
        """The step on ``x`` at the cache's offset (``at``: it as an array) after the block's ``pre``
        graph: the new keys and values written where ``update_and_fetch`` writes them (in place: MLX's
        SliceUpdate on the cache's buffers), then attention and the post graph in one call."""
        q, keys, values, rows = pre(x, at, *arrays[0])
        prev = cache.offset
        cache.offset = prev + 1
        cache.keys[..., prev:prev + 1, :] = keys
        cache.values[..., prev:prev + 1, :] = values
        out: mx.array = self.graph(scale, plain)(rows, q, keys, values, cache.keys, cache.values, at,
                                                  *arrays[1])
        return out


def report_note(heads: tuple[int, int, int], backend: GpuBackend | None) -> str:
    """What a layer block's report line says of its decode step: its own attention where it runs it on
    ``backend`` (the patch's; None: no custom kernels) for these heads, else nothing."""
    if backend not in BACKENDS or kv_cache_class() is None \
            or not decode_attention.supports(*heads, "bfloat16"):
        return ""
    return REPORT_NOTE


def decode_graph(post: Callable[..., Any], shape: tuple[int, ...], dt: mx.Dtype, heads: tuple[int, int, int],
                 backend: GpuBackend | None, shared: Callable[[Any, Callable[[], Any]], Any],
                 key: tuple[Any, ...]) -> DecodeGraph | None:
    """The :class:`DecodeGraph` of a layer block's call at ``shape`` (batch, L, hidden), its graphs shared
    under ``key`` through ``shared`` (``Router.graph``), or None where it cannot run: more than one
    position or :data:`MAX_BATCH` sequences, no custom kernels here or not on a backend of
    :data:`BACKENDS`, attention the kernel does not take, or an mlx-lm whose ``KVCache`` writes
    otherwise."""
    cache_class = kv_cache_class()
    if shape[1] != 1 or shape[0] > MAX_BATCH or backend not in BACKENDS or cache_class is None \
            or not decode_attention.supports(*heads, dtype_name(dt)):
        return None
    return DecodeGraph(post, shape[0], heads, dt, backend, cache_class, shared, key)
