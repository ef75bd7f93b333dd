"""Profiles page (``/profiles``): which chips have profiles, how fresh they are, which chips have
results but no profile yet, and the exact ``kernelfleet pull`` command for each."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Profile, Result
from kernelfleet.service.profiles import counts
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router

router = page_router()

MAX_PROFILES = 200


@dataclass
class ProfileRow:
    chip: str
    mlx_version: str | None
    version: int
    versions: int
    etag: str
    created_at: datetime
    entries: int
    measured: int
    predicted: int  # predicted entries with a predicted config
    fallback: int  # predicted entries that fell back to the built-in
    runs_since: int


def _latest_profiles(session: Session) -> list[ProfileRow]:
    rn = (
        func.row_number()
        .over(partition_by=(Profile.chip, Profile.mlx_version), order_by=Profile.version.desc())
        .label("rn")
    )
    n = func.count().over(partition_by=(Profile.chip, Profile.mlx_version)).label("n")
    sub = select(
        Profile.id,
        Profile.chip,
        Profile.mlx_version,
        Profile.version,
        Profile.etag,
        Profile.created_at,
        rn,
        n,
    ).subquery()
    rows = session.execute(
        select(sub).where(sub.c.rn == 1).order_by(sub.c.chip, sub.c.mlx_version).limit(MAX_PROFILES)
    ).all()
    bodies: dict[int, Any] = (
        dict(
            session.execute(select(Profile.id, Profile.body).where(Profile.id.in_([r.id for r in rows])))
            .all()
        )
        if rows
        else {}
    )
    out = []
    for r in rows:
        body = bodies.get(r.id) or {}
        entries = body.get("entries") or []
        n = counts(body)
        since = (
            session.scalar(
                select(func.count())
                .select_from(Result)
                .where(Result.chip == r.chip, Result.created_at > r.created_at)
            )
            or 0
        )
        out.append(
            ProfileRow(
                r.chip,
                r.mlx_version,
                int(r.version),
                int(r.n),
                r.etag,
                r.created_at,
                len(entries),
                n["measured"],
                n["predicted"],
                n["fallback"],
                int(since),
            )
        )
    return out


@router.get("/profiles", response_class=HTMLResponse)
def profiles(request: Request, db: DbDep) -> HTMLResponse:
    with db() as session:
        rows = _latest_profiles(session)
        with_profile = {r.chip for r in rows}
        chips = session.execute(
            select(Result.chip, func.count().label("runs"), func.max(Result.created_at).label("last"))
            .group_by(Result.chip)
            .order_by(Result.chip)
        ).all()
        missing = [c for c in chips if c.chip not in with_profile]
        return page(
            request,
            "profiles.html",
            title="Profiles",
            rows=rows,
            missing=missing,
            now=db_clock(session),
        )
