"""Capture the launches zmlx's own functions make, without running them.

zmlx launches every kernel through ``zmlx.metal.MetalKernel.__call__``, which fills in defaults
(grid, threadgroup, output shapes) and then calls the ``mx.fast.metal_kernel`` object it built.
Off a Mac, building that object works and calling it raises "No Metal back-end". Inside
:func:`intercept`, the call reaches a handler instead of the ``mx.fast`` object, with exactly the
arguments zmlx hands to MLX (and the kernel's name, source and header) as a :class:`ZmlxLaunch`;
:func:`capture` records them and returns zeros of the declared output shapes and dtypes, so the
zmlx function runs to completion on any machine. The tests hand them to the Metal CPU emulator.

Only launches made in the intercepting context are handled (a ContextVar); zmlx's class is
patched while at least one interception is open and restored afterwards.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import mlx.core as mx


class ZmlxMissing(ImportError):
    """zmlx is not installed: ``pip install 'kernelfleet[zmlx]'``."""


def import_zmlx_metal() -> Any:
    try:
        import zmlx.metal as zm
    except ImportError as e:
        raise ZmlxMissing("zmlx is not installed; install it with: pip install 'kernelfleet[zmlx]'") from e
    return zm


@dataclass(frozen=True)
class ZmlxLaunch:
    """One zmlx launch as MLX would receive it."""

    name: str
    source: str
    header: str
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    ensure_row_contiguous: bool
    atomic_outputs: bool
    input_shapes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[mx.Dtype, ...]
    template: tuple[tuple[str, Any], ...]
    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[mx.Dtype, ...]
    init_value: Any = None
    kernel: Any = field(default=None, compare=False, repr=False)  # zmlx's MetalKernel object


Handler = Callable[[ZmlxLaunch, Sequence[mx.array]], list[mx.array]]
_handler: ContextVar[Handler | None] = ContextVar("kf_zmlx_intercept", default=None)
_lock = threading.Lock()
_open = 0
_original_call: Any = None


class _Launcher:
    """Stands in for the ``mx.fast.metal_kernel`` object of one zmlx kernel during one call."""

    def __init__(self, kernel: Any, handler: Handler) -> None:
        self.kernel = kernel
        self.handler = handler

    def __call__(self, *, inputs: Sequence[mx.array], template: Sequence[tuple[str, Any]],
                 grid: Sequence[int], threadgroup: Sequence[int], output_shapes: Sequence[Sequence[int]],
                 output_dtypes: Sequence[mx.Dtype], init_value: Any = None,
                 verbose: bool = False) -> list[mx.array]:
        s = self.kernel.spec
        launch = ZmlxLaunch(
            name=s.name, source=s.source, header=s.header or "", input_names=tuple(s.input_names),
            output_names=tuple(s.output_names), ensure_row_contiguous=bool(s.ensure_row_contiguous),
            atomic_outputs=bool(s.atomic_outputs),
            input_shapes=tuple(tuple(int(d) for d in a.shape) for a in inputs),
            input_dtypes=tuple(a.dtype for a in inputs), template=tuple((str(k), v) for k, v in template),
            grid=(int(grid[0]), int(grid[1]), int(grid[2])),
            threadgroup=(int(threadgroup[0]), int(threadgroup[1]), int(threadgroup[2])),
            output_shapes=tuple(tuple(int(d) for d in sh) for sh in output_shapes),
            output_dtypes=tuple(output_dtypes), init_value=init_value, kernel=self.kernel)
        return self.handler(launch, inputs)


def _intercepted_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    handler = _handler.get()
    if handler is None:
        return _original_call(self, *args, **kwargs)
    real = self.__dict__.get("_kernel")
    self._kernel = _Launcher(self, handler)
    try:
        return _original_call(self, *args, **kwargs)
    finally:
        self._kernel = real


@contextlib.contextmanager
def intercept(handler: Handler) -> Iterator[None]:
    """Inside, every zmlx launch goes to ``handler(launch, inputs)`` instead of MLX; its return value
    is what zmlx's function gets as the kernel's outputs (e.g. the Metal emulator's)."""
    global _open, _original_call
    zm = import_zmlx_metal()
    with _lock:
        if _open == 0:
            _original_call = zm.MetalKernel.__call__
            zm.MetalKernel.__call__ = _intercepted_call
        _open += 1
    token = _handler.set(handler)
    try:
        yield
    finally:
        _handler.reset(token)
        with _lock:
            _open -= 1
            if _open == 0:
                zm.MetalKernel.__call__ = _original_call
                _original_call = None


@contextlib.contextmanager
def capture() -> Iterator[list[ZmlxLaunch]]:
    """Record the launches of zmlx functions called inside (their outputs are zeros)."""
    records: list[ZmlxLaunch] = []

    def record(launch: ZmlxLaunch, inputs: Sequence[mx.array]) -> list[mx.array]:
        records.append(launch)
        outs = zip(launch.output_shapes, launch.output_dtypes, strict=True)
        return [mx.zeros(sh, dtype=d) for sh, d in outs]

    with intercept(record):
        yield records
