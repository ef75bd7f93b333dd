"""Stored results as data: the filtered, keyset-paged query behind ``GET /api/v1/results`` and its
JSON and CSV forms.

A page is the newest ``limit`` results matching the filters with ``id < cursor``, newest first;
``next_cursor`` is the last id of a full page (None on the last page), so paging costs one index
range scan per page however deep it goes. Each filter takes several values (``chip=A&chip=B``).
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict
from sqlalchemy import ColumnElement, select
from sqlalchemy.orm import Session, load_only

from kernelfleet.service.models import Result
from kernelfleet.service.schemas import OptUtcTime, UtcTime


class ResultRow(BaseModel):
    """One run: what was measured where, with which MLX and kernel revision, and the best time."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    created_at: UtcTime
    measured_at: OptUtcTime
    source: str
    chip: str
    backend: str
    kernel: str
    shape: str
    dtype: str
    mlx_version: str
    revision: str | None
    kernel_hash: str
    os: str
    driver: str | None
    strategy: str
    best_config_key: str | None
    best_is_builtin: bool
    best_median_us: float | None
    best_p10_us: float | None
    best_p90_us: float | None
    builtin_median_us: float | None
    speedup: float | None  # built-in / best (above 1: the tuned config beats the built-in)
    worker_id: int | None
    job_id: int | None


class ResultPage(BaseModel):
    items: list[ResultRow]
    next_cursor: int | None  # pass as ?cursor= for the next (older) page; None on the last page
    next: str | None  # the next page's URL


COLUMNS = tuple(ResultRow.model_fields)


@dataclass(frozen=True)
class ResultFilter:
    chip: Sequence[str] = ()
    kernel: Sequence[str] = ()
    shape: Sequence[str] = ()
    dtype: Sequence[str] = ()
    backend: Sequence[str] = ()
    mlx_version: Sequence[str] = ()
    revision: Sequence[str] = ()
    source: Sequence[str] = ()
    since: datetime | None = None  # stored at or after (created_at)
    until: datetime | None = None  # stored before

    def where(self) -> list[ColumnElement[bool]]:
        out: list[ColumnElement[bool]] = []
        for name in ("chip", "kernel", "shape", "dtype", "backend", "mlx_version", "revision", "source"):
            values = list(getattr(self, name))
            if values:
                column = getattr(Result, name)
                out.append(column == values[0] if len(values) == 1 else column.in_(values))
        if self.since is not None:
            out.append(Result.created_at >= _utc(self.since))
        if self.until is not None:
            out.append(Result.created_at < _utc(self.until))
        return out


def _utc(value: datetime) -> datetime:
    """Naive times are UTC; aware ones are converted (SQLite compares the stored UTC text)."""
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00+05:00 has no UTC time in datetime's range: the
        # nearest one compares the same with every stored time
        return (datetime.min if value.year == 1 else datetime.max).replace(tzinfo=UTC)


def page(session: Session, filters: ResultFilter, limit: int, cursor: int | None) -> tuple[list[ResultRow],
                                                                                      int | None]:
    """One page, newest first, and the cursor of the next one (None when this is the last)."""
    stored = [getattr(Result, c) for c in COLUMNS if c != "speedup"]  # not the golden output nor trials
    query = select(Result).options(load_only(*stored)).where(*filters.where())
    if cursor is not None:
        query = query.where(Result.id < cursor)
    rows = session.scalars(query.order_by(Result.id.desc()).limit(limit + 1)).all()
    more = len(rows) > limit
    rows = rows[:limit]
    items = [row_of(r) for r in rows]
    return items, (rows[-1].id if more and rows else None)


def row_of(r: Result) -> ResultRow:
    speedup = (r.builtin_median_us / r.best_median_us
               if r.builtin_median_us and r.best_median_us and r.best_median_us > 0 else None)
    return ResultRow(**{c: getattr(r, c) for c in COLUMNS if c != "speedup"}, speedup=speedup)


def to_csv(items: Sequence[ResultRow]) -> str:
    """A header line and one line per run (the JSON fields, in order; empty cells for nulls)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(COLUMNS)
    for item in items:
        data = item.model_dump(mode="json")
        writer.writerow(["" if data[c] is None else data[c] for c in COLUMNS])
    return buffer.getvalue()
