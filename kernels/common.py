"""Small shared pieces of the catalog: dtype names, deterministic inputs, shape checks."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import mlx.core as mx
import numpy as np

from .spec import DTYPES, BadShape, Shape, Tolerance, UnsupportedDtype

MX_DTYPES: dict[str, mx.Dtype] = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}
ITEMSIZE: dict[str, int] = {"float32": 4, "float16": 2, "bfloat16": 2}

# Default tolerances for outputs rounded to the dtype once from a float32 computation
# (bfloat16 keeps 8 mantissa bits, float16 11): |out - ref| <= atol + rtol * |ref|.
TOLERANCES: dict[str, Tolerance] = {
    "float32": Tolerance(atol=2e-5, rtol=2e-5),
    "float16": Tolerance(atol=2e-3, rtol=4e-3),
    "bfloat16": Tolerance(atol=1.6e-2, rtol=2e-2),
}


def mx_dtype(dtype: str) -> mx.Dtype:
    try:
        return MX_DTYPES[dtype]
    except KeyError:
        raise UnsupportedDtype(f"unsupported dtype {dtype!r}; expected one of {', '.join(DTYPES)}") from None


def dtype_name(dt: mx.Dtype) -> str:
    for name, d in MX_DTYPES.items():
        if d == dt:
            return name
    raise UnsupportedDtype(f"unsupported dtype {dt}; expected one of {', '.join(DTYPES)}")


def rng(seed: int, salt: int = 0) -> np.random.Generator:
    return np.random.default_rng([int(seed), int(salt)])


_SHAPES_ONLY: ContextVar[bool] = ContextVar("kf_shapes_only", default=False)


@contextlib.contextmanager
def shapes_only() -> Iterator[None]:
    """Inside, :func:`normal` gives unevaluated zeros of the right shape and dtype instead of seeded
    data. For capturing the launches a config makes (``launch.capture``), where only the inputs'
    shapes and dtypes count: numpy takes seconds to make one 16384x8192 input."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


def shapes_only_on() -> bool:
    """Whether inputs are being made inside :func:`shapes_only`."""
    return _SHAPES_ONLY.get()


def normal(shape: Sequence[int], dtype: str, seed: int, salt: int = 0, scale: float = 1.0,
           loc: float = 0.0) -> mx.array:
    if _SHAPES_ONLY.get():
        return mx.zeros(tuple(shape), dtype=mx_dtype(dtype))  # lazy: nothing is allocated or computed
    data = rng(seed, salt).standard_normal(tuple(shape), dtype=np.float32) * np.float32(scale)
    return mx.array(data + np.float32(loc)).astype(mx_dtype(dtype))


def prod(dims: Sequence[int]) -> int:
    return int(math.prod(dims))


def need_rank(name: str, shape: Shape, rank: int, doc: str) -> None:
    if len(shape) != rank:
        raise BadShape(f"{name}: expected a rank-{rank} shape ({doc}), got {'x'.join(map(str, shape))}")


def flat_rows(a: mx.array, *tail: int) -> mx.array:
    """``a`` as ``(rows, *tail)``, rows being the product of its other dimensions. The sizes are
    explicit, never -1: MLX hands back the array itself when the shape does not change, while a
    reshape with -1 is always a new graph node (on an H100 host, decode-size launches took 21-24 µs
    each, 0.3-2.4 µs less than with -1, in 7 of 7 paired measurements)."""
    return a.reshape(a.size // prod(tail), *tail)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)
