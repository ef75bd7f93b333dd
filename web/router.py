"""The dashboard router: every page, the static files, login, and errors rendered as HTML pages.

The coordinator app includes :data:`router`. Errors raised by a page (unknown ids, bad filters,
missing auth) are turned into friendly HTML pages by :class:`HtmlErrorRoute`, so nothing here
needs app-wide exception handlers.
"""

from __future__ import annotations

from fastapi import APIRouter, Form, Request, Response
from fastapi.responses import HTMLResponse, RedirectResponse

from kernelfleet.service.auth import token_scope
from kernelfleet.service.deps import ADMIN_COOKIE, DbDep, SettingsDep
from kernelfleet.web import (
    add_worker,
    campaigns,
    chip,
    chips,
    compare,
    fleet,
    kernel,
    profiles,
    regressions,
    runs,
)
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.render import page
from kernelfleet.web.routing import HtmlErrorRoute
from kernelfleet.web.static_files import static_response

router = APIRouter(route_class=HtmlErrorRoute, include_in_schema=False)


@router.get("/static/{name}")
def static(request: Request, name: str) -> Response:
    response = static_response(request, name)
    if response is None:
        raise PageNotFound(f"no static file {name!r}")
    return response


@router.get("/login", response_class=HTMLResponse)
def login_form(request: Request, next: str = "/") -> HTMLResponse:
    return page(request, "login.html", title="Sign in", next=next if next.startswith("/") else "/")


@router.post("/login", response_model=None)
def login(
    request: Request,
    settings: SettingsDep,
    db: DbDep,
    token: str = Form(max_length=512),
    next: str = Form("/", max_length=1000),
) -> Response:
    if token_scope(db, token.strip(), settings.admin_token) is None:
        return page(
            request,
            "login.html",
            status_code=401,
            title="Sign in",
            next=next,
            error="That is not the coordinator's admin token, nor an API token it knows (or it was revoked).",
        )
    target = next if next.startswith("/") and not next.startswith("//") else "/"
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(
        ADMIN_COOKIE, token.strip(), httponly=True, samesite="strict",
        secure=request.url.scheme == "https" or settings.resolved_public_url.startswith("https:"),
    )
    return response


@router.post("/logout", response_model=None)
def logout() -> Response:
    response = RedirectResponse("/", status_code=303)
    response.delete_cookie(ADMIN_COOKIE)
    return response


for _module in (add_worker, fleet, chips, chip, kernel, compare, regressions, campaigns, profiles, runs):
    router.include_router(_module.router)
