"""Typed FastAPI dependencies: ``DbDep``, ``SettingsDep``, ``WorkerCallDep``, ``AdminDep`` (an admin
token), ``EnrollDep`` (an admin or enroll token) and ``DashboardDep`` (public when
``settings.dashboard_public``, else an admin or read token); ``ActorDep`` is ``AdminDep`` that also
says who the token is (``admin``, or ``token ID (NAME)``), for changes kept with their author.

No dependency holds a database session across the request. FastAPI runs each sync dependency, the
sync route body and the route's response validation on separate threadpool threads; a session
opened by a ``yield`` dependency kept its connection checked out while the request waited for the
next thread, and about 60 concurrent requests then held every connection while all 40 threads
waited for one (a deadlock until the pool timeout). So a route gets the session factory
(``DbDep``) and opens and closes its session inside its own body, and a worker's token is checked in
that same unit of work (``WorkerCallDep``: ``with call.transaction() as (session, worker): ...``).

Tokens arrive as ``Authorization: Bearer <token>``, read through FastAPI's ``HTTPBearer`` (so the
OpenAPI schema declares the scheme); a missing or non-bearer header reaches the authenticators as
``None``, which answer with their own 401 messages.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.auth import (
    ADMIN_ACTOR,
    ADMIN_ONLY,
    ENROLLERS,
    READERS,
    WorkerCall,
    authorize,
    identify,
    is_admin_token,
    seen_every,
)
from kernelfleet.service.models import TokenScope
from kernelfleet.service.settings import Settings

ADMIN_COOKIE = "kernelfleet_admin"

# the dependencies are `async def` (they do no I/O): a sync one would cost a threadpool hop each


async def get_settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def get_session_factory(request: Request) -> sessionmaker[Session]:
    factory: sessionmaker[Session] = request.app.state.session_factory
    return factory


SettingsDep = Annotated[Settings, Depends(get_settings)]
# the unit of work: `with db() as session:` (or `with db() as session, immediate(session):` to write)
DbDep = Annotated[sessionmaker[Session], Depends(get_session_factory)]

BEARER = "the admin token, an API token (scope admin, read or enroll) or a worker's token"
bearer_scheme = HTTPBearer(auto_error=False, description=BEARER)
BearerDep = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)]


def _token(credentials: HTTPAuthorizationCredentials | None) -> str | None:
    return credentials.credentials if credentials is not None else None


async def worker_call(credentials: BearerDep, db: DbDep, settings: SettingsDep) -> WorkerCall:
    return WorkerCall(db, _token(credentials), seen_every(settings.worker_offline_after_seconds))


async def require_admin(credentials: BearerDep, db: DbDep, settings: SettingsDep) -> None:
    await _authorize(db, _token(credentials), settings.admin_token, ADMIN_ONLY)


async def admin_actor(credentials: BearerDep, db: DbDep, settings: SettingsDep) -> str:
    """An admin route that records who called it: ``admin`` (the settings' token) or ``token ID
    (NAME)`` (an API token of scope admin)."""
    token = _token(credentials)
    if token is not None and is_admin_token(token, settings.admin_token):
        return ADMIN_ACTOR
    return (await run_in_threadpool(identify, db, token, settings.admin_token, ADMIN_ONLY))[1]


async def require_enroll(credentials: BearerDep, db: DbDep, settings: SettingsDep) -> None:
    """Minting enrollment tokens: an admin token or an ``enroll`` one."""
    await _authorize(db, _token(credentials), settings.admin_token, ENROLLERS)


def request_token(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """A browser's token: the bearer header, else the dashboard's login cookie."""
    return _token(credentials) or request.cookies.get(ADMIN_COOKIE)


async def require_dashboard(request: Request, credentials: BearerDep, db: DbDep,
                            settings: SettingsDep) -> None:
    """Dashboard pages and their JSON: open when ``dashboard_public``; otherwise an admin or read
    token, as a bearer header or in the ``kernelfleet_admin`` cookie."""
    if settings.dashboard_public:
        return
    await _authorize(db, request_token(request, credentials), settings.admin_token, READERS)


async def _authorize(db: sessionmaker[Session], token: str | None, admin_token: str | None,
                     allowed: frozenset[TokenScope]) -> TokenScope:
    """The admin token is checked on the event loop; any other token is looked up on a thread of its
    own, in a session of its own."""
    if token is not None and is_admin_token(token, admin_token):
        return TokenScope.admin
    return await run_in_threadpool(authorize, db, token, admin_token, allowed)


WorkerCallDep = Annotated[WorkerCall, Depends(worker_call)]
AdminDep = Annotated[None, Depends(require_admin)]
ActorDep = Annotated[str, Depends(admin_actor)]  # an admin token, and who it is
EnrollDep = Annotated[None, Depends(require_enroll)]
DashboardDep = Annotated[None, Depends(require_dashboard)]
