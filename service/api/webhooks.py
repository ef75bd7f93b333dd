"""Webhook alerts (admin): ``GET /webhooks/deliveries``: each alert to each URL, with every attempt
(when, the receiver's status code or the error, how long it took)."""

from __future__ import annotations

from collections import defaultdict
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from pydantic import BaseModel, ConfigDict
from sqlalchemy import select

from kernelfleet.service.deps import AdminDep, DbDep
from kernelfleet.service.models import DeliveryState, WebhookAttempt, WebhookDelivery
from kernelfleet.service.params import Offset, OptRowId
from kernelfleet.service.schemas import OptUtcTime, UtcTime

router = APIRouter(tags=["webhooks"])


class AttemptOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    attempted_at: UtcTime
    status_code: int | None
    error: str | None
    duration_ms: float


class DeliveryOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    id: int
    regression_id: int | None
    url: str
    state: str  # pending, delivered or failed
    attempts: int
    next_attempt_at: UtcTime
    created_at: UtcTime
    delivered_at: OptUtcTime
    payload: dict[str, Any]
    attempt_log: list[AttemptOut] = []


@router.get("/webhooks/deliveries")
def list_deliveries(
    _: AdminDep,
    db: DbDep,
    regression_id: OptRowId = None,
    state: Literal["pending", "delivered", "failed"] | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Offset = 0,
) -> list[DeliveryOut]:
    """Newest first, each with its attempts (oldest first)."""
    with db() as session:
        query = select(WebhookDelivery)
        if regression_id is not None:
            query = query.where(WebhookDelivery.regression_id == regression_id)
        if state is not None:
            query = query.where(WebhookDelivery.state == DeliveryState(state))
        rows = session.scalars(query.order_by(WebhookDelivery.id.desc()).limit(limit).offset(offset)).all()
        attempts: dict[int, list[AttemptOut]] = defaultdict(list)
        if rows:
            for a in session.scalars(select(WebhookAttempt).where(
                    WebhookAttempt.delivery_id.in_([r.id for r in rows])).order_by(WebhookAttempt.id)):
                attempts[a.delivery_id].append(AttemptOut.model_validate(a))
        out = []
        for r in rows:
            item = DeliveryOut.model_validate(r)
            item.attempt_log = attempts[r.id]
            out.append(item)
        return out
