"""A heartbeat's common case answered before FastAPI's routing and dependency solving.

``POST /api/v1/jobs/{job_id}/heartbeat`` is what a fleet of long tunes sends most (at 20,000 workers
on 300 s leases, 200-300 a second). Its route (:func:`kernelfleet.service.api.leases.heartbeat`) is one
database statement (:func:`~kernelfleet.service.leasing.beat`), and FastAPI's work around it (matching
the path through the included routers, solving the dependencies anew, validating and serialising the
answer) cost more CPU than the statement: measured with py-spy on ``serve``, the route's own
statement was 16 % of a heartbeat's samples, the dependencies 12 %, the routing 15 %.

This middleware, the innermost (inside the auth-first check, the body cap and the metrics), answers
a heartbeat itself when everything about it is the common case: a bare path with an id in
:data:`~kernelfleet.service.params.RowId`'s range, no query string, a bearer token, a small body that
:class:`~kernelfleet.service.schemas.LeaseTokenIn` accepts, and a lease that the one statement extends.
Then it sends what the route would (the same :class:`~kernelfleet.service.schemas.HeartbeatOut`, the
same bytes) and tells the metrics the route's template. Anything else (a bad body, no token, a stale
lease, a revoked worker) goes on to the route with the body it read, unchanged, so every error is the
route's own: the statement changed nothing when it did not apply. An error of the statement (the
database away) is answered by the app's handler of it, as the route's would be, without a second try.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Awaitable, Callable
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from kernelfleet.service import leasing
from kernelfleet.service.asgi import HttpMiddleware
from kernelfleet.service.auth import WorkerCall, seen_every
from kernelfleet.service.params import MAX_ROW_ID
from kernelfleet.service.routes import route_templates
from kernelfleet.service.schemas import HeartbeatOut, LeaseTokenIn
from kernelfleet.service.settings import Settings

PATH = re.compile(r"/api/v1/jobs/([1-9][0-9]{0,9})/heartbeat")
TEMPLATE = "/api/v1/jobs/{job_id}/heartbeat"
MAX_BODY = 4096  # a heartbeat's body is one lease token (~60 bytes): a bigger one goes to the route
HEADERS = [(b"content-type", b"application/json")]


def bearer_token(scope: Scope) -> str | None:
    """The bearer token of ``Authorization`` as FastAPI's ``HTTPBearer`` reads it (the first such header;
    scheme case-insensitive, the credentials stripped), or None."""
    header = next((v for k, v in scope["headers"] if k == b"authorization"), None)
    if not header:
        return None
    scheme, _, credentials = header.decode("latin-1").partition(" ")
    credentials = credentials.strip()
    return credentials if scheme and credentials and scheme.lower() == "bearer" else None


async def _read(receive: Receive) -> tuple[list[Message], bytes | None]:
    """The request's body messages, and its bytes (None: over :data:`MAX_BODY`, or the client left)."""
    messages: list[Message] = []
    size = 0
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            return messages, None
        size += len(message.get("body", b""))
        if size > MAX_BODY:
            return messages, None
        if not message.get("more_body", False):
            return messages, b"".join(m.get("body", b"") for m in messages)


def _replay(messages: list[Message], receive: Receive) -> Receive:
    """``receive`` that gives ``messages`` first (what was read), then the client's own."""
    pending = list(messages)

    async def replayed() -> Message:
        return pending.pop(0) if pending else await receive()

    return replayed


class FastHeartbeatMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, fastapi_app: Callable[[], FastAPI], settings: Settings) -> None:
        super().__init__(app)
        self._fastapi_app = fastapi_app
        self._settings = settings
        self._route: object | None = None

    def _heartbeat_route(self) -> object:
        """The route as FastAPI puts it in ``scope["route"]`` (the metrics read its template there)."""
        if self._route is None:
            self._route = next(t.route for t in route_templates(self._fastapi_app())
                               if t.path == TEMPLATE and "POST" in t.methods)
        return self._route

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        found = PATH.fullmatch(scope["path"]) if scope["method"] == "POST" else None
        token = bearer_token(scope) if found and not scope.get("query_string") else None
        if found is None or token is None or int(found[1]) > MAX_ROW_ID:
            await self.app(scope, receive, send)
            return
        messages, body = await _read(receive)
        try:
            answer = await self._beat(int(found[1]), token, body) if body is not None else None
        except Exception as e:  # answered as the route's would be (a database error: 503), not run twice
            handler = self._handler(e)
            if handler is None:
                raise
            scope["route"] = self._heartbeat_route()
            response = handler(Request(scope, _replay(messages, receive)), e)
            if inspect.isawaitable(response):
                response = await response
            await response(scope, receive, send)
            return
        if answer is None:  # not the common case: the route answers, from the same body
            await self.app(scope, _replay(messages, receive), send)
            return
        scope["route"] = self._heartbeat_route()
        await send({"type": "http.response.start", "status": 200,
                    "headers": [*HEADERS, (b"content-length", str(len(answer)).encode())]})
        await send({"type": "http.response.body", "body": answer})

    def _handler(self, error: Exception) -> Callable[[Request, Any], Response | Awaitable[Response]] | None:
        """The app's handler of ``error``, looked up by its class's MRO as Starlette's does."""
        handlers = self._fastapi_app().exception_handlers
        return next((handlers[c] for c in type(error).__mro__ if c in handlers), None)

    async def _beat(self, job_id: int, token: str, body: bytes) -> bytes | None:
        """The route's answer when its one statement extended the lease, else None (the route's case)."""
        from kernelfleet.service.api.leases import next_heartbeat  # the route's module imports this one's

        try:
            lease_token = LeaseTokenIn.model_validate_json(body).lease_token
        except ValidationError:
            return None
        settings = self._settings
        call = WorkerCall(self._fastapi_app().state.session_factory, token,
                          seen_every(settings.worker_offline_after_seconds))
        expires = await anyio.to_thread.run_sync(leasing.beat, call, job_id, lease_token,
                                                 settings.lease_seconds)
        if expires is None:
            return None
        out = HeartbeatOut(lease_expires_at=expires, next_heartbeat_seconds=next_heartbeat(settings))
        return out.__pydantic_serializer__.to_json(out)
