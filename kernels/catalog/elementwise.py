"""The elementwise family (swiglu, geglu, bias+gelu): shared parameter space and geometry.

Inputs are ``rows x D``; a group of ``tg`` threads handles ``tg * ipt`` consecutive vectors of
``vec`` elements (step ``k`` of thread ``t`` takes vector ``group * tg * ipt + k * tg + t``, so
each step is one coalesced sweep). Axes: ``tg`` 64..1024, ``vec`` 1/2/4/8 (at most 16 bytes),
``ipt`` 1/2/4 vectors per thread; constraint ``D % vec == 0`` (a vector never crosses a row).

Frontier axes, for kernels that opt in (``axes``), only with 16-byte vectors (the widest access):
``ipt`` 8 as well (more bytes in flight per thread), ``hint`` the cache policy of the loads and stores
(0 default, 1 streaming, 2 read-only loads + streaming stores: ``kf_vload_h``), ``fm`` 1 the fast-math
spelling of the kernel's activation. An axis at its default (``hint`` 0, ``fm`` 0) is left out of the
config, so the keys of the original space stay what they were.

Dialect snippet :data:`INDEX` defines ``base`` (first vector of this thread) and the loop bound
``nvec`` from the first input's row count (``a_shape[0]``; inputs are named ``a``, ...).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import mlx.core as mx

from ..common import DTYPES, ITEMSIZE, ceil_div, flat_rows, mx_dtype, need_rank
from ..render.dialect import source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, Shape

TGS = (64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)
IPTS = (1, 2, 4)
WIDE_IPTS = (1, 2, 4, 8)
AXES: dict[str, tuple[int, ...]] = {"hint": (0, 1, 2), "fm": (0, 1)}  # optional axes; first = default

INDEX = r"""
  const KF_SIZE nvec = KF_SIZE(a_shape[0]) * (D / V);
  const KF_SIZE base = KF_SIZE(KF_GROUP) * (TG * IPT) + KF_TID;
"""


def valid(config: Config, D: int, dtype: str, axes: Sequence[str] = ()) -> bool:
    """Is ``config`` in the space of a kernel with the optional ``axes`` (a subset of :data:`AXES`)?"""
    try:
        tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])
        extra = {k: int(v) for k, v in config.items() if k not in ("tg", "vec", "ipt")}
    except (KeyError, TypeError, ValueError):
        return False
    if not (tg in TGS and vec in VECS and D % vec == 0 and vec * ITEMSIZE[dtype] <= 16):
        return False
    if any(k not in axes or v not in AXES[k][1:] for k, v in extra.items()):
        return False  # unknown axis, or a default value spelled out (defaults are left out)
    wide = bool(axes) and vec * ITEMSIZE[dtype] == 16
    if (extra or ipt not in IPTS) and not wide:
        return False
    return ipt in (WIDE_IPTS if wide else IPTS)


def space(D: int, dtype: str, axes: Sequence[str] = ()) -> list[Config]:
    out: list[Config] = []
    for vec in VECS:
        for tg in TGS:
            for ipt in WIDE_IPTS:
                for values in itertools.product(*(AXES[a] for a in axes)):
                    c: Config = {"tg": tg, "vec": vec, "ipt": ipt}
                    c.update({a: v for a, v in zip(axes, values, strict=True) if v != AXES[a][0]})
                    if valid(c, D, dtype, axes):
                        out.append(c)
    return out


def prior(config: Config, D: int, dtype: str) -> float:
    """Cost model for the "model" search (lower = expected faster): 16-byte accesses; about 128
    threads and one or two vectors per thread; the fast-math activation. Set from the exhaustive
    tunes of bf16 16384x8192 / 4096x14336 on an H100 and an H200 (benchmarks/results/*tuning.jsonl),
    where every config within 3% of the best had 16-byte vectors (or 8-byte), 64-256 threads and
    1-2 vectors per thread, and many configs lay within 1-2% of each other."""
    width = int(config["vec"]) * ITEMSIZE[dtype]
    cost = {16: 0.0, 8: 1.0}.get(width, 3.0)
    cost += 0.5 * abs(math.log2(int(config["tg"]) / 128)) + 0.5 * math.log2(int(config["ipt"]))
    cost -= 0.6 * int(config.get("fm", 0))
    cost += 0.3 * bool(config.get("hint", 0))
    return cost


def axis_template(config: Config, axes: Sequence[str]) -> tuple[tuple[str, int], ...]:
    """The template values of the optional ``axes`` (``hint`` -> ``H``, ``fm`` -> ``FM``)."""
    names = {"hint": "H", "fm": "FM"}
    return tuple((names[a], int(config.get(a, AXES[a][0]))) for a in axes)


def default_config(D: int, dtype: str) -> Config:
    """Widest vectors, 128 threads, one vector per thread (fastest on an H200 for bf16 16384x8192)."""
    vec = max(v for v in VECS if D % v == 0 and v * ITEMSIZE[dtype] <= 16)
    return {"tg": 128, "vec": vec, "ipt": 1}


def check_cols(D: int) -> None:
    if D < 8:
        raise BadShape(f"last dimension {D} is too small for the elementwise kernels (need >= 8)")


def launch_for(config: Config, rows: int, D: int, dtype: str, axes: Sequence[str] = ()) -> Launch:
    tg, vec, ipt = int(config["tg"]), int(config["vec"]), int(config["ipt"])
    groups = max(1, ceil_div(rows * D // vec, tg * ipt))
    template = (("T", mx_dtype(dtype)), ("D", D), ("V", vec), ("TG", tg), ("IPT", ipt),
                *axis_template(config, axes))
    return Launch(grid=(groups * tg, 1, 1), threadgroup=(tg, 1, 1), template=template)


def run_elementwise(src: KernelSource, backend: GpuBackend, config: Config, dtype: str,
                    row_inputs: Sequence[mx.array], other_inputs: Sequence[mx.array],
                    axes: Sequence[str] = ()) -> list[mx.array]:
    """``row_inputs`` (..., D) arrays flattened to (rows, D); one output shaped like the first."""
    x = row_inputs[0]
    D = int(x.shape[-1])
    flat = [flat_rows(a, D) for a in row_inputs]
    rows = int(flat[0].shape[0])
    launch = launch_for(config, rows, D, dtype, axes)
    (out,) = run(src, backend, [*flat, *other_inputs], launch, [(rows, D)], [x.dtype])
    return [out.reshape(x.shape)]


def check_shape(name: str, shape: Shape) -> None:
    need_rank(name, shape, 2, "rows x D")
    check_cols(shape[-1])


def spec_fields(name: str, module_file: str, decode_cols: int, axes: Sequence[str] = ()) -> dict[str, Any]:
    """The :class:`KernelSpec` fields every elementwise kernel shares: ``rows x D`` shapes (decode
    rows of ``decode_cols``), this family's space and default, the shape check, and a version over
    the kernel module and this file."""
    return {
        "dtypes": DTYPES,
        "shape_doc": "rows x D",
        "shapes": {"decode": [(1, decode_cols), (32, decode_cols)], "large": [(16384, 8192), (4096, 14336)]},
        "space": lambda shape, dtype: space(shape[-1], dtype, axes),
        "version": source_version(module_file, __file__),
        "validate_shape": lambda shape: check_shape(name, shape),
        "test_shapes": [(19, 1000)],
        "default": lambda shape, dtype: default_config(shape[-1], dtype),
        "prior": lambda shape, dtype, config: prior(config, shape[-1], dtype),
    }
