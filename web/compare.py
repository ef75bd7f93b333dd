"""Compare page (``/compare``): two chips (``?a=CHIP&b=CHIP``) or two MLX versions on one chip
(``?chip=X&mlx_a=V1&mlx_b=V2``), kernel by kernel, on each series' latest successful run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import ColumnElement
from sqlalchemy.orm import Session

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Result
from kernelfleet.web.downloads import result_links
from kernelfleet.web.errors import BadParam, PageNotFound
from kernelfleet.web.figures import geomean, ratio_figure
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router
from kernelfleet.web.series import Latest, distinct_values, latest_runs, shape_key

router = page_router()

Name = Annotated[str | None, Query(max_length=128)]


@dataclass
class Pair:
    kernel: str
    shape: str
    dtype: str
    a: Latest
    b: Latest

    @property
    def ratio(self) -> float:
        return self.b.best_us / self.a.best_us


@dataclass
class KernelSummary:
    kernel: str
    ratio: float
    pairs: list[Pair]

    @property
    def b_faster(self) -> int:
        return sum(1 for p in self.pairs if p.ratio < 0.97)

    @property
    def a_faster(self) -> int:
        return sum(1 for p in self.pairs if p.ratio > 1.03)


def _side(session: Session, chips: list[str], chip: str, *where: ColumnElement[bool]) -> list[Latest]:
    if chip not in chips:
        raise PageNotFound(
            f"no results from a chip called {chip!r}",
            hint=f"Chips with results: {', '.join(chips) or 'none yet'}.",
        )
    return latest_runs(session, Result.chip == chip, *where)


def _pairs(a_runs: list[Latest], b_runs: list[Latest]) -> list[KernelSummary]:
    b_by = {(r.kernel, r.shape, r.dtype): r for r in b_runs}
    by_kernel: dict[str, list[Pair]] = {}
    for a in a_runs:
        b = b_by.get((a.kernel, a.shape, a.dtype))
        if b is not None and a.best_us > 0:
            by_kernel.setdefault(a.kernel, []).append(Pair(a.kernel, a.shape, a.dtype, a, b))
    out = []
    for kernel, pairs in sorted(by_kernel.items()):
        pairs.sort(key=lambda p: (shape_key(p.shape), p.dtype))
        out.append(KernelSummary(kernel, geomean([p.ratio for p in pairs]) or 1.0, pairs))
    return out


def _revisions(runs: list[Latest]) -> list[str]:
    """The source revisions the compared runs were measured at (those that said), most common first."""
    counts: dict[str, int] = {}
    for r in runs:
        if r.revision:
            counts[r.revision] = counts.get(r.revision, 0) + 1
    return sorted(counts, key=lambda v: (-counts[v], v))


def _downloads(mode: str, a: str | None, b: str | None, chip: str | None, mlx_a: str | None,
               mlx_b: str | None, dtype: str | None) -> dict[str, str] | None:
    if mode == "chips":
        return result_links(chip=[c for c in (a, b) if c], dtype=dtype)
    if mode == "versions":
        return result_links(chip=chip, mlx_version=[v for v in (mlx_a, mlx_b) if v], dtype=dtype)
    return None


@router.get("/compare", response_class=HTMLResponse)
def compare(
    request: Request,
    db: DbDep,
    a: Name = None,
    b: Name = None,
    chip: Name = None,
    mlx_a: Name = None,
    mlx_b: Name = None,
    dtype: Name = None,
) -> HTMLResponse:
    with db() as session:
        chips = distinct_values(session, Result.chip)
        extra = [Result.dtype == dtype] if dtype else []
        mode = "chips" if (a or b) else "versions" if (mlx_a or mlx_b) else "choose"
        if (a or b) and (chip or mlx_a or mlx_b):
            raise BadParam(
                "choose one comparison: two chips (a, b) or two MLX versions on one chip "
                "(chip, mlx_a, mlx_b), not both"
            )
        label_a = label_b = ""
        summaries: list[KernelSummary] = []
        only_a = only_b = 0
        versions = distinct_values(session, Result.mlx_version, Result.chip == chip) if chip else []
        if mode == "chips":
            if not (a and b):
                raise BadParam("comparing chips needs both a and b, e.g. /compare?a=CHIP&b=OTHER_CHIP")
            if a == b:
                raise BadParam("a and b are the same chip; pick two different chips")
            a_runs, b_runs = _side(session, chips, a, *extra), _side(session, chips, b, *extra)
            label_a, label_b = a, b
        elif mode == "versions":
            if not (chip and mlx_a and mlx_b):
                raise BadParam(
                    "comparing MLX versions needs chip, mlx_a and mlx_b, "
                    "e.g. /compare?chip=CHIP&mlx_a=0.32.3&mlx_b=0.32.4"
                )
            if mlx_a == mlx_b:
                raise BadParam("mlx_a and mlx_b are the same version; pick two different versions")
            for v in (mlx_a, mlx_b):
                if chip in chips and v not in versions:
                    raise PageNotFound(
                        f"no results on {chip} with MLX {v}",
                        hint=f"MLX versions with results on {chip}: {', '.join(versions)}.",
                    )
            a_runs = _side(session, chips, chip, Result.mlx_version == mlx_a, *extra)
            b_runs = _side(session, chips, chip, Result.mlx_version == mlx_b, *extra)
            label_a, label_b = f"MLX {mlx_a}", f"MLX {mlx_b}"
        else:
            a_runs = b_runs = []
        if mode != "choose":
            summaries = _pairs(a_runs, b_runs)
            matched = sum(len(s.pairs) for s in summaries)
            only_a, only_b = len(a_runs) - matched, len(b_runs) - matched
        figure = (
            ratio_figure([s.kernel for s in summaries], [s.ratio for s in summaries], label_a, label_b)
            if summaries
            else None
        )
        dtypes = distinct_values(session, Result.dtype)
        return page(
            request,
            "compare.html",
            title="Compare",
            mode=mode,
            chips=chips,
            a=a,
            b=b,
            chip=chip,
            mlx_a=mlx_a,
            mlx_b=mlx_b,
            dtype=dtype,
            dtypes=dtypes,
            versions=versions,
            label_a=label_a,
            label_b=label_b,
            summaries=summaries,
            figure=figure,
            only_a=only_a,
            only_b=only_b,
            downloads=_downloads(mode, a, b, chip, mlx_a, mlx_b, dtype),
            revisions_a=_revisions(a_runs), revisions_b=_revisions(b_runs),
            now=db_clock(session),
        )
