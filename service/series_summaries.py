"""Per-series summaries of one backend's ``config_stats``, held in the builder's memory and refreshed
by the series that changed since the last refresh: what a profile build reads instead of every stats row.

A *series* is one (chip, MLX version, kernel source, kernel, shape, dtype) of a backend; its summary
holds what a profile needs of its rows: each config's robust center time, the measured pick with its
profile entry, and the pick's margin for transfers (:func:`kernelfleet.service.profiles.summarize`).

Refresh (:meth:`SeriesCache.refresh`): a series' rows change only when a result of that series is
stored (in the result's transaction), so the results stored since the last refresh name the series to
reload, and only their rows are read: O(the changed series' rows), whatever the total. A full
reload reads only each (chip, MLX version, kernel, shape, dtype)'s newest kernel source (chosen by
an aggregate in SQL), never older sources' rows. Result ids
are handed out at insert, not at commit (PostgreSQL), so an id below the newest one seen that was not
visible yet is kept as a *gap* and looked up again at the next refresh until it appears (or, if its
transaction rolled back, for :data:`GAP_SECONDS`). A full reload happens on the first refresh, every
:data:`FULL_RELOAD_SECONDS` (bounding what an out-of-band change, such as
:func:`kernelfleet.service.aggregates.rebuild_all`, can leave stale), and whenever the table's id
range says it was refilled.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import and_, func, select
from sqlalchemy.orm import Session

from kernelfleet.service import aggregates
from kernelfleet.service.aggregates import StatRow
from kernelfleet.service.models import ConfigStat, Result

GAP_SECONDS = 600.0  # how long an unseen result id below the newest seen is looked for
FULL_RELOAD_SECONDS = 600.0
RELOAD_GAPS = 1000  # result ids below the newest checked for gaps on a full reload (far above in-flight)
# (chip, mlx_version, kernel_hash, kernel, shape, dtype)
SeriesKey = tuple[str, str, str, str, str, str]
_KEY_COLUMNS = ("chip", "mlx_version", "kernel_hash", "kernel", "shape", "dtype")


def _id_range(session: Session) -> tuple[int | None, int | None]:
    """The stats table's (min id, max id): two subqueries, each one index probe (SQLite optimizes
    a lone min() or max() only; both in one select scan the table)."""
    low = select(func.min(ConfigStat.id)).scalar_subquery()
    high = select(func.max(ConfigStat.id)).scalar_subquery()
    row = session.execute(select(low, high)).one()
    return row[0], row[1]


def series_key(row: Any) -> SeriesKey:
    return (row.chip, row.mlx_version, row.kernel_hash, row.kernel, row.shape, row.dtype)


def group(rows: Iterable[StatRow]) -> dict[SeriesKey, list[StatRow]]:
    out: dict[SeriesKey, list[StatRow]] = {}
    for r in rows:
        out.setdefault(series_key(r), []).append(r)
    return out


@dataclass
class SeriesCache:
    """The summaries of one backend's series (``summaries``: series key -> what
    :func:`kernelfleet.service.profiles.summarize` made of its rows) and how far they are current."""

    backend: str
    summaries: dict[SeriesKey, Any] = field(default_factory=dict)
    through: int = 0  # the newest result id seen
    gaps: dict[int, float] = field(default_factory=dict)  # unseen ids below it -> when first missed
    id_range: tuple[int | None, int | None] = (None, None)  # the stats table's (min id, max id)
    loaded_at: float | None = None  # monotonic time of the last full reload
    lock: threading.Lock = field(default_factory=threading.Lock)

    def refresh(self, session: Session, summarize: Any) -> int:
        """Bring the summaries up to what ``session`` sees; returns the series reloaded (all of them
        on a full reload). ``summarize(rows)``: a series' summary from its stats rows."""
        now = time.monotonic()
        id_range = _id_range(session)
        refilled = (self.id_range[0] is not None
                    and (id_range[0] != self.id_range[0] or (id_range[1] or 0) < (self.id_range[1] or 0)))
        if self.loaded_at is None or refilled or now - self.loaded_at > FULL_RELOAD_SECONDS:
            return self._reload(session, summarize, now)
        changed = self._changed(session, now)
        self.id_range = (id_range[0], id_range[1])
        for key, series_rows in group(self._load(session, sorted(changed))).items():
            self.summaries[key] = summarize(series_rows)
        return len(changed)

    def _load(self, session: Session, keys: Sequence[SeriesKey]) -> list[StatRow]:
        """The stats rows of these series: one statement each, by the unique key's index (an OR of
        several keys is planned by SQLite as a scan of the backend's rows)."""
        rows: list[StatRow] = []
        for key in keys:
            same = (getattr(ConfigStat, c) == v for c, v in zip(_KEY_COLUMNS, key, strict=True))
            rows += aggregates.load_rows(session, ConfigStat.backend == self.backend, *same)
        return rows

    def _reload(self, session: Session, summarize: Any, now: float) -> int:
        # the newest result id before the rows (a result committing in between is reloaded next
        # time), and the ids below it not visible yet (in flight: looked up until they appear)
        self.through = session.scalar(select(func.max(Result.id))) or 0
        visible = set(session.scalars(select(Result.id).where(Result.id > self.through - RELOAD_GAPS)))
        self.gaps = {i: now for i in range(max(1, self.through - RELOAD_GAPS + 1), self.through + 1)
                     if i not in visible}
        self.id_range = _id_range(session)
        # only each (chip, MLX version, kernel, shape, dtype)'s newest kernel source: the one a
        # profile can show (a newer result of an older source makes that one newest and changed, so
        # a refresh reads it then). Chosen in SQL: per series its newest result, per source-less
        # series the newest of those, joined back to the rows (a tie reads both: current() decides)
        columns = [getattr(ConfigStat, c) for c in _KEY_COLUMNS]
        marks = (select(*columns, func.max(ConfigStat.last_result_id).label("mark"))
                 .where(ConfigStat.backend == self.backend).group_by(*columns).subquery())
        sourceless = [c for c in _KEY_COLUMNS if c != "kernel_hash"]
        newest = (select(*(marks.c[c] for c in sourceless), func.max(marks.c.mark).label("mark"))
                  .group_by(*(marks.c[c] for c in sourceless)).subquery())
        rows = list(session.execute(
            select(*aggregates.STAT_COLUMNS)
            .join(marks, and_(*(getattr(ConfigStat, c) == marks.c[c] for c in _KEY_COLUMNS)))
            .join(newest, and_(marks.c.mark == newest.c.mark,
                               *(marks.c[c] == newest.c[c] for c in sourceless)))
            .where(ConfigStat.backend == self.backend)).all())
        self.summaries = {key: summarize(series_rows) for key, series_rows in group(rows).items()}
        self.loaded_at = now
        return len(self.summaries)

    def _changed(self, session: Session, now: float) -> set[SeriesKey]:
        """The series of this backend that results stored since the last refresh belong to."""
        columns = (Result.id, Result.backend, *(getattr(Result, c) for c in _KEY_COLUMNS))
        seen = list(session.execute(select(*columns).where(Result.id > self.through)).all())
        if self.gaps:
            seen += session.execute(select(*columns).where(Result.id.in_(list(self.gaps)))).all()
        ids = {r.id for r in seen}
        newest = max(ids | {self.through})
        missing = set(range(self.through + 1, newest + 1)) - ids
        self.gaps = {i: t for i, t in self.gaps.items() if i not in ids and now - t < GAP_SECONDS}
        self.gaps.update({i: now for i in missing})
        self.through = newest
        return {series_key(r) for r in seen if r.backend == self.backend}



_CACHES: dict[tuple[str, str], SeriesCache] = {}
_CACHES_LOCK = threading.Lock()


def cache_for(session: Session, backend: str) -> SeriesCache:
    """This process's cache of ``backend``'s series on the session's database."""
    key = (str(session.get_bind().engine.url), backend)
    with _CACHES_LOCK:
        return _CACHES.setdefault(key, SeriesCache(backend))


def forget() -> None:
    """Drop every cache (the next refresh of each reloads it whole)."""
    with _CACHES_LOCK:
        _CACHES.clear()


def current(summaries: dict[SeriesKey, Any], mlx_version: str | None) -> list[Any]:
    """The summaries of each (chip, kernel, shape, dtype)'s current series, in key order: its newest
    kernel source and, unless ``mlx_version`` is given, its newest MLX version (by the newest result
    that touched them), as :func:`kernelfleet.service.aggregates.current` picks rows."""
    newest: dict[tuple[str, str, str, str], tuple[int, str, str]] = {}
    for key, s in summaries.items():
        chip, version, kernel_hash, kernel, shape, dtype = key
        if mlx_version is not None and version != mlx_version:
            continue
        mark = (s.newest, version, kernel_hash)
        series = (chip, kernel, shape, dtype)
        if series not in newest or mark > newest[series]:
            newest[series] = mark
    return [summaries[(c, v, h, k, s, d)] for (c, k, s, d), (_, v, h) in sorted(newest.items())]


def versions_of(summaries: Sequence[Any], chip: str) -> list[str]:
    return sorted({s.mlx_version for s in summaries if s.chip == chip})
