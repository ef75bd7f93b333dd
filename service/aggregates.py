"""Incremental per-config statistics (``config_stats``), updated in the transaction that stores a result.

One row per (chip, backend, MLX version, kernel source, kernel, shape, dtype, config). Storing a
result touches only the rows of its own correct trials: O(that result's trials), whatever the history.
Each row keeps

- runs, imported runs, the distinct enrolled workers (bounded), first and last measurement time;
- a bounded window of the newest run medians, with their median (the robust center) and
  ``1.4826 * MAD / median`` (the relative spread);
- the speedup against the built-in measured *in the same runs* (a bounded window of per-run
  (low, mid, high) ratios), its median and a ~95 % interval: the order-statistic interval of the
  median from 6 runs on, and below that the widest of the runs' own p10/p90 bounds.

Profiles (:mod:`kernelfleet.service.profiles`) are built from these rows, never from raw trials.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any

from sqlalchemy import Row, and_, bindparam, select
from sqlalchemy.orm import Session, load_only

from kernelfleet.service.db import insert_rows, stored_utc
from kernelfleet.service.models import ConfigStat, Result

WINDOW = 32  # run medians (and same-run speedups) kept per row
MAX_WORKERS = 64  # distinct worker ids kept per row (the count saturates there)
SERIES_COLUMNS = ("chip", "backend", "mlx_version", "kernel", "shape", "dtype", "kernel_hash")
REBUILD_COLUMNS = ("id", "source", "worker_id", "created_at", "measured_at")


def robust_center(values: Sequence[float]) -> tuple[float, float]:
    """(median, relative spread = 1.4826 * MAD / median) of ``values`` (non-empty)."""
    center = float(statistics.median(values))
    mad = float(statistics.median([abs(v - center) for v in values]))
    return center, (1.4826 * mad / center if center > 0 else 0.0)


def speedup_interval(runs: Sequence[Sequence[float]]) -> tuple[float, float, float]:
    """(median, low, high) of same-run speedups given as (low, mid, high) per run."""
    mids = sorted(r[1] for r in runs)
    n = len(mids)
    mid = float(statistics.median(mids))
    # order-statistic interval of a median: the k-th smallest and largest with P(Binom(n, .5) < k) <= .025
    k = _median_rank(n)
    if n >= 6 and k >= 1:
        return mid, mids[k - 1], mids[n - k]
    return mid, min(r[0] for r in runs), max(r[2] for r in runs)


@cache
def _median_rank(n: int) -> int:
    """For n runs, the rank k of the order-statistic ~95 % interval of a median: the 2.5 % quantile of
    Binom(n, 1/2) (scipy's ``binom.ppf(0.025, n, 0.5)``), the least k with P(X <= k) >= 1/40, in
    exact integers: 40 * sum(C(n, i), i <= k) >= 2^n. Not scipy: importing scipy.stats took the first
    result each coordinator process stored over a second, holding the GIL from every other request."""
    below, k = 0, 0
    while True:
        below += math.comb(n, k)
        if 40 * below >= 2**n:
            return k
        k += 1


def _ratio_bounds(builtin: dict[str, Any], trial: dict[str, Any]) -> list[float]:
    """(low, mid, high) of built-in time / this config's time within one run, from both p10/p90."""
    b_mid, t_mid = float(builtin["median_us"]), float(trial["median_us"])
    b_lo, b_hi = float(builtin.get("p10_us") or b_mid), float(builtin.get("p90_us") or b_mid)
    t_lo, t_hi = float(trial.get("p10_us") or t_mid), float(trial.get("p90_us") or t_mid)
    return [b_lo / t_hi if t_hi > 0 else 0.0, b_mid / t_mid, b_hi / t_lo if t_lo > 0 else math.inf]


def _utc(value: datetime | None) -> datetime | None:
    """SQLite hands back naive datetimes; every stored time is UTC."""
    return None if value is None else stored_utc(value)


def _fold(row: Any, trial: dict[str, Any], builtin: dict[str, Any] | None, result: Result,
          when: datetime | None) -> dict[str, Any]:
    """The new values of a stats row (``row``: its current ones) after one more run, ``trial``."""
    workers = list(row.worker_ids)
    if result.worker_id is not None and result.worker_id not in workers and len(workers) < MAX_WORKERS:
        workers.append(result.worker_id)
    first, last = _utc(row.first_seen_at), _utc(row.last_seen_at)
    if when is not None:
        first, last = (min(first, when) if first else when), (max(last, when) if last else when)
    medians = [*row.medians_us, float(trial["median_us"])][-WINDOW:]
    center, spread = robust_center(medians)
    change: dict[str, Any] = {
        "runs": row.runs + 1, "imported_runs": row.imported_runs + (result.worker_id is None),
        "worker_ids": workers, "first_seen_at": first, "last_seen_at": last,
        "last_result_id": max(row.last_result_id, result.id),
        "medians_us": medians, "center_us": center, "spread": spread,
    }
    if builtin is not None:
        speedups = [*row.speedups, _ratio_bounds(builtin, trial)][-WINDOW:]
        mid, lo, hi = speedup_interval(speedups)
        change.update(speedups=speedups, speedup=mid, speedup_lo=lo, speedup_hi=hi)
    return change


@dataclass(frozen=True)
class _Blank:
    """The state of a stats row before its first run."""

    last_result_id: int
    runs: int = 0
    imported_runs: int = 0
    worker_ids: tuple[int, ...] = ()
    first_seen_at: datetime | None = None
    last_seen_at: datetime | None = None
    medians_us: tuple[float, ...] = ()
    speedups: tuple[list[float], ...] = ()


STATS = ConfigStat.__table__
# one UPDATE by primary key, executed once per row (executemany): Core, not the ORM's bulk update,
# whose per-row bookkeeping cost more than the rest of storing a result (measured: bench-load --profile)
_UPDATE_COLUMNS = ("runs", "imported_runs", "worker_ids", "first_seen_at", "last_seen_at", "last_result_id",
                   "medians_us", "center_us", "spread")
_SPEEDUP_COLUMNS = ("speedups", "speedup", "speedup_lo", "speedup_hi")


def _update_statement(with_speedups: bool) -> Any:
    columns = (*_UPDATE_COLUMNS, *(_SPEEDUP_COLUMNS if with_speedups else ()))
    return (STATS.update().where(STATS.c.id == bindparam("row_id"))
            .values({c: bindparam(c) for c in columns}))


_UPDATES = {flag: _update_statement(flag) for flag in (True, False)}


def record(session: Session, result: Result, trials: Sequence[dict[str, Any]],
           measured_at: datetime | None) -> int:
    """Fold one stored result's correct trials into ``config_stats``; returns the rows touched.

    Runs inside the caller's transaction. Rows new to the series are inserted complete (``ON
    CONFLICT DO NOTHING``, one statement: :func:`~kernelfleet.service.db.insert_rows`); when it
    inserted every row (a new series) that is all. Otherwise the rows that already existed (those this
    result did not write: ``last_result_id`` is another's) are read ``FOR UPDATE`` in key order and
    updated, so two results of the same series arriving at once (PostgreSQL) update one after the
    other and never lose a run: the insert that meets the other's row waits for its transaction,
    then updates it.
    """
    ok = sorted((t for t in trials if t["status"] == "ok" and t.get("median_us") and t["median_us"] > 0),
                key=lambda t: t["config_key"])
    if not ok:
        return 0
    series = {c: getattr(result, c) for c in SERIES_COLUMNS}
    when = _utc(measured_at or result.created_at)
    builtin = next((t for t in ok if t.get("is_builtin")), None)
    blank = _Blank(last_result_id=result.id)
    # one statement on PostgreSQL (the rows as one JSON parameter), an executemany on SQLite
    inserted = insert_rows(session, STATS, [
        {**series, "config_key": t["config_key"], "config": t["config"],
         "is_builtin": bool(t.get("is_builtin")), "speedups": [], **_fold(blank, t, builtin, result, when)}
        for t in ok],
        conflict=[*SERIES_COLUMNS, "config_key"])
    if inserted == len(ok):  # every row was new (a new series): nothing to read or update
        return len(ok)
    by_key = {t["config_key"]: t for t in ok}
    rows = session.execute(
        select(ConfigStat.id, ConfigStat.config_key, ConfigStat.runs, ConfigStat.imported_runs,
               ConfigStat.worker_ids, ConfigStat.first_seen_at, ConfigStat.last_seen_at,
               ConfigStat.last_result_id, ConfigStat.medians_us, ConfigStat.speedups)
        .where(and_(*(getattr(ConfigStat, c) == v for c, v in series.items())),
               ConfigStat.config_key.in_(list(by_key)), ConfigStat.last_result_id != result.id)
        .order_by(ConfigStat.config_key)
        .with_for_update()
    ).all()
    updates = [{"row_id": r.id, **_fold(r, by_key[r.config_key], builtin, result, when)} for r in rows]
    if updates:
        session.execute(_UPDATES[builtin is not None], updates)
    return len(ok)


# what a profile build reads of a stats row: not the bounded windows (for the incremental update only)
# nor the config (entries carry it parsed from the key), so a build decodes one small JSON list per row
STAT_COLUMNS = tuple(getattr(ConfigStat, c) for c in (
    "chip", "backend", "mlx_version", "kernel", "shape", "dtype", "kernel_hash", "config_key", "is_builtin",
    "runs", "imported_runs", "worker_ids", "first_seen_at", "last_seen_at", "last_result_id", "center_us",
    "spread", "speedup", "speedup_lo", "speedup_hi"))
StatRow = Row[Any]  # a row of STAT_COLUMNS (attribute access by column name)


def load_rows(session: Session, *where: Any) -> list[StatRow]:
    """The stats rows matching ``where`` as plain rows (no ORM objects): O(rows selected)."""
    return list(session.execute(select(*STAT_COLUMNS).where(*where)).all())


def current(rows: Sequence[StatRow], mlx_version: str | None = None) -> list[StatRow]:
    """The rows of each (chip, backend, kernel, shape, dtype) series' current measurements: its newest
    kernel source and, unless ``mlx_version`` is given, its newest MLX version (by the newest result
    that touched them)."""
    if mlx_version is not None:
        rows = [r for r in rows if r.mlx_version == mlx_version]
    newest: dict[tuple[str, ...], tuple[int, str, str]] = {}
    for r in rows:
        key = (r.chip, r.backend, r.kernel, r.shape, r.dtype)
        mark = (r.last_result_id, r.mlx_version, r.kernel_hash)
        if key not in newest or mark > newest[key]:
            newest[key] = mark
    return [r for r in rows
            if newest[(r.chip, r.backend, r.kernel, r.shape, r.dtype)][1:] == (r.mlx_version, r.kernel_hash)]


def current_rows(session: Session, *where: Any, mlx_version: str | None = None) -> list[StatRow]:
    """:func:`current` of the rows matching ``where``. Cost: O(stats rows selected), independent of
    stored results."""
    if mlx_version is not None:
        where = (*where, ConfigStat.mlx_version == mlx_version)
    return current(load_rows(session, *where), mlx_version)


def chips_with_data(session: Session) -> dict[str, str]:
    """chip -> its backend (the GPU one when a chip reported from several), for chips with stats."""
    out: dict[str, str] = {}
    for chip, backend in session.execute(select(ConfigStat.chip, ConfigStat.backend).distinct()).all():
        if chip not in out or out[chip] == "cpu":
            out[chip] = backend
    return out


def rebuild_all(session: Session) -> int:
    """Refill ``config_stats`` from every stored result (the data migration; also a repair tool).
    Streams results in id order, so windows hold the newest runs as they would incrementally."""
    from kernelfleet.service.models import Trial

    session.execute(ConfigStat.__table__.delete())
    count, after = 0, 0
    while True:
        # only the columns it reads: a data migration runs before later columns exist
        columns = (getattr(Result, c) for c in (*SERIES_COLUMNS, *REBUILD_COLUMNS))
        page = session.scalars(
            select(Result).options(load_only(*columns))
            .where(Result.id > after, Result.source.in_(("lease", "import")))
            .order_by(Result.id).limit(500)
        ).all()
        if not page:
            return count
        for result in page:
            trials = [
                {"config_key": t.config_key, "config": t.config, "is_builtin": t.is_builtin,
                 "status": t.status.value, "median_us": t.median_us, "p10_us": t.p10_us, "p90_us": t.p90_us}
                for t in session.execute(
                    select(Trial.config_key, Trial.config, Trial.is_builtin, Trial.status, Trial.median_us,
                           Trial.p10_us, Trial.p90_us).where(Trial.result_id == result.id))
            ]
            record(session, result, trials, result.measured_at)
            count += 1
        after = page[-1].id
        session.expunge_all()


