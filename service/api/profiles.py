"""Profiles: ``GET /profiles`` (the chips with profiles) and ``GET /profiles/{chip}`` (one chip's
newest complete profile in the kernels/profile_file.py format, with an ETag; ``If-None-Match`` ->
304). Public-read per settings, like the dashboard.

Reads never build: profiles are built in the background (:mod:`kernelfleet.service.profile_builder`)
within seconds of new results. A chip with results but no profile yet answers 202 with
``Retry-After`` (and queues a build). A chip with no measured results answers 404 naming the
closest chips that have data, unless ``allow_predicted=true``: then a profile of predicted entries
only (each marked, with its calibrated confidence) is built for it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.chips import backend_of, lookup
from kernelfleet.service import aggregates, chips
from kernelfleet.service.db import immediate, stored_utc
from kernelfleet.service.deps import DashboardDep, DbDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import ConfigStat, Profile, ProfileRequest
from kernelfleet.service.profiles import counts, latest
from kernelfleet.service.schemas import UtcTime

router = APIRouter(tags=["profiles"])
RETRY_AFTER_SECONDS = 2


class ProfileSummary(BaseModel):
    chip: str
    backend: str | None
    mlx_version: str | None
    version: int
    etag: str
    created_at: UtcTime
    entries: int
    measured: int
    predicted: int  # predicted entries that use a predicted config
    fallback: int  # predicted entries that fell back to the built-in (low confidence or no gain)
    stale: bool  # results arrived that the next build (seconds away) will include
    pull_command: str


class ProfilePending(BaseModel):
    detail: str


def _etag_matches(header: str | None, etag: str) -> bool:
    if not header:
        return False
    tags = [t.strip().removeprefix("W/").strip('"') for t in header.split(",")]
    return "*" in tags or etag in tags


# a stored profile version never changes (a rebuild adds a row): its counts are read from its body
# once per process and kept here, so listing profiles loads only the bodies of versions it has not
# seen (it loaded every body, 150 ms a call, and 200 readers stalled every worker: issue 33)
SUMMARY_MEMO = 4096


@router.get("/profiles")
def list_profiles(request: Request, _: DashboardDep, db: DbDep) -> list[ProfileSummary]:
    """The newest version of every stored profile, with its measured/predicted counts; ``stale``
    when results arrived since it was built (the background builder is about to rebuild it)."""
    memo: dict[int, tuple[str | None, int, dict[str, int]]] = getattr(request.app.state, "profile_counts", {})
    request.app.state.profile_counts = memo
    with db() as session:
        newest = select(func.max(Profile.id)).group_by(Profile.chip, Profile.mlx_version)
        rows = session.execute(
            select(Profile.id, Profile.chip, Profile.mlx_version, Profile.version, Profile.etag,
                   Profile.created_at).where(Profile.id.in_(newest)).order_by(Profile.chip)).all()
        known = {r.id: v for r in rows if (v := memo.get(r.id)) is not None}  # threads share the memo
        unseen = [r.id for r in rows if r.id not in known]
        for start in range(0, len(unseen), 500):
            for row_id, body in session.execute(select(Profile.id, Profile.body)
                                                .where(Profile.id.in_(unseen[start:start + 500]))):
                known[row_id] = (body.get("backend"), len(body.get("entries", [])), counts(body))
        pending = set(session.scalars(select(ProfileRequest.chip).distinct()))
    if len(memo) + len(unseen) > SUMMARY_MEMO:
        memo.clear()
    memo.update({row_id: known[row_id] for row_id in unseen})
    out = []
    for row in rows:
        backend, entries, n = known[row.id]
        command = f'kernelfleet pull --chip "{row.chip}"' + (
            f" --mlx-version {row.mlx_version}" if row.mlx_version else ""
        )
        if n["measured"] == 0:
            command += " --allow-predicted"
        out.append(ProfileSummary(
            chip=row.chip, backend=backend, mlx_version=row.mlx_version, version=row.version, etag=row.etag,
            created_at=row.created_at, entries=entries, **n, stale=row.chip in pending, pull_command=command,
        ))
    return out


def _no_data(session: Session, chip: str, mlx_version: str | None) -> NotFound:
    have = aggregates.chips_with_data(session)
    backend = backend_of(chip)
    same = [c for c, b in have.items() if b == backend and c != chip] if backend else []
    near = chips.closest(chip, same)
    where = f" with MLX {mlx_version}" if mlx_version else ""
    hint = (f"; the closest chips with data: {', '.join(repr(c) for c in near)}. Predicted entries from them "
            f"are available with allow_predicted=true (`kernelfleet pull --allow-predicted`)") if near else (
        "; no chip of the same backend has data either")
    return NotFound(f"no measured results for chip {chip!r}{where}: run a tuning campaign for it "
                    f"(kernelfleet admin campaign create --chip ...){hint}")


WHERE_TO_RUN = {"metal": "run a campaign on a Mac", "cuda": "run a campaign on an NVIDIA GPU host"}


def _check_predictable(session: Session, chip: str, mlx_version: str | None) -> None:
    """Before queueing a predicted-only build: some other chip of ``chip``'s backend (GPU only) has
    results, and no single MLX version is asked for (the builder makes per-version profiles only of a
    chip's own versions); else 404 saying what is missing. A build with nothing to predict from would
    store nothing, and every poll would queue it again."""
    backend = backend_of(chip)
    if backend not in WHERE_TO_RUN:
        raise NotFound(f"nothing to predict {chip!r} from: predictions are made for GPU chips only, from "
                       f"other chips of the same backend")
    if not session.scalar(select(func.count()).where(ConfigStat.backend == backend)):
        raise NotFound(f"nothing to predict {chip!r} from: no {backend} chip has results: "
                       f"{WHERE_TO_RUN[backend]}")
    if mlx_version is not None:  # the builder makes a chip's per-version profiles from its own results only
        raise NotFound(f"chip {chip!r} has no results with MLX {mlx_version}; its predicted-only profile is "
                       f"made from every MLX version's results of other chips: ask without mlx_version "
                       f"(drop --mlx-version)")


def _queue(session: Session, chip: str, allow_predicted: bool) -> JSONResponse:
    session.rollback()
    with immediate(session):
        waiting = session.scalar(select(func.count()).where(
            ProfileRequest.chip == chip, ProfileRequest.allow_predicted == allow_predicted))
        if not waiting:
            session.add(ProfileRequest(chip=chip, allow_predicted=allow_predicted))
    return JSONResponse(
        {"detail": f"the profile of {chip!r} is being built; retry in a few seconds"},
        status_code=202, headers={"Retry-After": str(RETRY_AFTER_SECONDS)},
    )


@router.get("/profiles/{chip}", response_model=None,
            responses={202: {"model": ProfilePending, "description": "being built: retry after Retry-After"},
                       304: {"description": "the If-None-Match ETag is current"}})
def get_profile(
    chip: str,
    request: Request,
    _: DashboardDep,
    db: DbDep,
    mlx_version: Annotated[
        str | None, Query(max_length=64, description="only results from this MLX version")
    ] = None,
    allow_predicted: Annotated[bool, Query(
        description="for a chip with no measured results: a profile of predicted entries only")] = False,
) -> Response:
    """The chip's newest complete profile, with ``ETag``; 304 when the client's ``If-None-Match``
    names it; 202 while its first version is being built; 404 when the chip has no measured results
    (unless ``allow_predicted``)."""
    with db() as session:
        mlx_version = mlx_version or None
        row = latest(session, chip, mlx_version)
        measured = row is not None and counts(row.body)["measured"] > 0
        if row is None or (not measured and not allow_predicted):
            query = select(func.count()).where(ConfigStat.chip == chip)
            if mlx_version is not None:
                query = query.where(ConfigStat.mlx_version == mlx_version)
            if session.scalar(query):
                return _queue(session, chip, False)
            if not allow_predicted:
                raise _no_data(session, chip, mlx_version)
            if row is None:
                if lookup(chip) is None:  # bounded: only the chip table's names get such profiles
                    raise NotFound(f"chip {chip!r} is not in the chip table (kernelfleet/chips.py) and has "
                                   f"no results: nothing to predict it from")
                _check_predictable(session, chip, mlx_version)
                return _queue(session, chip, True)
        assert row is not None
        headers = {"ETag": f'"{row.etag}"', "Cache-Control": "no-cache"}
        if _etag_matches(request.headers.get("if-none-match"), row.etag):
            return Response(status_code=304, headers=headers)
        body: dict[str, Any] = dict(row.body)
        body["created_at"] = _iso(row.created_at)
        return JSONResponse(body, headers=headers)


def _iso(value: datetime) -> str:
    return stored_utc(value).isoformat()
