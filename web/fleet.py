"""Fleet page (``/``): the workers, a page of PAGE_SIZE at a time, with chip, backend, status, last
heartbeat, current job and results per day; per-status counts (SQL aggregates over the whole fleet,
so they are right at 10,000 workers) and totals for the fleet."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.service.db import db_now
from kernelfleet.service.deps import DbDep, SettingsDep
from kernelfleet.service.models import Job, JobState, Regression, RegressionStatus, Result, Worker
from kernelfleet.service.worker_status import STATUSES, worker_status
from kernelfleet.web.chips import cpu_only
from kernelfleet.web.figures import results_per_day_figure
from kernelfleet.web.render import db_clock, utc
from kernelfleet.web.render import page as page_response
from kernelfleet.web.routing import page_router
from kernelfleet.web.sql import utc_day

router = page_router()

PAGE_SIZE = 100


@dataclass
class WorkerRow:
    id: int
    name: str
    chip: str
    backend: str
    os: str
    mlx_version: str
    status: str
    last_heartbeat_at: datetime | None
    job: str | None
    job_id: int | None
    job_campaign: int | None = None
    results_window: int = 0  # results over the page's `days` filter


def _summary(session: Session, offline_after: float, chip: str | None) -> dict[str, int]:
    """Workers per status, counted in SQL over the whole fleet (or one chip), whatever page is shown."""
    status = worker_status(offline_after).label("status")
    q = select(status, func.count()).group_by(status)
    if chip:
        q = q.where(Worker.chip == chip)
    counts = {str(s): int(n) for s, n in session.execute(q)}
    return {s: counts.get(s, 0) for s in STATUSES}


def _workers(session: Session, offline_after: float, status: str | None, chip: str | None,
             offset: int) -> list[WorkerRow]:
    """One page of workers (PAGE_SIZE rows), filtered in SQL."""
    state = worker_status(offline_after)
    q = (
        select(Worker.id, Worker.name, Worker.chip, Worker.backend, Worker.os, Worker.mlx_version,
               state.label("status"), Worker.last_heartbeat_at)
        .order_by(Worker.chip, Worker.name, Worker.id)
        .limit(PAGE_SIZE)
        .offset(offset)
    )
    if chip:
        q = q.where(Worker.chip == chip)
    if status:
        q = q.where(state == status)
    return [
        WorkerRow(id=r.id, name=r.name, chip=r.chip, backend=str(r.backend), os=r.os,
                  mlx_version=r.mlx_version, status=r.status, last_heartbeat_at=r.last_heartbeat_at,
                  job=None, job_id=None)
        for r in session.execute(q)
    ]


def _current_jobs(session: Session, rows: list[WorkerRow]) -> None:
    by_id = {r.id: r for r in rows}
    if not by_id:
        return
    q = select(Job.id, Job.leased_by, Job.kernel, Job.shape, Job.dtype, Job.campaign_id).where(
        Job.state == JobState.leased, Job.leased_by.in_(list(by_id))
    )
    for j in session.execute(q):
        row = by_id[j.leased_by]
        row.job, row.job_id, row.job_campaign = f"{j.kernel} {j.shape} {j.dtype}", j.id, j.campaign_id


IMPORTED = "imported (no worker)"


def _per_day(session: Session, rows: list[WorkerRow], now: datetime, days: int) -> tuple[list[str], dict]:
    """Results stored per UTC day over the last ``days`` days: per worker on this page, plus imported
    results (``kernelfleet import``: no worker) as one more series, so the bars add up to every
    result stored. Each row's ``results_window`` is its total over those days."""
    names = {r.id: f"{r.name} (#{r.id})" for r in rows}
    labels = [(now - timedelta(days=i)).strftime("%Y-%m-%d") for i in range(days - 1, -1, -1)]
    day = utc_day(Result.created_at).label("day")
    since = Result.created_at >= db_now(-_since_midnight(now) - 86400.0 * (days - 1))
    counts: dict[tuple[str, str], int] = {}
    by_id = {r.id: r for r in rows}
    if names:
        q = (
            select(Result.worker_id, day, func.count().label("n"))
            .where(Result.worker_id.in_(list(names)), since)
            .group_by(Result.worker_id, day)
        )
        for r in session.execute(q):
            counts[(names[r.worker_id], str(r.day)[:10])] = int(r.n)
            by_id[r.worker_id].results_window += int(r.n)
    imported = select(day, func.count().label("n")).where(Result.source == "import", since).group_by(day)
    for r in session.execute(imported):
        counts[(IMPORTED, str(r.day)[:10])] = int(r.n)
    return labels, counts


def _since_midnight(now: datetime) -> float:
    """Seconds since 00:00 UTC today (database clock): day buckets start there."""
    return (now - now.replace(hour=0, minute=0, second=0, microsecond=0)).total_seconds()


def _totals(session: Session, now: datetime) -> dict[str, int]:
    jobs: dict[Any, int] = dict(
        session.execute(select(Job.state, func.count()).group_by(Job.state)).all()
    )
    regressions: dict[Any, int] = dict(
        session.execute(
            select(Regression.status, func.count())
            .where(Regression.status.in_([RegressionStatus.open, RegressionStatus.confirming]))
            .group_by(Regression.status)
        ).all()
    )
    today = session.scalar(  # the last bar of the per-day chart, imports included
        select(func.count()).select_from(Result).where(Result.created_at >= db_now(-_since_midnight(now)))
    )
    return {
        "queued": jobs.get(JobState.queued, 0),
        "leased": jobs.get(JobState.leased, 0),
        "dead": jobs.get(JobState.dead, 0),
        "done": jobs.get(JobState.done, 0),
        "open_regressions": regressions.get(RegressionStatus.open, 0),
        "confirming_regressions": regressions.get(RegressionStatus.confirming, 0),
        "results_today": int(today or 0),
    }


@router.get("/", response_class=HTMLResponse)
def fleet(
    request: Request,
    db: DbDep,
    settings: SettingsDep,
    status: Annotated[str | None, Query(pattern="^(online|offline|revoked)$")] = None,
    chip: Annotated[str | None, Query(max_length=128)] = None,
    days: Annotated[int, Query(ge=1, le=90)] = 14,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> HTMLResponse:
    with db() as session:
        now = db_clock(session)
        offline_after = settings.worker_offline_after_seconds
        summary = _summary(session, offline_after, chip)
        matching = sum(summary.values()) if status is None else summary[status]
        rows = _workers(session, offline_after, status, chip, offset)
        _current_jobs(session, rows)
        labels, counts = _per_day(session, rows, now, days)
        shown = {k[0] for k in counts}
        workers = [f"{r.name} (#{r.id})" for r in rows if f"{r.name} (#{r.id})" in shown]
        workers += [IMPORTED] if IMPORTED in shown else []
        figure = results_per_day_figure(labels, workers, counts) if counts else None
        chips = session.scalars(select(Worker.chip).distinct().order_by(Worker.chip)).all()
        return page_response(
            request,
            "fleet.html",
            title="Fleet",
            rows=rows,
            now=now,
            figure=figure,
            totals=_totals(session, now),
            summary=summary,
            status=status,
            chip=chip,
            chips=chips,
            days=days,
            offset=offset,
            limit=PAGE_SIZE,
            matching=matching,
            offline_after=offline_after,
            utc=utc,
            cpu_only=cpu_only(session),
        )
