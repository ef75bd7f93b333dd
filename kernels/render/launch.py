"""Render a dialect kernel for one backend and launch it through ``mx.fast``.

A :class:`KernelSource` is everything that identifies a kernel's source text: the dialect body,
input/output names and the ``${...}`` values. Rendering it gives a :class:`Rendered` (name with a
hash of the exact source, so MLX's per-name caches -- including CUDA's on-disk PTX cache -- never
mix two sources), and :func:`compiled` turns that into an ``mx.fast`` kernel object, cached by
value.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import mlx.core as mx

from ..spec import GpuBackend, KernelBuildError, KernelFn
from . import cuda as render_cuda
from . import dialect

TemplateArg = tuple[str, Any]


@dataclass(frozen=True)
class KernelSource:
    name: str
    body: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    values: tuple[tuple[str, str], ...] = ()
    header: str = ""  # extra dialect helpers, rendered like the body


@dataclass(frozen=True)
class Rendered:
    name: str
    backend: GpuBackend
    source: str
    header: str  # what MLX gets: the prelude's part the kernel uses, then ``own_header``
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    own_header: str = ""  # the kernel's own helpers (its KernelSource's header, rendered)


@lru_cache(maxsize=2048)
def render(src: KernelSource, backend: GpuBackend) -> Rendered:
    values = dict(src.values)
    body = dialect.render(src.body, backend, values)
    header = dialect.render(src.header, backend, values)
    if backend == "cuda":  # the text MLX hashes on every launch: compacted, and only the helpers it uses
        body, header = render_cuda.compact(body), render_cuda.compact(header)
        full = dialect.prelude_for(backend, header + "\n" + body) + header
    else:
        full = dialect.prelude(backend) + header
    digest = hashlib.sha256((full + "\n" + body).encode()).hexdigest()[:12]
    return Rendered(f"kf_{src.name}_{digest}", backend, body, full, src.inputs, src.outputs, header)


@lru_cache(maxsize=2048)
def compiled(rendered: Rendered) -> Any:
    """The ``mx.fast`` kernel object for ``rendered`` (JIT happens at first launch)."""
    try:
        if rendered.backend == "metal":
            return mx.fast.metal_kernel(
                name=rendered.name,
                input_names=list(rendered.inputs),
                output_names=list(rendered.outputs),
                source=rendered.source,
                header=rendered.header,
                ensure_row_contiguous=True,
            )
        return mx.fast.cuda_kernel(
            name=rendered.name,
            input_names=list(rendered.inputs),
            output_names=list(rendered.outputs),
            source=rendered.source,
            header=rendered.header,
            ensure_row_contiguous=True,
        )
    except (RuntimeError, ValueError) as e:
        raise KernelBuildError(f"{rendered.name}: {e}") from e


@dataclass(frozen=True)
class Launch:
    """One launch geometry: ``grid`` = total threads, ``threadgroup`` = threads per group."""

    grid: tuple[int, int, int]
    threadgroup: tuple[int, int, int]
    template: tuple[TemplateArg, ...] = field(default=())


@dataclass(frozen=True)
class LaunchRecord:
    """What one launch would hand to MLX (for inspecting or compile-checking the exact source)."""

    rendered: Rendered
    launch: Launch
    input_dtypes: tuple[mx.Dtype, ...]
    input_shapes: tuple[tuple[int, ...], ...]
    output_shapes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[mx.Dtype, ...]


Interceptor = Callable[[LaunchRecord, Sequence[mx.array]], list[mx.array]]
_intercept: ContextVar[Interceptor | None] = ContextVar("kf_intercept", default=None)


@contextlib.contextmanager
def intercept(handler: Interceptor) -> Iterator[None]:
    """Hand every launch to ``handler`` (the record MLX would get, and the inputs) instead of MLX:
    what it returns are the launch's outputs. For :func:`capture` and the Metal emulator's backend
    (``kernels/testing``)."""
    token = _intercept.set(handler)
    try:
        yield
    finally:
        _intercept.reset(token)


# the :func:`intercept` handler launches go to here, or None (MLX): a caller that keeps its own
# ``mx.compile``d graphs takes its plain path under a handler, as :func:`compiled_call` does. The
# ContextVar's own method: no Python frame on a hot path
interceptor = _intercept.get


@contextlib.contextmanager
def capture() -> Iterator[list[LaunchRecord]]:
    """Record launches instead of running them (outputs are zeros of the right shape and dtype).

    Works on any backend, including CPU: rendering needs no GPU.
    """
    records: list[LaunchRecord] = []

    def record(rec: LaunchRecord, inputs: Sequence[mx.array]) -> list[mx.array]:
        records.append(rec)
        return [mx.zeros(s, dtype=d) for s, d in zip(rec.output_shapes, rec.output_dtypes, strict=True)]

    with intercept(record):
        yield records


def run(
    src: KernelSource,
    backend: GpuBackend,
    inputs: Sequence[mx.array],
    launch: Launch,
    output_shapes: Sequence[Sequence[int]],
    output_dtypes: Sequence[mx.Dtype],
) -> list[mx.array]:
    rendered = render(src, backend)
    handler = _intercept.get()
    if handler is not None:
        return handler(LaunchRecord(
            rendered, launch, tuple(a.dtype for a in inputs), tuple(tuple(a.shape) for a in inputs),
            tuple(tuple(s) for s in output_shapes), tuple(output_dtypes)), inputs)
    kernel = compiled(rendered)
    outs = kernel(
        inputs=list(inputs),
        template=list(launch.template),
        grid=launch.grid,
        threadgroup=launch.threadgroup,
        output_shapes=[tuple(s) for s in output_shapes],
        output_dtypes=list(output_dtypes),
    )
    return list(outs)


def compiled_call(fn: KernelFn) -> KernelFn:
    """The custom-kernel function ``fn`` as one ``mx.compile``d graph of its inputs: traced on the
    first call for each input shape, replayed after that. The tuner times custom candidates this way
    and the runtime runs them this way.

    Calling an ``mx.fast`` custom kernel from Python makes MLX write the kernel's whole source text
    again (``build_kernel`` in custom_kernel.cpp); a replayed graph skips that and our Python
    wrapper. Measured on an H100 host (``benchmarks/results/h100_launch_floor.txt``, 16 ms rounds):
    a 32x4096 rmsnorm launch took 38.3 µs plain and 22.1 µs compiled, a 32x14336 swiglu 27.4 and
    17.8 µs. The built-ins stay plain: compiling ``mx.fast.rms_norm`` made it slower (18.8 -> 20.8
    µs). Under :func:`capture` (any :func:`intercept`) the plain ``fn`` runs, so a trace never keeps
    the captured zeros.
    """
    graph = mx.compile(lambda *arrays: fn(list(arrays)))

    def call(inputs: Sequence[mx.array]) -> list[mx.array]:
        if _intercept.get() is not None:
            return fn(inputs)
        return list(graph(*inputs))

    return call
