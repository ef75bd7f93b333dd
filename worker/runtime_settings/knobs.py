"""The runtime knobs of the installed MLX that change speed and no arithmetic, per backend, with
MLX's own default and the grid the search tries.

What MLX reads, from its source (github.com/ml-explore/mlx, tags v0.28.0 to v0.32.1 and main at
846d176, 2026-08-22; every knob below is read once, into a function-local ``static``, at its first
use in the process, so a setting only takes effect in a process that starts with it):

- ``MLX_MAX_OPS_PER_BUFFER`` / ``MLX_MAX_MB_PER_BUFFER`` (``mlx/utils.h``: ``env::max_ops_per_buffer``,
  ``env::max_mb_per_buffer``). Metal: ops and MB per command buffer, set in the ``Device``
  constructor (``mlx/backend/metal/device.cpp``) by the GPU's size-class letter: ``p`` (phone)
  20/40, ``g`` (base, Pro) 40/40, ``s`` (Max) 50/50, ``d`` (Ultra) 50/50, else 40/40. CUDA: ops and
  MB per CUDA graph (``get_graph_limits`` in ``mlx/backend/cuda/device.cpp``, read when a
  ``CommandEncoder`` is made) by compute capability: 8.0 (A100) 20/400; 9.0 (H100), 10.0 (B200),
  12.0 100/1000 from v0.31.0 (30/400 for 9.0 and 50/500 for 10.0 in v0.30.x); 12.1 (DGX Spark)
  20/25; else 20/100. CUDA reads the MB limit from v0.30.0 on (v0.29 only the ops limit, default
  20). Where the graph or buffer is cut changes when work is submitted, not what any kernel computes.
- ``MLX_BFS_MAX_WIDTH`` (``mlx/utils.h``, used in ``mlx/transforms.cpp``'s ``eval_impl``): the width
  of the breadth-first order in which ``eval`` schedules a graph, default 20, every backend (the
  only one MLX's CPU backend reads). The order of independent ops changes, not their arithmetic.
- ``MLX_USE_CUDA_GRAPHS`` (``mlx/backend/cuda/device.cpp``, v0.29.0 on, default 1): 0 launches each
  kernel on the stream instead of capturing graphs. Same kernels, same arithmetic.
- ``MLX_METAL_FAST_SYNCH`` (``mlx/utils.h``, default 0): Metal's fast CPU-GPU synchronisation.

Read by MLX but left out, since they change arithmetic (the bit-identity check would reject them):
``MLX_SDPA_BLOCKS`` (Metal, v0.32.0 on: the 2-pass SDPA's block count, i.e. how the softmax sum is
split into partial sums), ``MLX_ENABLE_TF32`` (CUDA matmul precision), ``MLX_CUDA_USE_CUDNN_SDPA``
(another attention kernel). Left out as not about speed: the cache sizes (``MLX_CUDA_*_CACHE_SIZE``),
debugging and distributed settings. The matvec/matmul batch limits and GEMM tiles are not
overridable in any version.

``KERNELFLEET_TEST_ONLY_DTYPE`` is no MLX knob: the step (:mod:`.step`) casts the model to that
dtype, changing arithmetic on purpose, so tests can show the bit-identity check rejecting such a
candidate. No backend's table offers it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

Setting = dict[str, str]  # environment variable -> value


@dataclass(frozen=True)
class Knob:
    """One setting the search varies: one environment variable, or several varied together
    (``envs``; e.g. ops and MB per buffer, scaled as a pair). ``grid``: the coarse values (tuples,
    one value per variable), not MLX's default; ``refine``: whether values between grid points
    mean anything (numbers only), so the search may try geometric midpoints around the best."""

    name: str
    envs: tuple[str, ...]
    grid: tuple[tuple[int | str, ...], ...]
    since: tuple[int, int, int] = (0, 0, 0)
    refine: bool = True

    def setting(self, values: tuple[int | str, ...]) -> Setting:
        return {env: str(v) for env, v in zip(self.envs, values, strict=True)}


BUFFER = ("MLX_MAX_OPS_PER_BUFFER", "MLX_MAX_MB_PER_BUFFER")
BFS = Knob("eval BFS width", ("MLX_BFS_MAX_WIDTH",), ((5,), (80,)))
TEST_ONLY_DTYPE = "KERNELFLEET_TEST_ONLY_DTYPE"

# coarse grids: about a factor 4 each way of the defaults MLX ships (the refine stage fills in between)
TABLE: dict[str, tuple[Knob, ...]] = {
    "cuda": (
        Knob("ops/MB per CUDA graph", BUFFER, ((25, 250), (50, 500), (200, 2000), (400, 4000)),
             since=(0, 30, 0)),
        Knob("CUDA graphs", ("MLX_USE_CUDA_GRAPHS",), ((0,),), since=(0, 29, 0), refine=False),
        BFS,
    ),
    "metal": (
        Knob("ops/MB per command buffer", BUFFER, ((10, 10), (20, 20), (100, 100), (200, 200))),
        Knob("Metal fast synch", ("MLX_METAL_FAST_SYNCH",), ((1,),), refine=False),
        BFS,
    ),
    "cpu": (BFS,),
}


def version_tuple(version: str) -> tuple[int, int, int]:
    parts = [int(p) for p in re.findall(r"\d+", version)[:3]]
    return (parts + [0, 0, 0])[0], (parts + [0, 0, 0])[1], (parts + [0, 0, 0])[2]


def knobs(backend: str, mlx_version: str) -> tuple[Knob, ...]:
    """The knobs this backend's MLX of this version reads."""
    if backend not in TABLE:
        raise ValueError(f"no runtime knobs known for backend {backend!r} (known: {', '.join(TABLE)})")
    v = version_tuple(mlx_version)
    return tuple(k for k in TABLE[backend] if v >= k.since)


def defaults(backend: str, arch: str | None, mlx_version: str) -> Setting:
    """MLX's own values where its source says them (see the module docstring); a knob whose default
    depends on what this function cannot tell is left out."""
    out: Setting = {"MLX_BFS_MAX_WIDTH": "20"}
    v = version_tuple(mlx_version)
    if backend == "metal":
        out["MLX_METAL_FAST_SYNCH"] = "0"
        size = {"p": (20, 40), "g": (40, 40), "s": (50, 50), "d": (50, 50)}.get((arch or "")[-1:], (40, 40))
        out.update(dict(zip(BUFFER, map(str, size), strict=True)))
    elif backend == "cuda":
        out["MLX_USE_CUDA_GRAPHS"] = "1"
        cc = int(arch[3:]) * 10 if arch and re.fullmatch(r"sm_\d+", arch) else None
        big = (100, 1000) if v >= (0, 31, 0) else {900: (30, 400), 1000: (50, 500)}.get(cc or 0, (20, 100))
        table = {800: (20, 400), 900: big, 1000: big, 1200: (100, 1000) if v >= (0, 31, 0) else (20, 100),
                 1210: (20, 25)}
        if cc is not None:
            out.update(dict(zip(BUFFER, map(str, table.get(cc, (20, 100))), strict=True)))
    return out


def midpoints(knob: Knob, best: tuple[int | str, ...], default: tuple[int, ...] | None
              ) -> list[tuple[int | str, ...]]:
    """Values between ``best`` and its neighbours on the knob's line (the grid and MLX's default,
    ordered by the first variable): geometric midpoints, rounded, not already on the line."""
    if not knob.refine:
        return []
    line = sorted({tuple(int(v) for v in values) for values in (*knob.grid, *([default] if default else []))})
    i = line.index(tuple(int(v) for v in best))
    out: list[tuple[int | str, ...]] = []
    for j in (i - 1, i + 1):
        if 0 <= j < len(line):
            mid = tuple(max(1, round(math.sqrt(a * b))) for a, b in zip(line[i], line[j], strict=True))
            if mid not in line and mid not in out:
                out.append(mid)
    return out
