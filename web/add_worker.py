"""Add a worker (``/workers/add?gpus=N``): the commands that install KernelFleet on a new Mac or Linux
GPU host and enroll it (:mod:`kernelfleet.service.add_worker`). Signed in with an admin or enroll token
(the login cookie or a bearer header), the page mints a fresh enrollment token for N workers and puts
it in the commands; otherwise it shows them with TOKEN and how to get one. Never cached."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse

from kernelfleet.service import add_worker
from kernelfleet.service.auth import ENROLLERS, token_scope
from kernelfleet.service.deps import BearerDep, DbDep, SettingsDep, request_token
from kernelfleet.service.schemas import MAX_TOKEN_USES
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.render import page
from kernelfleet.web.routing import HtmlErrorRoute

router = APIRouter(route_class=HtmlErrorRoute, include_in_schema=False)


@router.get("/workers/add", response_class=HTMLResponse)
def add_worker_page(request: Request, credentials: BearerDep, db: DbDep, settings: SettingsDep,
                    gpus: Annotated[int, Query(ge=1, le=MAX_TOKEN_USES)] = 1) -> HTMLResponse:
    allowed = token_scope(db, request_token(request, credentials), settings.admin_token) in ENROLLERS
    try:
        got = add_worker.mint(db, settings, gpus) if allowed else add_worker.instructions(settings, None,
                                                                                           uses=gpus)
    except add_worker.WheelUnavailable as e:
        raise PageNotFound(f"This coordinator has no wheel to serve: {e}") from None
    response = page(request, "add_worker.html", title="Add a worker", got=got, gpus=gpus)
    response.headers["Cache-Control"] = "no-store"
    return response
