"""Campaigns and jobs (``/campaigns``, ``/campaigns/{id}``): progress bars, job states, and
failures with their messages. Counts come from ``GROUP BY`` over ``ix_jobs_campaign_state``."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Campaign, Job, JobState, Result, Worker
from kernelfleet.service.params import RowId
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router

router = page_router()

STATES = [s.value for s in JobState]
CAMPAIGNS_PAGE = 50
JOBS_PAGE = 100
FAILURES = 50


def _counts(session: Session, campaign_ids: list[int]) -> dict[int, dict[str, int]]:
    out: dict[int, dict[str, int]] = {i: {} for i in campaign_ids}
    if not campaign_ids:
        return out
    q = (
        select(Job.campaign_id, Job.state, func.count())
        .where(Job.campaign_id.in_(campaign_ids))
        .group_by(Job.campaign_id, Job.state)
    )
    for cid, state, n in session.execute(q):
        if cid is not None:
            out[cid][str(state)] = int(n)
    return out


@router.get("/campaigns", response_class=HTMLResponse)
def campaigns(
    request: Request, db: DbDep, offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0
) -> HTMLResponse:
    with db() as session:
        total = session.scalar(select(func.count()).select_from(Campaign)) or 0
        rows = session.execute(
            select(
                Campaign.id,
                Campaign.name,
                Campaign.target_backend,
                Campaign.target_chip,
                Campaign.spec,
                Campaign.created_at,
            )
            .order_by(Campaign.id.desc())
            .limit(CAMPAIGNS_PAGE)
            .offset(offset)
        ).all()
        counts = _counts(session, [r.id for r in rows])
        loose = dict(
            session.execute(select(Job.state, func.count()).where(Job.campaign_id.is_(None))
                            .group_by(Job.state))
            .all()
        )
        return page(
            request,
            "campaigns.html",
            title="Campaigns",
            rows=rows,
            counts=counts,
            total=int(total),
            offset=offset,
            limit=CAMPAIGNS_PAGE,
            loose={str(k): int(v) for k, v in loose.items()},
            now=db_clock(session),
        )


@router.get("/campaigns/{campaign_id}", response_class=HTMLResponse)
def campaign(
    request: Request,
    db: DbDep,
    campaign_id: RowId,
    state: Annotated[str | None, Query(pattern="^(" + "|".join(STATES) + ")$")] = None,
    kernel: Annotated[str | None, Query(max_length=64)] = None,
    offset: Annotated[int, Query(ge=0, le=10_000_000)] = 0,
) -> HTMLResponse:
    with db() as session:
        c = session.get(Campaign, campaign_id)
        if c is None:
            raise PageNotFound(f"no campaign with id {campaign_id}",
                               hint="The campaigns page lists them all.")
        counts = _counts(session, [campaign_id])[campaign_id]
        per_kernel: dict[str, dict[str, int]] = {}
        for k, s, n in session.execute(
            select(Job.kernel, Job.state, func.count())
            .where(Job.campaign_id == campaign_id)
            .group_by(Job.kernel, Job.state)
        ):
            per_kernel.setdefault(k, {})[str(s)] = int(n)
        where: list[ColumnElement[bool]] = [Job.campaign_id == campaign_id]
        if state:
            where.append(Job.state == JobState(state))
        if kernel:
            where.append(Job.kernel == kernel)
        matching = session.scalar(select(func.count()).select_from(Job).where(*where)) or 0
        jobs = session.execute(
            select(
                Job.id,
                Job.kernel,
                Job.shape,
                Job.dtype,
                Job.kind,
                Job.state,
                Job.attempts,
                Job.max_attempts,
                Job.lease_expires_at,
                Job.updated_at,
                Job.last_error,
                Worker.name.label("worker"),
                Result.id.label("result_id"),
            )
            .outerjoin(Worker, Worker.id == Job.leased_by)
            .outerjoin(Result, Result.job_id == Job.id)
            .where(*where)
            .order_by(Job.id)
            .limit(JOBS_PAGE)
            .offset(offset)
        ).all()
        failures = session.execute(
            select(
                Job.id,
                Job.kernel,
                Job.shape,
                Job.dtype,
                Job.state,
                Job.attempts,
                Job.max_attempts,
                Job.last_error,
                Job.updated_at,
            )
            .where(Job.campaign_id == campaign_id, Job.last_error.is_not(None))
            .order_by(Job.updated_at.desc(), Job.id.desc())
            .limit(FAILURES)
        ).all()
        return page(
            request,
            "campaign.html",
            title=c.name,
            c=c,
            counts=counts,
            per_kernel=per_kernel,
            jobs=jobs,
            failures=failures,
            state=state,
            kernel=kernel,
            states=STATES,
            matching=int(matching),
            offset=offset,
            limit=JOBS_PAGE,
            now=db_clock(session),
        )
