"""The row-kernel family (norms, softmax, logsumexp): shared parameter space and geometry.

A row of ``D`` elements is handled by ``TPR = tg / rpg`` threads (a whole number of warps);
a group of ``tg`` threads handles ``rpg`` consecutive rows. Each thread loads ``V`` consecutive
elements per step (``vec``) and keeps its ``NITER * V`` values of the row in registers, so the
row is read from memory once. Reductions: warp shuffles, then one shared-memory exchange between
the warps of a row (none when a row is one warp).

Parameters (the axes of the space): ``tg`` 32..1024, ``vec`` 1/2/4/8 (at most 16 bytes per
load), ``rpg`` 1/2/4/8; constraints: ``D % vec == 0``, ``TPR >= 32``, every thread owns at least
one vector (``TPR <= D / vec``), and at most ``MAX_REGS`` cached values per thread.
With 16-byte vectors and at most 512 threads: up to ``MAX_REGS_WIDE`` cached values (fewer threads
per row, more rows in flight). With 16-byte vectors, the ``hint`` axis: the cache policy of the row's
loads and stores (``kf_vload_h``: 0 default, left out of the config; 1 streaming; 2 read-only loads +
streaming stores).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import mlx.core as mx

from ..common import DTYPES, ITEMSIZE, ceil_div, flat_rows, mx_dtype, need_rank
from ..render.dialect import source_version
from ..render.launch import KernelSource, Launch, run
from ..spec import BadShape, Config, GpuBackend, Shape

TGS = (32, 64, 128, 256, 512, 1024)
VECS = (1, 2, 4, 8)
RPGS = (1, 2, 4, 8)
MAX_REGS = 32
MAX_REGS_WIDE = 64
HINTS = (0, 1, 2)
REDS = (0, 1)  # the "red" axis of kernels with two row statistics (layernorm): see layernorm_kernel

# Dialect snippet shared by the row kernels: which row this thread works on, and the row of
# input `x` loaded into registers `xv` as float (zeros past the end or for a missing row).
LOAD_ROW = r"""
  const unsigned t = KF_TID % TPR;
  const KF_SIZE row = KF_SIZE(KF_GROUP) * RPG + KF_TID / TPR;
  const bool valid = row < KF_SIZE(x_shape[0]);
  float xv[NITER * V];
#pragma unroll
  for (int it = 0; it < NITER; ++it) {
    const unsigned j = it * TPR + t;
    if (valid && j < D / V) {
      kf_vec<T, V> a = kf_vload_h<V, H>(x + row * D, j);
#pragma unroll
      for (int k = 0; k < V; ++k) {
        xv[it * V + k] = float(a.v[k]);
      }
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        xv[it * V + k] = 0.0f;
      }
    }
  }
"""


# Dialect snippet: the row's maximum ``m`` of the loaded ``xv`` (softmax, logsumexp), with the two
# shared-memory scratch arrays the row reductions use (``red_a`` for the max, ``red_b`` for a sum).
ROW_MAX = r"""
  KF_SHARED float red_a[32];
  KF_SHARED float red_b[32];
  float m = -KF_INF;
#pragma unroll
  for (int it = 0; it < NITER; ++it) {
    if (it * TPR + t < D / V) {
#pragma unroll
      for (int k = 0; k < V; ++k) {
        m = KF_FMAX(m, xv[it * V + k]);
      }
    }
  }
  m = kf_row_max(m, red_a, KF_LANE, KF_WARP, TPR / 32);"""


def rms_scale_store(values: str) -> str:
    """Dialect snippet ending the RMS norms: reduce the partial sum of squares ``ss`` over the row
    (scratch ``red``), then store ``values[i] * rsqrt(mean + EPS) * w`` to ``out``."""
    return r"""  ss = kf_row_sum(ss, red, KF_LANE, KF_WARP, TPR / 32);
  const float inv = KF_RSQRT(ss / float(D) + ${EPS});
  if (valid) {
#pragma unroll
    for (int it = 0; it < NITER; ++it) {
      const unsigned j = it * TPR + t;
      if (j < D / V) {
        kf_vec<T, V> wv = kf_vload<V>(w, j);
        kf_vec<T, V> o;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          o.v[k] = T(""" + values + r"""[it * V + k] * inv * float(wv.v[k]));
        }
        kf_vstore_h<V, H>(out + row * D, j, o);
      }
    }
  }
"""


def _niter(D: int, tpr: int, vec: int) -> int:
    return ceil_div(D // vec, tpr)


def valid(config: Config, D: int, dtype: str, axes: Sequence[str] = ()) -> bool:
    """Is ``config`` in the space (``axes``: the optional axes the kernel has, e.g. ``("red",)``)?"""
    try:
        tg, vec, rpg = int(config["tg"]), int(config["vec"]), int(config["rpg"])
        hint, red = int(config.get("hint", 0)), int(config.get("red", 0))
    except (KeyError, TypeError, ValueError):
        return False
    if tg not in TGS or vec not in VECS or rpg not in RPGS:
        return False
    if not set(config) <= {"tg", "vec", "rpg", "hint", *axes}:
        return False
    if "red" in config and red not in REDS[1:]:
        return False  # its default (0) is left out
    if D % vec or vec * ITEMSIZE[dtype] > 16 or tg % rpg:
        return False
    wide = vec * ITEMSIZE[dtype] == 16
    if "hint" in config and (not wide or hint not in HINTS[1:]):
        return False  # the hint axis is for 16-byte accesses; its default (0) is left out
    tpr = tg // rpg
    if tpr < 32 or tpr % 32 or tpr > D // vec:
        return False
    # 64 cached values need more than the 64 registers a thread of a 1024-thread group can have: an
    # H100 refused those launches ("too many resources requested": h100_frontier_tuning.jsonl)
    return _niter(D, tpr, vec) * vec <= (MAX_REGS_WIDE if wide and tg <= 512 else MAX_REGS)


def space(D: int, dtype: str, axes: Sequence[str] = ()) -> list[Config]:
    out = []
    for vec in VECS:
        for tg in TGS:
            for rpg in RPGS:
                for hint in HINTS:
                    for red in REDS if "red" in axes else (0,):
                        c: Config = ({"tg": tg, "vec": vec, "rpg": rpg} | ({"hint": hint} if hint else {})
                                     | ({"red": red} if red else {}))
                        if valid(c, D, dtype, axes):
                            out.append(c)
    return out


def default_config(D: int, dtype: str) -> Config:
    """Widest vector loads; about 4 vectors per thread; small rows share a group (>= 128 threads)."""
    configs = space(D, dtype)
    if not configs:
        raise BadShape(f"no row-kernel configuration fits a row of {D} elements")

    def score(c: Config) -> tuple[int, int, int]:
        tpr = c["tg"] // c["rpg"]
        niter = _niter(D, tpr, c["vec"])
        return (-c["vec"] * ITEMSIZE[dtype], abs(niter - 4) + (c["tg"] < 128) * 8, c["tg"])

    return min((c for c in configs if "hint" not in c), key=score)


def prior(config: Config, D: int, dtype: str) -> float:
    """Cost model for the "model" search (lower = expected faster): 256-512 threads, one row per
    group at long rows; 16-byte or scalar loads; the default of the hint and red axes. Set from the
    exhaustive tunes of the row kernels
    at 16384x8192 and 4096x4096 (bf16, H100 and H200: benchmarks/results/*tuning.jsonl), whose
    best configs were tg 256 or 512, rpg 1 (2 at 4096), vec 8 or 1."""
    tg, vec, rpg = int(config["tg"]), int(config["vec"]), int(config["rpg"])
    width = vec * ITEMSIZE[dtype]
    cost = abs(math.log2(tg / 362))  # 256 and 512 alike
    cost += 0.5 * math.log2(rpg) * (1.0 if D >= 4096 else 0.25)
    cost += 0.0 if width == 16 else (0.2 if vec == 1 else 0.6)
    # red=1 (layernorm's one-reduction statistics) measured 5-22% slower than red=0 on an H100 at
    # 16384x8192 and 4096x4096 (benchmarks/results/h100_frontier_tuning.jsonl): ranked last
    cost += 0.3 * bool(config.get("hint", 0)) + 1.0 * int(config.get("red", 0))
    return cost


@lru_cache(maxsize=1024)
def _fits(D: int, dtype: str) -> bool:
    return bool(space(D, dtype))


def check_row(D: int, dtype: str) -> None:
    """Raise :class:`BadShape` unless some configuration fits a row of ``D`` (cached: the check
    enumerates the space, ~0.5 ms, and :func:`kernelfleet.patch` checks each call shape once)."""
    if not _fits(D, dtype):
        raise BadShape(f"row length {D} is too long or too short for the row kernels (32 <= D <= 32768)")


def row_launch(config: Config, rows: int, D: int, dtype: str) -> Launch:
    tg, vec, rpg = int(config["tg"]), int(config["vec"]), int(config["rpg"])
    tpr = tg // rpg
    groups = max(1, ceil_div(rows, rpg))
    template = (
        ("T", mx_dtype(dtype)),
        ("D", D),
        ("V", vec),
        ("TPR", tpr),
        ("RPG", rpg),
        ("NITER", _niter(D, tpr, vec)),
        ("H", int(config.get("hint", 0))),
        ("RED", int(config.get("red", 0))),
    )
    return Launch(grid=(groups * tg, 1, 1), threadgroup=(tg, 1, 1), template=template)


def run_rows(
    src: KernelSource,
    backend: GpuBackend,
    config: Config,
    dtype: str,
    row_inputs: Sequence[mx.array],
    other_inputs: Sequence[mx.array],
    out_kinds: Sequence[str],
) -> list[mx.array]:
    """Launch a row kernel: ``row_inputs`` are (..., D) arrays flattened to (rows, D) (the first is
    ``x``); ``out_kinds`` per output: ``"row"`` (same shape as x) or ``"scalar"`` (one per row)."""
    x = row_inputs[0]
    D = int(x.shape[-1])
    lead = tuple(x.shape[:-1])
    flat = [flat_rows(a, D) for a in row_inputs]
    rows = int(flat[0].shape[0])
    launch = row_launch(config, rows, D, dtype)
    shapes = [(rows, D) if k == "row" else (rows,) for k in out_kinds]
    outs = run(src, backend, [*flat, *other_inputs], launch, shapes, [x.dtype] * len(out_kinds))
    return [o.reshape(*lead, D) if k == "row" else o.reshape(lead)
            for o, k in zip(outs, out_kinds, strict=True)]


ROW_SHAPES = {"decode": [(1, 4096), (32, 4096)], "large": [(16384, 8192), (4096, 4096)]}


def check_shape(name: str, shape: Shape) -> None:
    need_rank(name, shape, 2, "rows x D")
    check_row(shape[-1], "float32")


def spec_fields(name: str, module_file: str, axes: Sequence[str] = ()) -> dict[str, Any]:
    """The :class:`KernelSpec` fields every row kernel shares: ``rows x D`` shapes, this family's
    space and default, the shape check, and a version over the kernel module and this file."""
    return {
        "dtypes": DTYPES,
        "shape_doc": "rows x D",
        "shapes": ROW_SHAPES,
        "space": lambda shape, dtype: space(shape[-1], dtype, axes),
        "version": source_version(module_file, __file__),
        "validate_shape": lambda shape: check_shape(name, shape),
        "test_shapes": [(19, 1024)],
        "default": lambda shape, dtype: default_config(shape[-1], dtype),
        "prior": lambda shape, dtype, config: prior(config, shape[-1], dtype),
    }
