"""A layer block's decode step as one compiled graph: the KV cache written and attended inside it.

At one position per sequence a layer block (:mod:`.model_layer`, :mod:`.model_moe_layer`) runs its pre
graph, mlx-lm's ``cache.update_and_fetch``, mlx-lm's attention and its post graph: three calls from Python
and, on MLX 0.32's CUDA backend, a cuDNN attention whose per-call graph update is the largest single host
cost of the step (some 28 us a layer; 19 % of a Llama-3-8B 4-bit decode loop's samples on an NVIDIA H200,
``benchmarks/results/h200_decode_host_profile.txt``). Where the cache is mlx-lm's ``KVCache`` (its
``update_and_fetch`` source checked) with room for the new position, :class:`DecodeGraph` does the same in
one ``mx.compile``d graph: the pre graph, the new keys and values written into the cache's buffers at the
offset (``mx.slice_update`` with the offset as an array, as ``update_and_fetch`` writes them), the attention
over the buffers' first ``offset + 1`` positions (:mod:`kernelfleet.kernels.catalog.decode_attention`, one
launch) and the post graph; the cache then holds the new buffers and offset, as after ``update_and_fetch``.
The graph's shapes change only when the cache grows (every 256 positions, which mlx-lm's own
``update_and_fetch`` does on that step), so one trace serves every step between.

It runs where custom kernels run (a GPU, or the Metal emulator in the tests) and the attention is the
plain one mlx-lm calls at a decode step: no mask, a head dim the kernel takes, the cache in the
queries' dtype. Anything else (a full cache, another cache class, a mask, a prefill) keeps the block's
path around mlx-lm's cache and attention.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
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


def kv_cache_class() -> type | None:
    """mlx-lm's ``KVCache`` where its ``update_and_fetch`` is the one this graph replaces, else None."""
    try:
        from mlx_lm.models.cache import KVCache
    except ImportError:
        return None
    return KVCache if source_has(KVCache.update_and_fetch, *CACHE_LINES) else None


@dataclass
class DecodeGraph:
    """One layer block's decode step at ``batch`` sequences as one graph (the module docstring): ``pre``
    and ``post`` are the block's graph functions (:func:`.model_layer.pre_graph`'s and its post graph's),
    ``heads`` its (query heads, KV heads, head dim)."""

    pre: Callable[..., Any]
    post: Callable[..., Any]
    batch: int
    heads: tuple[int, int, int]
    dtype: mx.Dtype
    backend: GpuBackend
    cache_class: Any  # mlx-lm's KVCache (kv_cache_class)
    _graphs: dict[tuple[float, int], tuple[Callable[..., Any], Callable[..., Any]]] = field(
        default_factory=dict, repr=False)

    def takes(self, cache: Any, mask: Any) -> bool:
        """Whether this step runs here: mlx-lm's ``KVCache`` with room for one more position, no mask."""
        if mask is not None or cache.__class__ is not self.cache_class or cache.keys is None:
            return False
        keys = cache.keys
        return cache.offset < keys.shape[2] and keys.dtype == self.dtype and cache.values.dtype == self.dtype

    def graph(self, scale: float, n_pre: int, plain: bool) -> Callable[..., Any]:
        """The step's function (``plain``: uncompiled, while launches are intercepted) for attention's
        ``scale``, the pre graph taking the first ``n_pre`` of the layer's arrays."""
        got = self._graphs.get((scale, n_pre))
        if got is None:
            heads, kv_heads, hd = self.heads
            attend = decode_attention.make(self.backend, self.batch, heads, kv_heads, hd,
                                           dtype_name(self.dtype), scale)
            pre, post = self.pre, self.post

            def step(x: mx.array, at: mx.array, keys: mx.array, values: mx.array, *arrays: mx.array
                     ) -> tuple[mx.array, mx.array, mx.array]:
                q, k, v, rows = pre(x, at, *arrays[:n_pre])
                keys = mx.slice_update(keys, k, at, axes=(2,))
                values = mx.slice_update(values, v, at, axes=(2,))
                out = attend([q, keys, values, at])[0]
                return post(rows, out, *arrays[n_pre:]), keys, values
            got = self._graphs[(scale, n_pre)] = (step, mx.compile(step))
        return got[0] if plain else got[1]

    def run(self, x: mx.array, at: mx.array, cache: Any, scale: float,
            arrays: tuple[tuple[mx.array, ...], ...], plain: bool) -> mx.array:
        """The step on ``x`` at the cache's offset (``at``: it as an array); the cache then holds the new
        buffers and offset."""
        out, cache.keys, cache.values = self.graph(scale, len(arrays[0]), plain)(
            x, at, cache.keys, cache.values, *arrays[0], *arrays[1])
        cache.offset += 1
        return out


def decode_graph(pre: Callable[..., Any], post: Callable[..., Any], shape: tuple[int, ...], dt: mx.Dtype,
                 heads: tuple[int, int, int], backend: GpuBackend | None) -> DecodeGraph | None:
    """The :class:`DecodeGraph` of a layer block's call at ``shape`` (batch, L, hidden), or None where it
    cannot run: more than one position, no custom kernels here, attention the kernel does not take, or an
    mlx-lm whose ``KVCache`` writes otherwise."""
    cache_class = kv_cache_class()
    if shape[1] != 1 or backend is None or cache_class is None \
            or not decode_attention.supports(*heads, dtype_name(dt)):
        return None
    return DecodeGraph(pre, post, shape[0], heads, dt, backend, cache_class)
