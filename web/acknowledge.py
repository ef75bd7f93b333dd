"""``POST /regressions/{id}/acknowledge`` (admin token in the ``Authorization`` header): the
dashboard's acknowledge action. JSON in and out; errors are the coordinator's JSON errors.

Only this write lives in the dashboard, because no regressions API existed when it was built;
the dashboard form posts here."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.deps import AdminDep, SessionDep
from kernelfleet.service.errors import Conflict, NotFound
from kernelfleet.service.models import Regression, RegressionStatus
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import update

router = APIRouter(include_in_schema=False)


class AcknowledgeIn(BaseModel):
    model_config = ConfigDict(extra="forbid")
    note: Annotated[str, Field(max_length=2000)] | None = None


class AcknowledgeOut(BaseModel):
    id: int
    status: str
    acknowledged_at: datetime | None
    acknowledged_note: str | None


@router.post("/regressions/{regression_id}/acknowledge")
def acknowledge(regression_id: int, body: AcknowledgeIn, _: AdminDep, session: SessionDep) -> AcknowledgeOut:
    with immediate(session):
        reg = session.get(Regression, regression_id)
        if reg is None:
            raise NotFound(f"no regression with id {regression_id}")
        if reg.status not in (RegressionStatus.open, RegressionStatus.confirming):
            raise Conflict(
                f"regression {regression_id} is {reg.status.value}; only open or confirming ones "
                "can be acknowledged"
            )
        session.execute(
            update(Regression)
            .where(Regression.id == regression_id)
            .values(
                status=RegressionStatus.acknowledged,
                acknowledged_at=db_now(),
                acknowledged_note=body.note or None,
            )
        )
    session.refresh(reg)
    return AcknowledgeOut(
        id=reg.id,
        status=reg.status.value,
        acknowledged_at=reg.acknowledged_at,
        acknowledged_note=reg.acknowledged_note,
    )
