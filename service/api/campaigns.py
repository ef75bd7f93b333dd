"""Campaigns (admin): create, list, show with progress counts."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from kernelfleet.service.campaigns import create_campaign, get_campaign, list_campaigns
from kernelfleet.service.deps import AdminDep, DbDep, SettingsDep
from kernelfleet.service.params import Offset, RowId
from kernelfleet.service.schemas import CampaignIn, CampaignOut

router = APIRouter(tags=["campaigns"])


@router.post("/campaigns", status_code=status.HTTP_201_CREATED)
def create(body: CampaignIn, _: AdminDep, db: DbDep, settings: SettingsDep) -> CampaignOut:
    with db() as session:
        campaign_id = create_campaign(session, body, settings.max_attempts)
        return get_campaign(session, campaign_id)


@router.get("/campaigns")
def index(_: AdminDep, db: DbDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
          offset: Offset = 0) -> list[CampaignOut]:
    with db() as session:
        return list_campaigns(session, limit, offset)


@router.get("/campaigns/{campaign_id}")
def show(campaign_id: RowId, _: AdminDep, db: DbDep) -> CampaignOut:
    with db() as session:
        return get_campaign(session, campaign_id)
