"""Authenticate before reading the body: an ASGI middleware that answers 401 to a request with a
body (POST, PUT, PATCH, DELETE) on a route that needs a token, when the token is missing or known
to no table, before the body is received, parsed or validated.

FastAPI reads and parses a route's body before it runs the route's dependencies, and a worker's
token is checked inside the route's own transaction (:class:`kernelfleet.service.auth.WorkerCall`),
so without this an unauthenticated 3.7 MB result post was read and validated (36-46 ms) to answer
422, and 401 only for a valid body.

What a route needs comes from its own dependencies (:data:`KINDS`): a worker token
(``WorkerCallDep``), or an admin, enroll or read scope (``AdminDep``, ``EnrollDep``). This check
only refuses tokens that cannot be valid; revoked tokens, scopes and the worker's own checks stay
with the route, which answers as before. A token that was found is remembered for
:data:`KNOWN_SECONDS`, so that a worker's heartbeats cost no extra query; one that is not remembered
is looked up in one Core statement over both tables (:data:`_KNOWN`), in autocommit on PostgreSQL: one
round trip, no ORM session.

Measured (issue 33's 20,000-worker row, py-spy on ``serve --workers 2``): with a 60 s memory every
heartbeat of a fleet on 300 s leases (one every 60-100 s, a third of the lease less its jitter) came
after its token was forgotten, and the lookup, then an ORM session loading the worker's row in a
transaction of its own, took 11 % of the server processes' samples, 2.7 times the heartbeat route's
own.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from sqlalchemy import BindParameter, bindparam, select, union_all
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Receive, Scope, Send

from kernelfleet.service.asgi import HttpMiddleware
from kernelfleet.service.auth import (
    ADMIN_ONLY,
    ENROLLERS,
    digest,
    is_admin_token,
    token_refusal,
)
from kernelfleet.service.db import is_sqlite
from kernelfleet.service.deps import require_admin, require_enroll, worker_call
from kernelfleet.service.models import ApiToken, TokenScope, Worker
from kernelfleet.service.openapi import dependency_calls
from kernelfleet.service.routes import routes_at
from kernelfleet.service.settings import Settings

BODY_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
# a token found in the database passes this check without a query this long: longer than any worker's
# gap between requests (heartbeats every lease/3 at most, idle polls every few seconds). It decides
# only where a token that is no longer valid is refused (here or by the route: workers and API tokens
# are revoked, not deleted, and the route checks that), not whether it is
KNOWN_SECONDS = 3600.0
KNOWN_MAX = 65536  # tokens remembered at most (then the memory starts afresh)
# what a route needs: the scopes of an API token, or (None) a worker's token
Needs = frozenset[TokenScope] | None
# the dependency that says what a route needs -> what it needs
KINDS: dict[Callable[..., Any], Needs] = {worker_call: None, require_admin: ADMIN_ONLY,
                                          require_enroll: ENROLLERS}


def route_needs(route: APIRoute) -> tuple[Needs] | None:
    """What token ``route`` needs (:data:`KINDS`), or None for a route open to everyone."""
    calls = set(dependency_calls(route.dependant))
    return next(((needs,) for call, needs in KINDS.items() if call in calls), None)


_WANTED: BindParameter[str] = bindparam("wanted")
# the digests equal to :wanted among workers' and API tokens' (at most one each): built once
_KNOWN = union_all(select(Worker.token_digest).where(Worker.token_digest == _WANTED),
                   select(ApiToken.token_digest).where(ApiToken.token_digest == _WANTED))


def _known(factory: sessionmaker[Session], token: str) -> bool:
    """Whether ``token`` is a worker's or an API token's (the routes check its scope and state): one
    statement, compared in constant time as :func:`~kernelfleet.service.auth.by_digest` does."""
    wanted = digest(token)
    engine = factory.kw["bind"]
    options = {} if is_sqlite(engine) else {"isolation_level": "AUTOCOMMIT"}
    with engine.connect().execution_options(**options) as conn:
        found = conn.execute(_KNOWN, {"wanted": wanted}).scalars().all()
    return any(hmac.compare_digest(row, wanted) for row in found)


class AuthFirstMiddleware(HttpMiddleware):
    """401 before the body, for body-carrying requests to routes that need a token."""

    def __init__(self, app: ASGIApp, fastapi_app: Callable[[], FastAPI], factory: sessionmaker[Session],
                 settings: Settings) -> None:
        super().__init__(app)
        self._fastapi_app = fastapi_app
        self._factory = factory
        self._settings = settings  # its admin token may be set after the app is built (serve)
        self._needs: dict[tuple[str, str], tuple[Needs] | None] = {}  # (method, route template) -> needs
        self._known: dict[str, float] = {}

    def _route_needs(self, scope: Scope) -> tuple[Needs] | None:
        method = scope["method"]
        for template in routes_at(self._fastapi_app(), scope["path"]):
            if method in template.methods and isinstance(template.route, APIRoute):
                key = (method, template.pattern)
                if key not in self._needs:
                    self._needs[key] = route_needs(template.route)
                return self._needs[key]
        return None

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] in BODY_METHODS and (route := self._route_needs(scope)) is not None:
            refusal = await self._refusal(scope, route[0])
            if refusal is not None:
                response = JSONResponse({"detail": refusal}, status_code=401,
                                        headers={"WWW-Authenticate": "Bearer"})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)

    async def _refusal(self, scope: Scope, needs: Needs) -> str | None:
        """Why the request cannot be authenticated, or None when its token may be valid."""
        header = next((v for k, v in scope["headers"] if k == b"authorization"), b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return token_refusal(True, needs)
        if needs is not None and is_admin_token(token, self._settings.admin_token):
            return None
        wanted = digest(token)
        now = time.monotonic()
        if self._known.get(wanted, 0.0) > now:
            return None
        if not await anyio.to_thread.run_sync(_known, self._factory, token):
            return token_refusal(False, needs)
        if len(self._known) >= KNOWN_MAX:
            self._known.clear()
        self._known[wanted] = now + KNOWN_SECONDS
        return None
