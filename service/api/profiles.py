"""Profiles: ``GET /profiles`` (the chips with profiles) and ``GET /profiles/{chip}`` (one chip's
profile in the kernels/profile_file.py format, with an ETag; ``If-None-Match`` -> 304).
Public-read per settings, like the dashboard."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import func, select

from kernelfleet.service.deps import DashboardDep, SessionDep
from kernelfleet.service.models import Profile
from kernelfleet.service.profiles import current_profile, fingerprint
from kernelfleet.service.schemas import UtcTime

router = APIRouter(tags=["profiles"])


class ProfileSummary(BaseModel):
    chip: str
    mlx_version: str | None
    version: int
    etag: str
    created_at: UtcTime
    entries: int
    predicted: int
    stale: bool
    pull_command: str


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip().removeprefix("W/").strip('"') for t in header.split(",")]
    return "*" in tags or etag in tags


@router.get("/profiles")
def list_profiles(_: DashboardDep, session: SessionDep) -> list[ProfileSummary]:
    """The newest version of every stored profile; ``stale`` when results arrived since it was built
    (the next ``GET /profiles/{chip}`` rebuilds it)."""
    newest = select(func.max(Profile.id)).group_by(Profile.chip, Profile.mlx_version)
    rows = session.scalars(select(Profile).where(Profile.id.in_(newest)).order_by(Profile.chip)).all()
    sources: dict[str | None, dict[str, int]] = {}
    out = []
    for row in rows:
        if row.mlx_version not in sources:
            sources[row.mlx_version] = fingerprint(session, row.mlx_version)
        entries = row.body.get("entries", [])
        command = f'kernelfleet pull --chip "{row.chip}"' + (
            f" --mlx-version {row.mlx_version}" if row.mlx_version else ""
        )
        out.append(
            ProfileSummary(
                chip=row.chip,
                mlx_version=row.mlx_version,
                version=row.version,
                etag=row.etag,
                created_at=row.created_at,
                entries=len(entries),
                predicted=sum(1 for e in entries if e.get("predicted")),
                stale=row.body.get("source") != sources[row.mlx_version],
                pull_command=command,
            )
        )
    return out


@router.get("/profiles/{chip}", response_model=None,
            responses={304: {"description": "the If-None-Match ETag is current"}})
def get_profile(
    chip: str,
    request: Request,
    _: DashboardDep,
    session: SessionDep,
    mlx_version: Annotated[
        str | None, Query(max_length=64, description="only results from this MLX version")
    ] = None,
) -> Response:
    """The chip's profile (rebuilt first when results arrived since), with ``ETag``; 304 when the
    client's ``If-None-Match`` names the current version."""
    row = current_profile(session, chip, mlx_version or None)
    headers = {"ETag": f'"{row.etag}"', "Cache-Control": "no-cache"}
    if _etag_matches(request.headers.get("if-none-match"), row.etag):
        return Response(status_code=304, headers=headers)
    body: dict[str, Any] = dict(row.body)
    body.pop("source", None)
    body["created_at"] = _iso(row.created_at)
    return JSONResponse(body, headers=headers)


def _iso(value: datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return str(value.isoformat())
