"""The KernelSpec contract: everything the tuner needs to know about one catalog kernel.

Importable with only ``mlx`` and ``numpy`` (no pydantic, FastAPI or SQLAlchemy), so it runs on a
bare GPU host.

Vocabulary
- shape: a tuple of positive ints, written ``"4096x4096"`` on the wire; each kernel says what its
  dimensions mean (e.g. rows x cols).
- config: a flat ``dict[str, int | str]`` of parameter values, e.g. ``{"tg": 256, "vec": 4}``.
  The MLX built-in is the config ``{"variant": "builtin"}``.
- config key: the canonical string of a config (:func:`config_key`), e.g. ``"tg=256,vec=4"`` or
  ``"builtin"``; it names a trial in results and profiles.
- A kernel call takes a list of input arrays and returns a list of output arrays (most kernels
  return one).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import mlx.core as mx

Shape = tuple[int, ...]
Config = dict[str, Any]
KernelFn = Callable[[Sequence[mx.array]], list[mx.array]]
GpuBackend = Literal["metal", "cuda"]

BUILTIN: Config = {"variant": "builtin"}
DTYPES = ("float32", "float16", "bfloat16")


class KernelError(Exception):
    """Base class for errors raised by the kernel catalog."""


class UnknownKernel(KernelError):
    pass


class BadShape(KernelError):
    pass


class UnsupportedDtype(KernelError):
    pass


class KernelBuildError(KernelError):
    """The rendered kernel could not be built (compile error) for this backend."""


def config_key(config: Mapping[str, Any]) -> str:
    if dict(config) == BUILTIN:
        return "builtin"
    return ",".join(f"{k}={config[k]}" for k in sorted(config))


def parse_config_key(key: str) -> Config:
    if key == "builtin":
        return dict(BUILTIN)
    out: Config = {}
    for part in key.split(","):
        k, _, v = part.partition("=")
        out[k] = int(v) if v.lstrip("-").isdigit() else v
    return out


def parse_shape(text: str) -> Shape:
    """``"4096x4096"`` -> ``(4096, 4096)``; raises :class:`BadShape` with a clear message."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        dims = tuple(int(p) for p in parts)
    except ValueError:
        raise BadShape(
            f"malformed shape {text!r}: expected positive integers joined by 'x', like 4096x4096"
        ) from None
    if not dims or any(d <= 0 for d in dims):
        raise BadShape(f"malformed shape {text!r}: every dimension must be a positive integer")
    return dims


def format_shape(shape: Shape) -> str:
    return "x".join(str(d) for d in shape)


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float


@dataclass(frozen=True)
class KernelSpec:
    """One catalog kernel. Each module in ``kernelfleet.kernels`` exports one as ``SPEC``.

    Attributes the tuner relies on (documented here; implementations live in the kernel modules):

    - ``name``, ``description``; ``dtypes`` it supports; ``rank`` / ``shape_doc`` describing shapes;
      ``shapes``: ``{"decode": [...], "large": [...]}`` used by benchmarks.
    - ``make_inputs(shape, dtype, seed) -> list[mx.array]``: deterministic (numpy RNG) inputs.
    - ``reference(inputs) -> list[mx.array]``: plain MLX ops computed in float32.
    - ``builtin(inputs) -> list[mx.array]``: the MLX built-in (``mx.fast.*``, ``mx.softmax``, an
      ``mx.compile``d composition); always available, on every backend including CPU.
    - ``space(shape, dtype) -> list[Config]``: the valid custom configs (constraints applied), over
      every backend; ``space_for(shape, dtype, backend)``: those one backend runs.
    - ``build(config, backend, shape, dtype) -> KernelFn``: the custom kernel rendered for ``backend``
      (raises :class:`KernelBuildError`).
    - ``tolerance(dtype) -> Tolerance``.
    - ``bytes_moved(shape, dtype) -> int``: minimum bytes read + written, for achieved bandwidth.
    - ``version``: a hash of the kernel's sources (body, rendering, spec module).
    """

    name: str
    description: str
    dtypes: tuple[str, ...]
    shape_doc: str
    shapes: Mapping[str, Sequence[Shape]]
    make_inputs: Callable[[Shape, str, int], list[mx.array]]
    reference: Callable[[Sequence[mx.array]], list[mx.array]]
    builtin: Callable[[Sequence[mx.array]], list[mx.array]]
    space: Callable[[Shape, str], list[Config]]
    build: Callable[[Config, GpuBackend, Shape, str], KernelFn]
    tolerances: Mapping[str, Tolerance]
    bytes_moved: Callable[[Shape, str], int]
    version: str
    validate_shape: Callable[[Shape], None] = field(default=lambda shape: None)
    # Additions (all defaulted, so the fields above keep their meaning):
    # small shapes the catalog test checks every candidate on (odd row counts exercise bounds)
    test_shapes: Sequence[Shape] = ()
    # the config used when no profile names one; None -> the first config of ``space``
    default: Callable[[Shape, str], Config] | None = None
    # indices of outputs that must match the reference exactly (e.g. top-k expert indices)
    exact_outputs: tuple[int, ...] = ()
    # a cheap model of a config's cost at (shape, dtype), lower = expected faster, computed without
    # compiling anything: the "model" search strategy measures only the best few by it. None -> the
    # tuner's generic prior (distance from the default config).
    prior: Callable[[Shape, str, Config], float] | None = None
    # the GPU backends whose workers offer the custom configs (zmlx's kernels: Metal only)
    backends: tuple[GpuBackend, ...] = ("metal", "cuda")
    # elements of the largest tensor a job at this shape allocates, where the shape is not itself a
    # tensor's (quantized matmuls: tokens x in x out x bits x group); None -> the shape's product
    largest_tensor: Callable[[Shape], int] | None = None
    # the GPU backends that can run a given config, where that differs by config (quantized matmul's
    # tensor-core path: CUDA only); None -> every backend of ``backends``
    config_backends: Callable[[Config], tuple[GpuBackend, ...]] | None = None

    def space_for(self, shape: Shape, dtype: str, backend: GpuBackend) -> list[Config]:
        """The configs of ``space`` that ``backend`` can run (what a worker on it tunes)."""
        configs = self.space(shape, dtype)
        if self.config_backends is None:
            return configs
        return [c for c in configs if backend in self.config_backends(c)]

    def tolerance(self, dtype: str) -> Tolerance:
        return self.tolerances[dtype]

    def check_dtype(self, dtype: str) -> None:
        if dtype not in self.dtypes:
            raise UnsupportedDtype(
                f"kernel {self.name!r} does not support dtype {dtype!r}; supported: {', '.join(self.dtypes)}"
            )

    def tensor_elements(self, shape: Shape) -> int:
        """Elements of the largest tensor a job at ``shape`` allocates (campaigns bound it)."""
        if self.largest_tensor is not None:
            return self.largest_tensor(shape)
        return math.prod(shape)

    def default_config(self, shape: Shape, dtype: str) -> Config:
        """The config to run when no profile entry exists (builtin when the space is empty)."""
        if self.default is not None:
            return self.default(shape, dtype)
        configs = self.space(shape, dtype)
        return dict(configs[0]) if configs else dict(BUILTIN)

    def compare(self, outputs: Sequence[mx.array], reference: Sequence[mx.array], dtype: str) -> Comparison:
        """Check ``outputs`` against the float32 ``reference`` with this kernel's tolerance."""
        return compare(outputs, reference, self.tolerance(dtype), self.exact_outputs)


@dataclass(frozen=True)
class Comparison:
    ok: bool
    max_abs_err: float | None  # None when not measurable (wrong shape, NaN/inf where the reference is finite)
    max_rel_err: float | None
    detail: str = ""


def _error_stats(out: mx.array, ref: mx.array, atol: mx.array, rtol: mx.array) -> mx.array:
    """[NaN/inf count where the reference is finite, max abs err, max rel err, values outside
    tolerance] of one output, as one float32 vector (counts are exact up to 2**24)."""
    o = out.astype(mx.float32)
    finite = mx.isfinite(ref)
    nonfinite = mx.logical_not(mx.isfinite(o)) & finite
    d = mx.where(finite, mx.abs(o - ref), 0.0)
    ar = mx.where(finite, mx.abs(ref), 0.0)
    return mx.stack([mx.sum(nonfinite).astype(mx.float32), mx.max(d),
                     mx.max(d / mx.maximum(ar, atol)), mx.sum(d > atol + rtol * ar).astype(mx.float32)])


# One fused pass per output on the device (the elementwise work is compiled into one kernel feeding
# the reductions) and one read-back: verification runs once per candidate, so it must be cheap.
_error_stats_fused = mx.compile(_error_stats)


def compare(
    outputs: Sequence[mx.array],
    reference: Sequence[mx.array],
    tol: Tolerance,
    exact_outputs: Sequence[int] = (),
) -> Comparison:
    """Elementwise ``|out - ref| <= atol + rtol * |ref|`` over every output.

    Outputs listed in ``exact_outputs`` must be equal; NaN/inf where the reference is finite fail.
    ``max_rel_err`` is ``|out - ref| / max(|ref|, atol)``. Computed with MLX on the device, all
    outputs in one evaluation: copying a 16384x8192 output to the host for every candidate would
    cost seconds.
    """
    if len(outputs) != len(reference):
        return Comparison(False, None, None, f"expected {len(reference)} outputs, got {len(outputs)}")
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        if tuple(out.shape) != tuple(ref.shape):
            return Comparison(False, None, None,
                              f"output {i} has shape {tuple(out.shape)}, expected {tuple(ref.shape)}")
    atol = mx.array(max(tol.atol, 1e-12), dtype=mx.float32)
    rtol = mx.array(tol.rtol, dtype=mx.float32)
    pending: list[mx.array] = []
    for i, (out, ref) in enumerate(zip(outputs, reference, strict=True)):
        if i in exact_outputs:
            pending.append(mx.sum(out != ref).astype(mx.float32).reshape(1))
        elif out.size:
            pending.append(_error_stats_fused(out, ref.astype(mx.float32), atol, rtol))
        else:
            pending.append(mx.zeros((4,), dtype=mx.float32))
    values: list[float] = mx.concatenate(pending).tolist() if pending else []  # type: ignore[assignment]
    max_abs = max_rel = 0.0
    bad = total = 0
    at = 0
    for i, out in enumerate(outputs):
        if i in exact_outputs:
            differ = int(values[at])
            at += 1
            if differ:
                return Comparison(False, None, None,
                                  f"output {i}: {differ} of {out.size} values differ (exact match required)")
            continue
        nonfinite, abs_err, rel_err, outside = (float(v) for v in values[at:at + 4])
        at += 4
        if nonfinite:
            return Comparison(False, None, None,
                              f"output {i} has {int(nonfinite)} NaN/inf values (reference finite)")
        max_abs, max_rel = max(max_abs, abs_err), max(max_rel, rel_err)
        bad += int(outside)
        total += out.size
    if bad:
        return Comparison(False, max_abs, max_rel,
                          f"{bad} of {total} values outside tolerance "
                          f"(atol={tol.atol:g}, rtol={tol.rtol:g}); "
                          f"max abs err {max_abs:.3g}, max rel err {max_rel:.3g}")
    return Comparison(True, max_abs, max_rel)
