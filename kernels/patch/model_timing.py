"""Timing a model-shaped step: what ``benchmarks/model.py`` and the runtime-settings search
(``kernelfleet.worker.runtime_settings``) measure with (their verdicts: :mod:`.paired`).

- :func:`prefill_s`: seconds per prefill of ``n`` tokens (batch 1, fresh KV cache);
- :func:`decode_s`: seconds per step of mlx-lm's own decode loop at a batch, after a prefill.

Imports only mlx and mlx-lm.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from typing import Any

import mlx.core as mx
import mlx.nn as nn
from mlx_lm.models.cache import make_prompt_cache

from .model_build import TOKEN_IDS


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    mx.eval(fn())
    return time.perf_counter() - t0


PREFILLS_PER_ROUND = 4  # one prefill of 512 tokens is 4-6 ms on an H200: a round times several


def prefill_s(model: nn.Module, n: int) -> float:
    """Seconds per prefill of ``n`` tokens (each a fresh KV cache), the mean of a round's prefills
    after an untimed one."""
    tokens = mx.random.randint(0, TOKEN_IDS, (1, n), key=mx.random.key(n))
    timed(lambda: model(tokens, cache=make_prompt_cache(model)))
    return sum(timed(lambda: model(tokens, cache=make_prompt_cache(model)))
               for _ in range(PREFILLS_PER_ROUND)) / PREFILLS_PER_ROUND


def primed(model: nn.Module, batch: int, context: int) -> list[Any]:
    """A KV cache holding a ``context``-token prefill of ``batch`` sequences."""
    cache = make_prompt_cache(model)
    mx.eval(model(mx.random.randint(0, TOKEN_IDS, (batch, context), key=mx.random.key(1)), cache=cache))
    return cache


def decode_s(model: nn.Module, batch: int, context: int, steps: int) -> float:
    """Seconds per step of mlx-lm's decode loop (``generate_step``): the next step's graph is built
    and queued (``mx.async_eval``) while the GPU runs this one, so host time hides behind GPU time
    where there is GPU time to hide behind. The first step is untimed."""
    cache = primed(model, batch, context)

    def step(token: mx.array) -> mx.array:
        logits = model(token, cache=cache)
        return mx.argmax(logits[:, -1, :], axis=-1).astype(mx.int32)[:, None]

    y = step(mx.zeros((batch, 1), mx.int32))
    mx.eval(y)
    y = step(y)
    mx.async_eval(y)
    t0 = time.perf_counter()
    for _ in range(steps):
        following = step(y)
        mx.async_eval(following)
        mx.eval(y)
        y = following
    mx.eval(y)
    return (time.perf_counter() - t0) / steps


def without_gc(measure: Callable[[], float]) -> float:
    gc.collect()
    gc.disable()
    try:
        return measure()
    finally:
        gc.enable()
