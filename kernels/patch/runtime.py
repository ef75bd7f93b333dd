"""Run catalog kernels in user code with the best known config for this chip.

Choice per call: the profile entry for (kernel, shape, dtype) on this chip
(:func:`kernelfleet.kernels.patch.profile_file.lookup`), else the spec's default config. A profile
entry whose config is the built-in runs the built-in; so does a backend without custom kernels
(CPU), a dtype or shape the custom kernel does not handle, and a stale profile config that is no
longer in the kernel's space (logged once). A custom kernel runs as one ``mx.compile``d graph
(:func:`~kernelfleet.kernels.render.launch.compiled_call`), as the tuner timed it; those graphs are cached
per (kernel, config key, dtype, shape, parameters), all plain values, and the :data:`MAX_BUILT`
most recently used are kept.
"""

from __future__ import annotations

import importlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache, lru_cache, partial
from typing import Any

import mlx.core as mx

from kernelfleet.chips import detect_chip

from ..common import dtype_name
from ..render.launch import compiled_call
from ..spec import BUILTIN, BadShape, Config, GpuBackend, KernelFn, Shape, config_key, format_shape
from . import profile_file

logger = logging.getLogger(__name__)

Params = tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Target:
    chip: str
    backend: str  # "metal" | "cuda" | "cpu"


def target() -> Target:
    """This process's chip name and backend (detected once per process)."""
    return _detect()


@cache
def _detect() -> Target:
    info = detect_chip()
    return Target(str(info.name), str(info.backend))


def gpu_backend() -> GpuBackend | None:
    b = target().backend
    if b == "metal":
        return "metal"
    if b == "cuda":
        return "cuda"
    return None


MAX_BUILT = 256
_built: OrderedDict[tuple[str, str, str, Shape, Params, str], KernelFn] = OrderedDict()
_warned: set[tuple[str, str, str, str]] = set()


def choose_config(name: str, shape: Shape, dtype: str) -> Config:
    """The config to run for ``name`` at ``shape``/``dtype`` on this chip."""
    spec = _module(name).SPEC
    entry = profile_file.lookup(name, format_shape(shape), dtype, target().chip)
    if entry is not None:
        config = dict(entry.get("config") or {})
        if config == BUILTIN or _in_space(name, tuple(shape), dtype, _items(config)):
            return config
        key = (name, format_shape(shape), dtype, config_key(config) if config else "?")
        if key not in _warned:
            _warned.add(key)
            logger.warning("profile config %s for %s %s %s is not in the kernel's space; using the default",
                           key[3], name, key[1], dtype)
    return spec.default_config(shape, dtype)


def _items(config: Config) -> tuple[tuple[str, Any], ...] | None:
    items = tuple(sorted(config.items()))
    try:
        hash(items)
    except TypeError:  # e.g. a list value in a hand-edited profile: not in any space
        return None
    return items


@lru_cache(maxsize=4096)
def _in_space(name: str, shape: Shape, dtype: str, items: tuple[tuple[str, Any], ...] | None) -> bool:
    """Whether the config ``dict(items)`` is in the kernel's space at this shape (cached: enumerating a
    space costs up to ~0.5 ms, and :func:`dispatch` asks on every call)."""
    return items is not None and dict(items) in _module(name).SPEC.space(shape, dtype)


@cache
def _module(name: str) -> Any:
    return importlib.import_module(f"kernelfleet.kernels.catalog.{name}_kernel")


def dispatch(name: str, inputs: Sequence[mx.array], shape: Shape, dtype_of: int = 0,
             **params: Any) -> list[mx.array]:
    """Run kernel ``name`` on ``inputs``; ``shape`` is the kernel's canonical shape for them."""
    mod = _module(name)
    spec = mod.SPEC
    dtype = _dtype(inputs[dtype_of])
    if gpu_backend() is None or dtype not in spec.dtypes:
        return list(mod.builtin(inputs, **params))
    try:
        spec.validate_shape(shape)
        config = choose_config(name, shape, dtype)
    except BadShape:
        return list(mod.builtin(inputs, **params))
    return resolve(name, shape, dtype, config, params)(inputs)


def run(name: str, inputs: Sequence[mx.array], shape: Shape, config: Config, **params: Any) -> list[mx.array]:
    """Run kernel ``name`` with ``config`` as chosen by the caller (e.g. from a profile the caller holds:
    :mod:`kernelfleet.kernels.patch.model_patch`); the built-in where ``config`` is it, on a backend without
    custom kernels (CPU), or for a dtype the kernel does not take."""
    return resolve(name, shape, _dtype(inputs[0]), config, params)(inputs)


Runner = Callable[[Sequence[mx.array]], list[mx.array]]


def resolve(name: str, shape: Shape, dtype: str, config: Config, params: dict[str, Any]) -> Runner:
    """What :func:`run` would call for these arguments (``dtype``: the first input's, as
    :func:`kernelfleet.kernels.common.dtype_name` gives it, "" for other dtypes), resolved once: a
    caller that makes the same call many times (a patched model's module) keeps it and skips the
    per-call lookups, which are host time on every call of a forward."""
    mod = _module(name)
    backend = gpu_backend()
    if backend is None or dtype not in mod.SPEC.dtypes or config == BUILTIN:
        return partial(_builtin, mod.builtin, params)
    pkey: Params = tuple(sorted(params.items()))
    key = (name, config_key(config), dtype, tuple(shape), pkey, backend)
    fn = _built.get(key)
    if fn is None:
        fn = compiled_call(mod.make(config, backend, shape, dtype, **params))
        _built[key] = fn
        if len(_built) > MAX_BUILT:
            _built.popitem(last=False)
    else:
        _built.move_to_end(key)
    return fn


def _builtin(fn: Callable[..., Sequence[mx.array]], params: dict[str, Any], inputs: Sequence[mx.array]
             ) -> list[mx.array]:
    return list(fn(inputs, **params))


def _dtype(x: mx.array) -> str:
    return dtype_name(x.dtype) if x.dtype in (mx.float32, mx.float16, mx.bfloat16) else ""


def builtin(name: str, inputs: Sequence[mx.array], **params: Any) -> list[mx.array]:
    """The MLX built-in variant of kernel ``name``."""
    return list(_module(name).builtin(inputs, **params))


def clear_caches() -> None:
    """Forget built kernels and the detected target (tests, or after pulling a new profile)."""
    _built.clear()
    _warned.clear()
    _in_space.cache_clear()
    _detect.cache_clear()
