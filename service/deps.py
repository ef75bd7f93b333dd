"""Typed FastAPI dependencies: ``SessionDep``, ``SettingsDep``, ``WorkerDep``, ``AdminDep`` and
``DashboardDep`` (public when ``settings.dashboard_public``, else the admin token)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.auth import authenticate_admin, authenticate_worker, bearer_token
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


def require_worker(request: Request, session: SessionDep) -> Worker:
    return authenticate_worker(session, bearer_token(request.headers.get("authorization")))


def require_admin(request: Request, session: SessionDep, settings: SettingsDep) -> None:
    authenticate_admin(session, bearer_token(request.headers.get("authorization")), settings.admin_token)


def require_dashboard(request: Request, session: SessionDep, settings: SettingsDep) -> None:
    """Dashboard pages: open when ``dashboard_public``; otherwise the admin token, as a bearer header
    or in the ``kernelfleet_admin`` cookie."""
    if settings.dashboard_public:
        return
    token = bearer_token(request.headers.get("authorization")) or request.cookies.get(ADMIN_COOKIE)
    authenticate_admin(session, token, settings.admin_token)


WorkerDep = Annotated[Worker, Depends(require_worker)]
AdminDep = Annotated[None, Depends(require_admin)]
DashboardDep = Annotated[None, Depends(require_dashboard)]
