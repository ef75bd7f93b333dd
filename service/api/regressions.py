"""Regressions: ``GET /regressions``, ``GET /regressions/{id}`` and its ``/history`` (public-read per
settings), ``POST /regressions/scan`` (admin: queues a change-point scan for the background loop,
answered 202; ``GET /regressions/scans/{id}`` follows it), and triage (admin; each change recorded with
who made it: :mod:`kernelfleet.service.regressions.triage`): ``POST /regressions/{id}/acknowledge``,
``/triage`` (invalid, ignored, fixed, or open again) and ``/group`` (into another alert's group, or
out of its group); ``GET``/``PUT /regressions/thresholds`` and ``DELETE
/regressions/thresholds/{id}`` (a series' own minimum effect)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, status
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.service import regression_scans
from kernelfleet.service.campaign_control import cancel_confirmations
from kernelfleet.service.db import immediate
from kernelfleet.service.deps import ActorDep, AdminDep, DashboardDep, DbDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import Regression, RegressionScan, RegressionStatus, SeriesThreshold
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.params import MAX_ROW_ID, Offset, RowId
from kernelfleet.service.regressions import triage
from kernelfleet.service.regressions.attribution import describe
from kernelfleet.service.regressions.series import SeriesKey
from kernelfleet.service.schemas import OptUtcTime, Strict, UtcTime

router = APIRouter(tags=["regressions"])

StatusName = Literal["confirming", "open", "acknowledged", "dismissed", "invalid", "ignored", "fixed"]
STATUS_HELP = "confirming, open, acknowledged, dismissed, invalid, ignored or fixed"
Note = Annotated[str | None, Field(max_length=2000)]
LinkId = Annotated[int | None, Field(ge=1, le=MAX_ROW_ID)]


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
    status_changed_by: str | None = Field(
        None, description='who last changed its status: "admin" (the admin token) or "token ID (NAME)"')
    status_changed_at: OptUtcTime = None
    status_note: str | None = None
    fixed_by_regression_id: int | None = None
    fixed_by_result_id: int | None = None
    group_note: str | None = Field(None, description="set when a person grouped or ungrouped it by hand")


class AcknowledgeIn(Strict):
    note: Note = None
    whole_group: bool = Field(
        False, description="acknowledge every open or confirming regression of its group"
    )


class AcknowledgeOut(BaseModel):
    acknowledged: list[int]
    cancelled_jobs: list[int] = Field(default_factory=list,
                                      description="their queued confirmation jobs, now cancelled")


class TriageIn(Strict):
    status: Literal["invalid", "ignored", "fixed", "open"] = Field(
        description="invalid (noise), ignored (expected), fixed (undone later: give fixed_by_regression_id "
                    "or fixed_by_result_id), or open again (undoes a mark or an acknowledgement)")
    note: Note = None
    fixed_by_regression_id: LinkId = Field(None, description="a later alert of the same series that undid it")
    fixed_by_result_id: LinkId = Field(None, description="a later run of the same series that shows the fix")
    whole_group: bool = Field(False, description="also every other regression of its group whose status "
                                                 "can move there (not with fixed)")


class TriageOut(RegressionOut):
    changed: list[int] = Field(description="the regressions marked: this one (with whole_group, its group's)")
    cancelled_jobs: list[int] = Field(default_factory=list,
                                      description="their queued confirmation jobs, now cancelled")


class GroupIn(Strict):
    into: LinkId = Field(description="the regression whose group it joins; null: a group of its own")
    note: Note = None


class EventOut(BaseModel):
    """One change a person made: its status (action "status") or its group (action "group")."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    at: UtcTime
    actor: str
    action: str
    old: str | None
    new: str
    note: str | None
    detail: dict[str, Any] | None


class ThresholdIn(Strict):
    chip: Annotated[str, Field(min_length=1, max_length=128)]
    kernel: Annotated[str, Field(min_length=1, max_length=64)]
    shape: Annotated[str, Field(min_length=1, max_length=128)]
    dtype: Annotated[str, Field(min_length=1, max_length=16)]
    min_effect: float = Field(gt=0.0, le=10.0, description="the smallest slowdown that alerts (0.05: 5 %)")
    note: Note = None


class ThresholdOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    chip: str
    kernel: str
    shape: str
    dtype: str
    min_effect: float
    note: str | None
    set_by: str
    set_at: UtcTime


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
        StatusName | None, Query(description=STATUS_HELP)
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


def _one(session: Session, regression_id: int) -> RegressionOut:
    session.expire_all()  # a triage change is written by UPDATE statements: read the row afresh
    row = session.get(Regression, regression_id)
    if row is None:
        raise NotFound(triage.MISSING.format(regression_id))
    size = session.scalar(select(func.count(Regression.id)).where(Regression.group_key == row.group_key)) or 1
    return _out(row, size)


@router.get("/regressions/{regression_id:int}")  # :int: GET /regressions/scan is a 405, not a bad id
def get_regression(regression_id: RowId, _: DashboardDep, db: DbDep) -> RegressionOut:
    with db() as session:
        return _one(session, regression_id)


@router.get("/regressions/{regression_id:int}/history")
def regression_history(regression_id: RowId, _: DashboardDep, db: DbDep) -> list[EventOut]:
    """Every change a person made to its status or group, oldest first: who, when, from what to what."""
    with db() as session:
        return [EventOut.model_validate(e) for e in triage.history(session, regression_id)]


@router.post("/regressions/{regression_id}/acknowledge", responses=error_responses(409))
def acknowledge(
    regression_id: RowId, actor: ActorDep, db: DbDep, body: AcknowledgeIn | None = None
) -> AcknowledgeOut:
    with db() as session:
        body = body or AcknowledgeIn()
        ids = triage.acknowledge(session, regression_id, body.note, body.whole_group, actor)
        return AcknowledgeOut(acknowledged=ids, cancelled_jobs=cancel_confirmations(session, ids))


@router.post("/regressions/{regression_id}/triage", responses=error_responses(409))
def mark(regression_id: RowId, body: TriageIn, actor: ActorDep, db: DbDep) -> TriageOut:
    """Mark an alert invalid, ignored or fixed (or open again), with a note; with ``whole_group``, its
    group's too. 409 when its status cannot move there (dismissed, already so, or reopening one still
    confirming). Marking one still being confirmed cancels its queued confirmation job."""
    with db() as session:
        ids = triage.mark(session, regression_id, RegressionStatus(body.status), actor, body.note,
                          body.fixed_by_regression_id, body.fixed_by_result_id, body.whole_group)
        cancelled = cancel_confirmations(session, ids)
        return TriageOut(**_one(session, regression_id).model_dump(), changed=ids, cancelled_jobs=cancelled)


@router.post("/regressions/{regression_id}/group", responses=error_responses(409))
def group(regression_id: RowId, body: GroupIn, actor: ActorDep, db: DbDep) -> RegressionOut:
    """Move an alert into another alert's group (``into``: its id), or out of its group into one of
    its own (``into``: null); ``group_note`` keeps what was done, and the scan keeps the group."""
    with db() as session:
        triage.regroup(session, regression_id, body.into, actor, body.note)
        return _one(session, regression_id)


@router.get("/regressions/thresholds")
def thresholds(_: DashboardDep, db: DbDep) -> list[ThresholdOut]:
    """The series with a minimum effect of their own (every other series uses the settings')."""
    with db() as session:
        return [ThresholdOut.model_validate(t) for t in triage.list_thresholds(session)]


@router.put("/regressions/thresholds", responses=error_responses(404))
def set_threshold(body: ThresholdIn, actor: ActorDep, db: DbDep) -> ThresholdOut:
    """Set (or replace) one series' minimum effect: the detectors use it instead of
    ``KERNELFLEET_REGRESSION_MIN_EFFECT`` for that chip, kernel, shape and dtype, from the next run
    checked (and in the scan). 404 when the series has no stored run."""
    with db() as session:
        key = SeriesKey(chip=body.chip, kernel=body.kernel, shape=body.shape, dtype=body.dtype)
        row, _ = triage.set_threshold(session, key, body.min_effect, body.note, actor)
        return ThresholdOut.model_validate(row)


@router.delete("/regressions/thresholds/{threshold_id}")
def delete_threshold(threshold_id: RowId, _: AdminDep, db: DbDep) -> ThresholdOut:
    """Remove a series' own minimum effect (the settings' applies again); answers the removed row."""
    with db() as session:
        row: SeriesThreshold = triage.delete_threshold(session, threshold_id)
        return ThresholdOut.model_validate(row)


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
