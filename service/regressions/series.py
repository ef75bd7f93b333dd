"""Loading a series' runs from the database: one :class:`RunPoint` per result, the time and raw
samples of the variant that run chose, and its environment as attributes."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import ColumnElement, and_, select
from sqlalchemy.orm import Session

from kernelfleet.service.models import Regression, RegressionStatus, Result, Trial
from kernelfleet.service.regressions.base import RunPoint


@dataclass(frozen=True)
class SeriesKey:
    chip: str
    kernel: str
    shape: str
    dtype: str

    @classmethod
    def of(cls, row: Result | Regression) -> SeriesKey:
        return cls(chip=row.chip, kernel=row.kernel, shape=row.shape, dtype=row.dtype)

    def as_tuple(self) -> tuple[str, str, str, str]:
        return (self.chip, self.kernel, self.shape, self.dtype)


def _series_filter(key: SeriesKey) -> ColumnElement[bool]:
    return and_(
        Result.chip == key.chip,
        Result.kernel == key.kernel,
        Result.shape == key.shape,
        Result.dtype == key.dtype,
        Result.best_config_key.is_not(None),
        Result.best_median_us > 0,
    )


def load_runs(
    session: Session,
    key: SeriesKey,
    *,
    before_id: int | None = None,
    after_id: int | None = None,
    limit: int = 200,
) -> list[RunPoint]:
    """The latest ``limit`` runs of the series (oldest first), optionally only those with
    ``after_id <= id < before_id``."""
    query = (
        select(Result, Trial.samples_us, Trial.p10_us, Trial.p90_us, Trial.n)
        .outerjoin(Trial, and_(Trial.result_id == Result.id, Trial.config_key == Result.best_config_key))
        .where(_series_filter(key))
    )
    if before_id is not None:
        query = query.where(Result.id < before_id)
    if after_id is not None:
        query = query.where(Result.id >= after_id)
    rows = session.execute(query.order_by(Result.id.desc()).limit(limit)).all()
    runs: dict[int, RunPoint] = {}
    for result, samples, p10, p90, n in reversed(rows):
        runs.setdefault(result.id, to_run(result, samples, p10, p90, n))  # one trial per config key
    return list(runs.values())


def to_run(
    result: Result, samples: list[float] | None, p10: float | None, p90: float | None, n: int | None
) -> RunPoint:
    assert result.best_median_us is not None
    return RunPoint(
        median_us=float(result.best_median_us),
        samples_us=tuple(float(v) for v in samples) if samples else None,
        p10_us=p10 if p10 is not None else result.best_p10_us,
        p90_us=p90 if p90 is not None else result.best_p90_us,
        n=int(n or 0),
        attrs={
            "mlx_version": result.mlx_version,
            "revision": result.revision,
            "os": result.os,
            "driver": result.driver,
            "kernel_hash": result.kernel_hash,
            "config_key": result.best_config_key,
            "worker": f"worker {result.worker_id}" if result.worker_id is not None else None,
        },
        result_id=result.id,
    )


def reset_point(session: Session, key: SeriesKey, before_id: int) -> int | None:
    """The result id from which the series' baseline starts: the latest confirmed regression's run
    (the slower level is the new normal once a regression is open, acknowledged, ignored or fixed;
    one marked invalid was noise and moves nothing)."""
    return session.scalars(
        select(Regression.result_id)
        .where(
            Regression.chip == key.chip,
            Regression.kernel == key.kernel,
            Regression.shape == key.shape,
            Regression.dtype == key.dtype,
            Regression.result_id < before_id,
            Regression.status.in_([RegressionStatus.open, RegressionStatus.acknowledged,
                                   RegressionStatus.ignored, RegressionStatus.fixed]),
        )
        .order_by(Regression.result_id.desc())
        .limit(1)
    ).first()


def history(session: Session, key: SeriesKey, before_id: int, runs: int) -> list[RunPoint]:
    """The baseline for a run with id ``before_id``: up to ``runs`` earlier runs since the last reset."""
    start = reset_point(session, key, before_id)
    return load_runs(session, key, before_id=before_id, after_id=start, limit=runs)
