"""The elementwise family (swiglu, geglu, bias+gelu): shared parameter space and geometry.

Inputs are ``rows x D``; a group of ``tg`` threads handles ``tg * ipt`` consecutive vectors of
``vec`` elements (step ``k`` of thread ``t`` takes vector ``group * tg * ipt + k * tg + t``, so
each step is one coalesced sweep). Axes: ``tg`` 64..1024, ``vec`` 1/2/4/8 (at most 16 bytes),
``ipt`` 1/2/4 vectors per thread; constraint ``D % vec == 0`` (a vector never crosses a row).

Dialect snippet :data:`INDEX` defines ``base`` (first vector of this thread) and the loop bound
``nvec`` from the first input's row count (``a_shape[0]``; inputs are named ``a``, ...).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from .common import DTYPES, ITEMSIZE, ceil_div, flat_rows, mx_dtype, need_rank
from .dialect import source_version
from .launch import KernelSource, Launch, run
from .spec import BadShape, Config, GpuBackend, Shape

TGS = (64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)
IPTS = (1, 2, 4)

INDEX = r"""
  const KF_SIZE nvec = KF_SIZE(a_shape[0]) * (D / V);
  const KF_SIZE base = KF_SIZE(KF_GROUP) * (TG * IPT) + KF_TID;
"""


def valid(config: Config, D: int, dtype: str) -> bool:
    try:
        tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])
    except (KeyError, TypeError, ValueError):
        return False
    return (set(config) == {"tg", "vec", "ipt"} and tg in TGS and vec in VECS and ipt in IPTS
            and D % vec == 0 and vec * ITEMSIZE[dtype] <= 16)


def space(D: int, dtype: str) -> list[Config]:
    return [c for vec in VECS for tg in TGS for ipt in IPTS
            if valid(c := {"tg": tg, "vec": vec, "ipt": ipt}, D, dtype)]


def default_config(D: int, dtype: str) -> Config:
    """Widest vectors, 128 threads, one vector per thread (fastest on an H200 for bf16 16384x8192)."""
    vec = max(v for v in VECS if D % v == 0 and v * ITEMSIZE[dtype] <= 16)
    return {"tg": 128, "vec": vec, "ipt": 1}


def check_cols(D: int) -> None:
    if D < 8:
        raise BadShape(f"last dimension {D} is too small for the elementwise kernels (need >= 8)")


def launch_for(config: Config, rows: int, D: int, dtype: str) -> Launch:
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])
    groups = max(1, ceil_div(rows * D // vec, tg * ipt))
    template = (("T", mx_dtype(dtype)), ("D", D), ("V", vec), ("TG", tg), ("IPT", ipt))
    return Launch(grid=(groups * tg, 1, 1), threadgroup=(tg, 1, 1), template=template)


def run_elementwise(src: KernelSource, backend: GpuBackend, config: Config, dtype: str,
                    row_inputs: Sequence[mx.array], other_inputs: Sequence[mx.array]) -> list[mx.array]:
    """``row_inputs`` (..., D) arrays flattened to (rows, D); one output shaped like the first."""
    x = row_inputs[0]
    D = int(x.shape[-1])
    flat = [flat_rows(a, D) for a in row_inputs]
    rows = int(flat[0].shape[0])
    launch = launch_for(config, rows, D, dtype)
    (out,) = run(src, backend, [*flat, *other_inputs], launch, [(rows, D)], [x.dtype])
    return [out.reshape(x.shape)]


def check_shape(name: str, shape: Shape) -> None:
    need_rank(name, shape, 2, "rows x D")
    check_cols(shape[-1])


def spec_fields(name: str, module_file: str, decode_cols: int) -> dict[str, Any]:
    """The :class:`KernelSpec` fields every elementwise kernel shares: ``rows x D`` shapes (decode
    rows of ``decode_cols``), this family's space and default, the shape check, and a version over
    the kernel module and this file."""
    return {
        "dtypes": DTYPES,
        "shape_doc": "rows x D",
        "shapes": {"decode": [(1, decode_cols), (32, decode_cols)], "large": [(16384, 8192), (4096, 14336)]},
        "space": lambda shape, dtype: space(shape[-1], dtype),
        "version": source_version(module_file, __file__),
        "validate_shape": lambda shape: check_shape(name, shape),
        "test_shapes": [(19, 1000)],
        "default": lambda shape, dtype: default_config(shape[-1], dtype),
    }
