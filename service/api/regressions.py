"""Regressions: ``GET /regressions`` and ``GET /regressions/{id}`` (public-read per settings),
``POST /regressions/{id}/acknowledge`` and ``POST /regressions/scan`` (admin: queues a change-point
scan for the background loop, answered 202; ``GET /regressions/scans/{id}`` follows it)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select

from kernelfleet.service import regression_scans
from kernelfleet.service.campaign_control import cancel_confirmations
from kernelfleet.service.db import immediate
from kernelfleet.service.deps import AdminDep, DashboardDep, DbDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import Regression, RegressionScan, RegressionStatus
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.params import Offset, RowId
from kernelfleet.service.regressions import engine
from kernelfleet.service.regressions.attribution import describe
from kernelfleet.service.schemas import OptUtcTime, Strict, UtcTime

router = APIRouter(tags=["regressions"])

StatusName = Literal["confirming", "open", "acknowledged", "dismissed"]


class RegressionOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    group_key: str
    group_size: int = 1
    kernel: str
    shape: str
    dtype: str
    chip: str
    config_key: str | None
    status: str
    detector: str
    baseline_median_us: float
    new_median_us: float
    effect: float
    p_value: float | None
    cause: dict[str, Any]
    cause_text: str = ""
    baseline_result_id: int | None
    result_id: int | None
    confirm_job_id: int | None
    # how it was confirmed: "re-run", "stored runs" (no worker of its chip), "unconfirmed: no worker of
    # this chip"; while confirming without a job, what it waits for
    confirmation: str | None = None
    detected_at: UtcTime
    acknowledged_at: OptUtcTime
    acknowledged_note: str | None


class AcknowledgeIn(Strict):
    note: Annotated[str | None, Field(max_length=2000)] = None
    whole_group: bool = Field(
        False, description="acknowledge every open or confirming regression of its group"
    )


class AcknowledgeOut(BaseModel):
    acknowledged: list[int]
    cancelled_jobs: list[int] = Field(default_factory=list,
                                      description="their queued confirmation jobs, now cancelled")


class ScanOut(BaseModel):
    """A change-point scan: queued by ``POST /regressions/scan``, run by the background loop."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    status: Literal["queued", "running", "done", "failed"]
    requests: int = Field(description="the scan requests it answers (requests while it was queued join it)")
    requested_at: UtcTime
    started_at: OptUtcTime
    finished_at: OptUtcTime
    series: int | None = Field(None, description="series scanned (once done)")
    findings: int | None = None
    created: list[int] | None = Field(None, description="regressions it created (once done)")
    moved: list[int] | None = Field(
        None, description="open regressions it moved to the run pair it found around their change")
    error: str | None = None
    url: str = Field("", description="where to follow it: GET this until status is done or failed")


class ScanQueuedOut(ScanOut):
    joined: bool = Field(description="true when a scan was queued already and this request joined it")


def _scan_out(row: RegressionScan) -> ScanOut:
    return ScanOut.model_validate(row).model_copy(update={"url": f"/api/v1/regressions/scans/{row.id}"})


def _out(row: Regression, group_size: int) -> RegressionOut:
    out = RegressionOut.model_validate(row)
    out.group_size = group_size
    out.cause_text = describe(row.cause)
    return out


@router.get("/regressions")
def list_regressions(
    _: DashboardDep,
    db: DbDep,
    status: Annotated[
        StatusName | None, Query(description="confirming, open, acknowledged or dismissed")
    ] = None,
    chip: Annotated[str | None, Query(max_length=128)] = None,
    kernel: Annotated[str | None, Query(max_length=64)] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> list[RegressionOut]:
    """Newest first. ``group_size`` counts the regressions (any status) that share the cause."""
    with db() as session:
        query = select(Regression)
        if status is not None:
            query = query.where(Regression.status == RegressionStatus(status))
        if chip is not None:
            query = query.where(Regression.chip == chip)
        if kernel is not None:
            query = query.where(Regression.kernel == kernel)
        rows = session.scalars(
            query.order_by(Regression.detected_at.desc(), Regression.id.desc()).limit(limit).offset(offset)
        ).all()
        keys = {r.group_key for r in rows}
        sizes = (
            dict(
                session.execute(
                    select(Regression.group_key, func.count(Regression.id))
                    .where(Regression.group_key.in_(keys))
                    .group_by(Regression.group_key)
                )
                .all()
            )
            if keys
            else {}
        )
        return [_out(r, sizes.get(r.group_key, 1)) for r in rows]


@router.get("/regressions/{regression_id:int}")  # :int: GET /regressions/scan is a 405, not a bad id
def get_regression(regression_id: RowId, _: DashboardDep, db: DbDep) -> RegressionOut:
    with db() as session:
        row = session.get(Regression, regression_id)
        if row is None:
            raise NotFound(f"no regression {regression_id}; list them with GET /api/v1/regressions")
        size = session.scalar(
            select(func.count(Regression.id)).where(Regression.group_key == row.group_key)) or 1
        return _out(row, size)


@router.post("/regressions/{regression_id}/acknowledge", responses=error_responses(409))
def acknowledge(
    regression_id: RowId, _: AdminDep, db: DbDep, body: AcknowledgeIn | None = None
) -> AcknowledgeOut:
    with db() as session:
        body = body or AcknowledgeIn()
        ids = engine.acknowledge(session, regression_id, body.note, body.whole_group)
        return AcknowledgeOut(acknowledged=ids, cancelled_jobs=cancel_confirmations(session, ids))


@router.post("/regressions/scan", status_code=status.HTTP_202_ACCEPTED)
def scan(_: AdminDep, db: DbDep) -> ScanQueuedOut:
    """Queue the offline change-point pass over every series; the background loop runs it (one scan
    at a time across processes and replicas). A request while a scan is queued joins that one.
    Follow ``url`` (``GET /regressions/scans/{id}``) for its status and, once done, what it found."""
    with db() as session, immediate(session):
        row, joined = regression_scans.enqueue(session)
        return ScanQueuedOut(**_scan_out(row).model_dump(), joined=joined)


@router.get("/regressions/scans/{scan_id}")
def get_scan(scan_id: RowId, _: DashboardDep, db: DbDep) -> ScanOut:
    """A queued, running or finished change-point scan."""
    with db() as session:
        row = session.get(RegressionScan, scan_id)
        if row is None:
            raise NotFound(f"no regression scan {scan_id}; queue one with POST /api/v1/regressions/scan")
        return _scan_out(row)
