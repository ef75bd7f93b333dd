"""Every error the coordinator answers is JSON ``{"detail": "<message>"}``, never plain text or a
traceback: coordinator errors with their status, validation errors as 422 with one readable
phrase per problem, a database that cannot be reached or written as 503, anything else as 500
(logged with its traceback). Dashboard pages render their own HTML error pages
(:mod:`kernelfleet.web.routing`)."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa_exc
from starlette.exceptions import HTTPException
from starlette.types import Receive, Scope, Send

from kernelfleet.service.asgi import HttpMiddleware, ResponseWatch
from kernelfleet.service.errors import CoordinatorError
from kernelfleet.service.limits import describe_validation_errors
from kernelfleet.service.routes import routes_at

logger = logging.getLogger(__name__)

DB_UNAVAILABLE = "the database is unavailable or refuses writes; retry later (the coordinator logged why)"
INTERNAL_ERROR = "internal error: the coordinator logged it; retry, or report it with the request's time"
RETRY_AFTER_SECONDS = 5

# SQLSTATE classes and codes meaning "the database cannot serve this now", not "this request is wrong":
# 08 connection exception, 53 insufficient resources (disk full), 57 operator intervention (shutdown,
# cancelled), 25006 read-only transaction (a standby, default_transaction_read_only), 40001/40P01
# serialization failure / deadlock (retry).
_UNAVAILABLE_CLASSES = ("08", "53", "57")
_UNAVAILABLE_CODES = ("25006", "40001", "40P01")


def database_unavailable(exc: BaseException) -> bool:
    """True when a SQLAlchemy error means the database is down, read-only, full or busy."""
    if isinstance(exc, sa_exc.OperationalError | sa_exc.InterfaceError | sa_exc.TimeoutError
                  | sa_exc.DisconnectionError):
        return True
    if isinstance(exc, sa_exc.DBAPIError):
        code = str(getattr(exc.orig, "sqlstate", None) or "")
        return code.startswith(_UNAVAILABLE_CLASSES) or code in _UNAVAILABLE_CODES
    return False


def _json(status: int, detail: str, headers: Mapping[str, str] | None = None) -> JSONResponse:
    return JSONResponse(status_code=status, content={"detail": detail}, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(CoordinatorError)
    async def _coordinator_error(_request: Request, exc: CoordinatorError) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status_code == 401 else None
        return _json(exc.status_code, exc.message, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return _json(422, describe_validation_errors(exc.errors()))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        if exc.status_code == 404 and detail == "Not Found":
            detail = "no such route: see /docs for the API"
        headers = exc.headers
        if exc.status_code == 405:
            detail = f"{request.method} is not allowed on {request.url.path}: see /docs for the API"
            # what every route on this path allows (Starlette names only the first route's methods)
            allowed = sorted({m for t in routes_at(request.app, request.scope["path"]) for m in t.methods})
            headers = {**(headers or {}), "Allow": ", ".join(allowed)} if allowed else headers
        return _json(exc.status_code, detail, headers)

    @app.exception_handler(sa_exc.SQLAlchemyError)
    async def _database_error(request: Request, exc: sa_exc.SQLAlchemyError) -> JSONResponse:
        if database_unavailable(exc):
            logger.error("database unavailable on %s %s: %s", request.method, request.url.path,
                         str(getattr(exc, "orig", None) or exc).strip().splitlines()[0])
            return _json(503, DB_UNAVAILABLE, {"Retry-After": str(RETRY_AFTER_SECONDS)})
        if isinstance(exc, sa_exc.DataError):  # a value the database cannot hold that validation missed
            logger.warning("database refused a value on %s %s: %s", request.method, request.url.path,
                           str(exc.orig).strip().splitlines()[0])
            return _json(422, "a value in this request does not fit the database (too large, or an "
                              "invalid character)")
        logger.error("database error on %s %s", request.method, request.url.path, exc_info=exc)
        return _json(500, INTERNAL_ERROR)


class JsonErrorMiddleware(HttpMiddleware):
    """Turns an exception no handler took into a JSON 500 (and logs it). It sits inside the security
    headers and metrics middleware, so that 500 carries the headers and is counted."""

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        watch = ResponseWatch(send)
        try:
            await self.app(scope, receive, watch)
        except Exception:
            logger.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if watch.started:  # too late to answer: let the server close the connection
                raise
            await _json(500, INTERNAL_ERROR)(scope, receive, send)
