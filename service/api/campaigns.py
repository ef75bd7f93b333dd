"""Campaigns (admin): create (with warnings when no worker can run it), list, show with progress
counts, cancel, delete and retry."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from kernelfleet.service import campaign_control
from kernelfleet.service.campaign_control import ControlOut
from kernelfleet.service.campaigns import create_campaign, get_campaign, list_campaigns, target_warnings
from kernelfleet.service.deps import AdminDep, DbDep, SettingsDep
from kernelfleet.service.models import Backend
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.params import Offset, RowId
from kernelfleet.service.schemas import CampaignIn, CampaignOut

router = APIRouter(tags=["campaigns"])


@router.post("/campaigns", status_code=status.HTTP_201_CREATED)
def create(body: CampaignIn, _: AdminDep, db: DbDep, settings: SettingsDep) -> CampaignOut:
    """Queue one job per kernel x shape x dtype. ``warnings`` says when no enrolled worker matches the
    target backend and chip (the jobs then wait), or none of those that do was seen lately."""
    with db() as session:
        campaign_id = create_campaign(session, body, settings.max_attempts)
        out = get_campaign(session, campaign_id)
        backend = Backend(body.target_backend) if body.target_backend else None
        out.warnings = target_warnings(session, backend, body.target_chip,
                                       settings.worker_offline_after_seconds)
        return out


@router.get("/campaigns")
def index(_: AdminDep, db: DbDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
          offset: Offset = 0) -> list[CampaignOut]:
    with db() as session:
        return list_campaigns(session, limit, offset)


@router.get("/campaigns/{campaign_id}")
def show(campaign_id: RowId, _: AdminDep, db: DbDep) -> CampaignOut:
    with db() as session:
        return get_campaign(session, campaign_id)


@router.post("/campaigns/{campaign_id}/cancel")
def cancel(campaign_id: RowId, _: AdminDep, db: DbDep) -> ControlOut:
    """Cancel its queued jobs; leased ones run to the end and keep their results. Idempotent."""
    with db() as session:
        return campaign_control.cancel(session, campaign_id)


@router.delete("/campaigns/{campaign_id}")
def delete(campaign_id: RowId, _: AdminDep, db: DbDep) -> ControlOut:
    """Cancel and hide it; its row (and jobs) go once no job of it is leased. Results are kept."""
    with db() as session:
        return campaign_control.delete(session, campaign_id)


@router.post("/campaigns/{campaign_id}/retry", responses=error_responses(409))
def retry(campaign_id: RowId, _: AdminDep, db: DbDep) -> ControlOut:
    """Requeue its dead jobs (attempts reset) and queue again the runs that had no successful trial."""
    with db() as session:
        return campaign_control.retry(session, campaign_id)
