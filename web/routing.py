"""The route class every dashboard router uses: page errors become friendly HTML pages."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy.exc import SQLAlchemyError

from kernelfleet.service.deps import require_dashboard
from kernelfleet.service.error_handlers import RETRY_AFTER_SECONDS, database_unavailable
from kernelfleet.service.errors import CoordinatorError
from kernelfleet.web.errors import WebError
from kernelfleet.web.render import page

# pydantic's error types, in the words of a page's filters
_PLAIN = {
    "int_parsing": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "bool_parsing": "must be true or false",
    "greater_than_equal": "must be {ge} or more",
    "greater_than": "must be more than {gt}",
    "less_than_equal": "must be {le} or less",
    "less_than": "must be less than {lt}",
    "string_too_long": "is too long (at most {max_length} characters)",
    "string_too_short": "is too short",
    "missing": "is required",
}


def _validation_message(exc: RequestValidationError) -> str:
    """One plain sentence per bad parameter: ``days=abc: must be a whole number``."""
    parts = []
    for err in exc.errors():
        loc = [str(x) for x in err.get("loc", ()) if x not in ("query", "path", "body")]
        name = ".".join(loc) or "request"
        given = err.get("input")
        text = str(given) if isinstance(given, str | int | float) else ""
        shown = f"{name}={text[:40]}" if text and text.isprintable() else name
        kind = str(err.get("type", ""))
        if kind in ("value_error", "string_nul"):  # the message of one of our own checks
            plain = str(err.get("msg", "")).removeprefix("Value error, ") or "is not an accepted value"
        elif kind == "string_pattern_mismatch":
            choices = str((err.get("ctx") or {}).get("pattern", "")).strip("^$()").split("|")
            plain = "must be one of " + ", ".join(choices) if all(c.isalnum() for c in choices) else \
                "is not an accepted value"
        else:
            plain = _PLAIN.get(kind, "is not an accepted value").format(**(err.get("ctx") or {}))
        parts.append(f"{shown}: {plain}")
    return "; ".join(parts) or "invalid request"


class HtmlErrorRoute(APIRoute):
    """Renders this router's errors as HTML pages instead of JSON."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        original = super().get_route_handler()

        async def handler(request: Request) -> Response:
            try:
                return await original(request)
            except WebError as e:
                return page(
                    request,
                    "error.html",
                    status_code=e.status_code,
                    title=e.title,
                    message=e.message,
                    hint=e.hint,
                )
            except RequestValidationError as e:
                return page(
                    request,
                    "error.html",
                    status_code=422,
                    title="Bad filter",
                    message=_validation_message(e),
                    hint="Fix the value in the address bar, or start again from the menu.",
                )
            except CoordinatorError as e:
                login = e.status_code == 401
                return page(
                    request,
                    "error.html",
                    status_code=e.status_code,
                    title="Sign in needed" if login else "Not allowed",
                    message=e.message,
                    login_url=f"/login?next={request.url.path}" if login else None,
                )
            except SQLAlchemyError as e:
                if not database_unavailable(e):
                    raise  # a JSON 500, logged (kernelfleet.service.error_handlers)
                response = page(
                    request,
                    "error.html",
                    status_code=503,
                    title="Database unavailable",
                    message="The coordinator cannot read or write its database right now.",
                    hint="Try again in a few seconds; /healthz says what is wrong.",
                )
                response.headers["Retry-After"] = str(RETRY_AFTER_SECONDS)
                return response

        return handler


def page_router() -> APIRouter:
    """A router for read-only pages: public, or the admin token when the dashboard is private."""
    return APIRouter(
        route_class=HtmlErrorRoute, include_in_schema=False, dependencies=[Depends(require_dashboard)]
    )
