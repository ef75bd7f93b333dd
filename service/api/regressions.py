"""Regressions: ``GET /regressions`` and ``GET /regressions/{id}`` (public-read per settings),
``POST /regressions/{id}/acknowledge`` and ``POST /regressions/scan`` (admin)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import func, select

from kernelfleet.service.campaign_control import cancel_confirmations
from kernelfleet.service.deps import AdminDep, DashboardDep, DbDep, SettingsDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import Regression, RegressionStatus
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
    series: int
    findings: int
    created: list[int]


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
                .tuples()
                .all()
            )
            if keys
            else {}
        )
        return [_out(r, sizes.get(r.group_key, 1)) for r in rows]


@router.get("/regressions/{regression_id}")
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


@router.post("/regressions/scan")
def scan(_: AdminDep, factory: DbDep, settings: SettingsDep) -> ScanOut:
    """Run the offline change-point pass over every series now."""
    report = engine.scan(factory, settings)
    return ScanOut(series=report.series, findings=report.findings, created=report.created)
