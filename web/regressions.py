"""Regressions page (``/regressions``, ``/regressions/{id}``): what the store holds, each with its
evidence chart (the series around it), its attribution (the ``cause``: what changed between the
runs), its status with who last changed it and when (triage), and an acknowledge action that needs
the admin token; a regression's own page lists every change a person made to it."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Any

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import ColumnElement, func, select
from sqlalchemy.orm import Session

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Job, Regression, RegressionStatus, Result
from kernelfleet.service.params import RowId
from kernelfleet.service.regressions.triage import history
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.figures import series_figure
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router
from kernelfleet.web.series import distinct_values, window_points

router = page_router()

Name = Annotated[str | None, Query(max_length=128)]
ACTIVE = (RegressionStatus.open, RegressionStatus.confirming)
STATUS_CHOICES = (
    "active", "open", "confirming", "acknowledged", "dismissed", "invalid", "ignored", "fixed", "all"
)
PAGE = 20
# The acknowledge action posts to the regressions API; the admin token travels in a header.
ACK_URL = "/api/v1/regressions/{id}/acknowledge"


@dataclass
class Card:
    reg: Regression
    figure: str | None
    group_size: int = 1
    group_chips: int = 1
    confirm_state: str | None = None
    new_run_at: datetime | None = None
    ack_url: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _evidence(session: Session, reg: Regression) -> tuple[str | None, datetime | None]:
    anchor = None
    if reg.result_id is not None:
        anchor = session.scalar(select(Result.created_at).where(Result.id == reg.result_id))
    anchor = anchor or reg.detected_at
    points = window_points(session, reg.chip, reg.kernel, reg.shape, reg.dtype, anchor, before=30, after=10)
    if not points:
        return None, anchor
    highlight = [i for i in (reg.result_id, reg.baseline_result_id) if i is not None]
    hlines = [
        (reg.baseline_median_us, f"baseline {reg.baseline_median_us:.2f} µs"),
        (reg.new_median_us, f"new {reg.new_median_us:.2f} µs"),
    ]
    return series_figure(points, highlight=highlight, hlines=hlines), anchor


def _cards(session: Session, regs: list[Regression]) -> list[Card]:
    keys = list({r.group_key for r in regs})
    groups: dict[str, tuple[int, int]] = {}
    if keys:
        q = (
            select(Regression.group_key, func.count(), func.count(func.distinct(Regression.chip)))
            .where(Regression.group_key.in_(keys))
            .group_by(Regression.group_key)
        )
        groups = {k: (int(n), int(c)) for k, n, c in session.execute(q)}
    jobs = [r.confirm_job_id for r in regs if r.confirm_job_id is not None]
    states: dict[int, Any] = (
        dict(session.execute(select(Job.id, Job.state).where(Job.id.in_(jobs))).all())
        if jobs
        else {}
    )
    cards = []
    for reg in regs:
        figure, anchor = _evidence(session, reg)
        size, chips = groups.get(reg.group_key, (1, 1))
        state = states.get(reg.confirm_job_id) if reg.confirm_job_id is not None else None
        cards.append(
            Card(reg, figure, size, chips, str(state) if state else None, anchor, ACK_URL.format(id=reg.id))
        )
    return cards


@router.get("/regressions", response_class=HTMLResponse)
def regressions(
    request: Request,
    db: DbDep,
    status: Annotated[str, Query(pattern="^(" + "|".join(STATUS_CHOICES) + ")$")] = "active",
    chip: Name = None,
    kernel: Name = None,
    group: Annotated[str | None, Query(max_length=256)] = None,
    offset: Annotated[int, Query(ge=0, le=1_000_000)] = 0,
) -> HTMLResponse:
    with db() as session:
        where: list[ColumnElement[bool]] = []
        if status == "active":
            where.append(Regression.status.in_(ACTIVE))
        elif status != "all":
            where.append(Regression.status == RegressionStatus(status))
        if chip:
            where.append(Regression.chip == chip)
        if kernel:
            where.append(Regression.kernel == kernel)
        if group:
            where.append(Regression.group_key == group)
        total = session.scalar(select(func.count()).select_from(Regression).where(*where)) or 0
        regs = list(
            session.scalars(
                select(Regression)
                .where(*where)
                .order_by(Regression.detected_at.desc(), Regression.id.desc())
                .limit(PAGE)
                .offset(offset)
            )
        )
        counts = dict(
            session.execute(select(Regression.status, func.count()).group_by(Regression.status))
            .all()
        )
        return page(
            request,
            "regressions.html",
            title="Regressions",
            cards=_cards(session, regs),
            total=int(total),
            offset=offset,
            limit=PAGE,
            status=status,
            chip=chip,
            kernel=kernel,
            group=group,
            statuses=STATUS_CHOICES,
            counts={str(k): int(v) for k, v in counts.items()},
            chips=distinct_values(session, Regression.chip),
            kernels=distinct_values(session, Regression.kernel),
            now=db_clock(session),
        )


@router.get("/regressions/{regression_id}", response_class=HTMLResponse)
def regression(request: Request, db: DbDep, regression_id: RowId) -> HTMLResponse:
    with db() as session:
        reg = session.get(Regression, regression_id)
        if reg is None:
            raise PageNotFound(
                f"no regression with id {regression_id}", hint="The regressions page lists them all."
            )
        return page(
            request,
            "regression.html",
            title=f"Regression {reg.id}",
            c=_cards(session, [reg])[0],
            events=history(session, reg.id),
            now=db_clock(session),
        )
