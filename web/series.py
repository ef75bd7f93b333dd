"""SQL aggregates over stored results shared by the chip, kernel, compare and regressions pages.

A series is (chip, kernel, shape, dtype); each result is one run of it. Every query here filters
on a leading prefix of ``ix_results_series`` (chip, kernel, shape, dtype, created_at) or
``ix_results_kernel_created`` (kernel, created_at), and picks rows with ``row_number()`` windows,
which SQLite (3.25+) and PostgreSQL both run; nothing loads whole tables.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, and_, func, select
from sqlalchemy.orm import Session

from kernelfleet.service.models import Result
from kernelfleet.web.figures import RunPoint

R = Result

# the columns a RunPoint is made of (see _point)
_POINT_COLS = (
    R.id,
    R.shape,
    R.dtype,
    R.created_at,
    R.measured_at,
    R.best_median_us,
    R.best_p10_us,
    R.best_p90_us,
    R.mlx_version,
    R.best_config_key,
)


def shape_key(shape: str) -> tuple[int, tuple[int, ...], str]:
    """Sort shapes by element count, then dimensions: ``32x4096`` before ``4096x4096``."""
    try:
        dims = tuple(int(d) for d in shape.lower().split("x"))
    except ValueError:
        return (1 << 62, (), shape)
    total = 1
    for d in dims:
        total *= d
    return (total, dims, shape)


@dataclass(frozen=True)
class Latest:
    """The newest successful run of one series."""

    result_id: int
    chip: str
    kernel: str
    shape: str
    dtype: str
    config_key: str | None
    is_builtin: bool
    best_us: float
    builtin_us: float | None
    mlx_version: str
    created_at: datetime
    revision: str | None = None  # the kernels' source revision, when the run said

    @property
    def speedup(self) -> float | None:
        if self.builtin_us is None or self.best_us <= 0:
            return None
        return self.builtin_us / self.best_us


def latest_runs(session: Session, *where: ColumnElement[bool]) -> list[Latest]:
    """The newest run of every series matching ``where`` (filters on chip, kernel, shape, dtype and
    mlx_version), skipping series whose newest run failed outright.

    Two steps, both on ``ix_results_series``: a ``GROUP BY`` series with ``max(created_at)`` (a
    covering-index scan when ``where`` only names series columns), then one index seek per series.
    A ``row_number()`` window did the same but sorted every matching row (300 ms for 20k runs).
    """
    newest = (
        select(R.chip, R.kernel, R.shape, R.dtype, func.max(R.created_at).label("at"))
        .where(*where)
        .group_by(R.chip, R.kernel, R.shape, R.dtype)
        .subquery()
    )
    q = (
        select(
            R.id,
            R.chip,
            R.kernel,
            R.shape,
            R.dtype,
            R.best_config_key,
            R.best_is_builtin,
            R.best_median_us,
            R.builtin_median_us,
            R.mlx_version,
            R.created_at,
            R.revision,
        )
        .join(
            newest,
            and_(
                R.chip == newest.c.chip,
                R.kernel == newest.c.kernel,
                R.shape == newest.c.shape,
                R.dtype == newest.c.dtype,
                R.created_at == newest.c.at,
            ),
        )
        .where(*where)
    )
    picked: dict[tuple[str, str, str, str], Any] = {}
    for r in session.execute(q):
        key = (r.chip, r.kernel, r.shape, r.dtype)
        if key not in picked or r.id > picked[key].id:  # two runs stored in the same instant
            picked[key] = r
    out = [
        Latest(
            result_id=r.id,
            chip=r.chip,
            kernel=r.kernel,
            shape=r.shape,
            dtype=r.dtype,
            config_key=r.best_config_key,
            is_builtin=bool(r.best_is_builtin),
            best_us=float(r.best_median_us),
            builtin_us=r.builtin_median_us,
            mlx_version=r.mlx_version,
            created_at=r.created_at,
            revision=r.revision,
        )
        for r in picked.values()
        if r.best_median_us is not None
    ]
    out.sort(key=lambda x: (x.kernel, shape_key(x.shape), x.dtype, x.chip))
    return out


def run_points(
    session: Session, chip: str, kernel: str, max_runs: int, *where: ColumnElement[bool]
) -> dict[str, list[RunPoint]]:
    """Per shape, the newest ``max_runs`` successful runs of each dtype, oldest first."""
    rn = (
        func.row_number()
        .over(partition_by=(R.shape, R.dtype), order_by=(R.created_at.desc(), R.id.desc()))
        .label("rn")
    )
    sub = (
        select(*_POINT_COLS, rn)
        .where(R.chip == chip, R.kernel == kernel, R.best_median_us.is_not(None), *where)
        .subquery()
    )
    q = select(sub).where(sub.c.rn <= max_runs).order_by(sub.c.created_at, sub.c.id)
    out: dict[str, list[RunPoint]] = {}
    for r in session.execute(q):
        out.setdefault(r.shape, []).append(_point(r))
    return dict(sorted(out.items(), key=lambda kv: shape_key(kv[0])))


def _point(r: Any) -> RunPoint:
    return RunPoint(
        result_id=r.id,
        created_at=r.created_at,
        dtype=r.dtype,
        best_us=float(r.best_median_us),
        p10_us=r.best_p10_us,
        p90_us=r.best_p90_us,
        mlx_version=r.mlx_version,
        config_key=r.best_config_key,
        measured_at=r.measured_at,
    )


def window_points(
    session: Session,
    chip: str,
    kernel: str,
    shape: str,
    dtype: str,
    around: datetime,
    before: int,
    after: int,
) -> list[RunPoint]:
    """The runs of one series around a moment: ``before`` up to it and ``after`` following it."""
    cols = _POINT_COLS
    base = (
        R.chip == chip,
        R.kernel == kernel,
        R.shape == shape,
        R.dtype == dtype,
        R.best_median_us.is_not(None),
    )
    older = session.execute(
        select(*cols)
        .where(*base, R.created_at <= around)
        .order_by(R.created_at.desc(), R.id.desc())
        .limit(before)
    ).all()
    newer = session.execute(
        select(*cols).where(*base, R.created_at > around).order_by(R.created_at, R.id).limit(after)
    ).all()
    return [_point(r) for r in reversed(older)] + [_point(r) for r in newer]


def kernels_on(session: Session, chip: str) -> list[tuple[str, int]]:
    """The kernels with results on ``chip`` and how many runs each has."""
    q = select(R.kernel, func.count()).where(R.chip == chip).group_by(R.kernel).order_by(R.kernel)
    return [(k, int(n)) for k, n in session.execute(q)]


def distinct_values(session: Session, column: Any, *where: ColumnElement[bool]) -> list[str]:
    q = select(column).where(*where).group_by(column).order_by(column)
    return [str(v) for v in session.scalars(q) if v is not None]


def sorted_shapes(shapes: Sequence[str]) -> list[str]:
    return sorted(set(shapes), key=shape_key)
