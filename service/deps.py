"""Typed FastAPI dependencies: ``SessionDep``, ``SettingsDep``, ``WorkerDep``, ``AdminDep`` and
``DashboardDep`` (public when ``settings.dashboard_public``, else the admin token).

Tokens arrive as ``Authorization: Bearer <token>``, read through FastAPI's ``HTTPBearer`` (so the
OpenAPI schema declares the scheme); a missing or non-bearer header reaches the authenticators as
``None``, which answer with their own 401 messages."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.auth import authenticate_admin, authenticate_worker
from kernelfleet.service.models import Worker
from kernelfleet.service.settings import Settings

ADMIN_COOKIE = "kernelfleet_admin"


def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


def get_session_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


def get_session(request: Request) -> Iterator[Session]:
    with get_session_factory(request)() as session:
        yield session


SettingsDep = Annotated[Settings, Depends(get_settings)]
SessionFactoryDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]
SessionDep = Annotated[Session, Depends(get_session)]


bearer_scheme = HTTPBearer(auto_error=False, description="the admin token or a worker's token")
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


def require_worker(credentials: BearerDep, session: SessionDep) -> Worker:
    return authenticate_worker(session, _token(credentials))


def require_admin(credentials: BearerDep, session: SessionDep, settings: SettingsDep) -> None:
    authenticate_admin(session, _token(credentials), settings.admin_token)


def require_dashboard(request: Request, credentials: BearerDep, session: SessionDep,
                      settings: SettingsDep) -> None:
    """Dashboard pages: open when ``dashboard_public``; otherwise the admin token, as a bearer header
    or in the ``kernelfleet_admin`` cookie."""
    if settings.dashboard_public:
        return
    token = _token(credentials) or request.cookies.get(ADMIN_COOKIE)
    authenticate_admin(session, token, settings.admin_token)


WorkerDep = Annotated[Worker, Depends(require_worker)]
AdminDep = Annotated[None, Depends(require_admin)]
DashboardDep = Annotated[None, Depends(require_dashboard)]
