"""Kernel page (``/kernels/{kernel}``): the chips side by side, tuned time and speedup over the
built-in per shape, a heatmap of the best config across shapes and chips, and golden-output drift
between chips beyond the dtype's tolerance."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet.chips import backend_of
from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Result
from kernelfleet.web.downloads import result_links
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.figures import config_heatmap, speedup_figure
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router
from kernelfleet.web.series import Latest, distinct_values, latest_runs, shape_key, sorted_shapes
from kernelfleet.web.tolerance import Drift, compare_golden, tolerance

router = page_router()

Name = Annotated[str | None, Query(max_length=128)]
PREFERRED_DTYPES = ("float16", "bfloat16", "float32")


@dataclass
class DriftRow:
    shape: str
    dtype: str
    chip_a: str
    chip_b: str
    drift: Drift
    atol: float
    rtol: float
    source: str


def _drift(session: Session, kernel: str, latest: list[Latest]) -> list[DriftRow]:
    ids = [r.result_id for r in latest]
    goldens: dict[int, dict[str, Any]] = {}
    for start in range(0, len(ids), 500):
        q = select(Result.id, Result.golden).where(Result.id.in_(ids[start : start + 500]))
        goldens.update({rid: golden for rid, golden in session.execute(q)})
    groups: dict[tuple[str, str], list[Latest]] = {}
    for r in latest:
        groups.setdefault((r.shape, r.dtype), []).append(r)
    rows = []
    for (shape, dtype), runs in sorted(groups.items(), key=lambda kv: (shape_key(kv[0][0]), kv[0][1])):
        bound = tolerance(kernel, dtype)
        for a, b in combinations(sorted(runs, key=lambda r: r.chip), 2):
            drift = compare_golden(goldens.get(a.result_id) or {}, goldens.get(b.result_id) or {}, bound)
            rows.append(DriftRow(shape, dtype, a.chip, b.chip, drift, bound.atol, bound.rtol, bound.source))
    return rows


def default_dtype(latest: list[Latest], dtypes: list[str]) -> str:
    """The dtype the charts show unless one is asked for: the one measured on the most GPU chips
    (a dtype only the CPU has is a poor first view), then on the most chips, then float16, bfloat16,
    float32."""

    def score(d: str) -> tuple[int, int, int]:
        chips = {r.chip for r in latest if r.dtype == d}
        gpu = sum(1 for c in chips if backend_of(c) in ("metal", "cuda"))
        rank = PREFERRED_DTYPES.index(d) if d in PREFERRED_DTYPES else len(PREFERRED_DTYPES)
        return gpu, len(chips), -rank

    return max(dtypes, key=score)


@router.get("/kernels/{kernel}", response_class=HTMLResponse)
def kernel_page(
    request: Request, db: DbDep, kernel: str, dtype: Name = None, mlx: Name = None
) -> HTMLResponse:
    with db() as session:
        dtypes = distinct_values(session, Result.dtype, Result.kernel == kernel)
        if not dtypes:
            raise PageNotFound(
                f"no results for a kernel called {kernel!r}",
                hint="The kernels page lists every kernel with results.",
            )
        if dtype is not None and dtype not in dtypes:
            raise PageNotFound(
                f"no {dtype} results for {kernel}", hint=f"Dtypes with results: {', '.join(dtypes)}."
            )
        where = [Result.kernel == kernel]
        if mlx:
            where.append(Result.mlx_version == mlx)
        latest = latest_runs(session, *where)
        chosen = dtype or default_dtype(latest, dtypes)
        chips = sorted({r.chip for r in latest})
        shapes = sorted_shapes([r.shape for r in latest])
        cells = {(r.chip, r.shape, r.dtype): r for r in latest}
        table = [(s, d) for s in shapes for d in dtypes if any((c, s, d) in cells for c in chips)]
        if dtype:
            table = [(s, d) for s, d in table if d == dtype]
        chosen_runs = [r for r in latest if r.dtype == chosen]
        chosen_shapes = sorted_shapes([r.shape for r in chosen_runs])
        chosen_chips = sorted({r.chip for r in chosen_runs})
        speed = (
            speedup_figure(chosen_shapes, chosen_chips, {(r.chip, r.shape): r.speedup for r in chosen_runs})
            if chosen_runs
            else None
        )
        heat = (
            config_heatmap(
                chosen_shapes, chosen_chips, {(r.chip, r.shape): r.config_key or "—" for r in chosen_runs}
            )
            if chosen_runs
            else None
        )
        drift = _drift(session, kernel, [r for r in latest if dtype is None or r.dtype == dtype])
        drift.sort(key=lambda d: not d.drift.beyond)  # drifting pairs first, the rest in order
        versions = distinct_values(session, Result.mlx_version, Result.kernel == kernel)
        return page(
            request,
            "kernel.html",
            title=kernel,
            kernel=kernel,
            chips=chips,
            table=table,
            cells=cells,
            dtypes=dtypes,
            dtype=dtype,
            chosen=chosen,
            mlx=mlx,
            versions=versions,
            speed_fig=speed,
            heat=heat,
            drift=drift,
            drift_count=sum(1 for d in drift if d.drift.beyond),
            downloads=result_links(kernel=kernel, dtype=dtype, mlx_version=mlx),
            now=db_clock(session),
        )
