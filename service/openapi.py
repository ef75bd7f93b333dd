"""The OpenAPI schema, made to match what the coordinator answers.

Every error is ``{"detail": "<message>"}`` (:class:`ErrorOut`), so FastAPI's default 422 schema (a
list of error objects) is replaced, and each operation lists the errors it can answer, derived from
the route: 401/403 from its auth dependency, 404 from path parameters, 400/413 (Content-Length,
body cap) under /api/, 415 for bodies, 422 (validation, NUL characters) and 500/503 everywhere.
Routes declare the rest themselves with :func:`error_responses` (e.g. 409 on lease conflicts).
Dashboard-readable routes carry an optional bearer requirement while the dashboard is public.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from fastapi import FastAPI
from fastapi.dependencies.models import Dependant
from fastapi.openapi.utils import get_openapi
from fastapi.routing import APIRoute
from pydantic import BaseModel

from kernelfleet.service.bodies import add_body_schemas
from kernelfleet.service.deps import (
    admin_actor,
    require_admin,
    require_dashboard,
    require_enroll,
    worker_call,
)
from kernelfleet.service.routes import route_templates
from kernelfleet.service.settings import Settings


class ErrorOut(BaseModel):
    detail: str


DESCRIPTIONS = {
    400: "malformed request (e.g. a bad Content-Length header)",
    401: "missing, unknown, expired or revoked token",
    403: "a worker token on a route that needs the admin token",
    404: "no such row",
    409: "the lease is stale or the row changed state",
    413: "the body is larger than KERNELFLEET_MAX_BODY_BYTES",
    415: "the body is not JSON",
    422: "invalid input: the message names each problem",
    500: "internal error (logged by the coordinator)",
    503: "the database is unreachable, read-only or busy; retry later",
}
_REF = {"$ref": "#/components/schemas/ErrorOut"}
# every string the coordinator takes refuses NUL (PostgreSQL text cannot hold it): the schema says so
NO_NUL = "^[^\\u0000]*$"
_BODY_METHODS = {"post", "put", "patch"}


def error_responses(*codes: int) -> dict[int | str, dict[str, Any]]:
    """``responses=`` entries for a route that can answer these error statuses."""
    return {code: {"model": ErrorOut, "description": DESCRIPTIONS[code]} for code in codes}


def dependency_calls(dependant: Dependant) -> Iterator[Any]:
    """Every dependency callable of a route (its dependencies', too)."""
    for dep in dependant.dependencies:
        yield dep.call
        yield from dependency_calls(dep)


def _error_codes(route: APIRoute, path: str, method: str, settings: Settings) -> set[int]:
    codes = {422, 500, 503}  # 422: every route refuses NUL characters in its path and query string
    calls = set(dependency_calls(route.dependant))
    if require_admin in calls or require_enroll in calls or admin_actor in calls:
        codes |= {401, 403}
    if worker_call in calls:
        codes.add(401)
    if require_dashboard in calls and not settings.dashboard_public:
        codes |= {401, 403}
    if route.dependant.path_params:
        codes.add(404)
    if path.startswith("/api/"):
        codes |= {400, 413}
        if method in _BODY_METHODS:
            codes.add(415)
    return codes


def build_openapi(app: FastAPI, settings: Settings) -> dict[str, Any]:
    schema = get_openapi(title=app.title, version=app.version, description=app.description,
                         routes=app.routes)
    components = schema.setdefault("components", {}).setdefault("schemas", {})
    components["ErrorOut"] = ErrorOut.model_json_schema()
    add_body_schemas(components)  # bodies that routes parse themselves (service/bodies.py)
    for template in route_templates(app):
        route = template.route
        if not isinstance(route, APIRoute) or not template.include_in_schema:
            continue
        for method in template.methods:
            op = schema["paths"].get(template.path, {}).get(method.lower())
            if op is None:
                continue
            responses = op.setdefault("responses", {})
            for code in sorted(_error_codes(route, template.path, method.lower(), settings)):
                declared = responses.get(str(code))
                if declared is None or code == 422:
                    responses[str(code)] = {"description": DESCRIPTIONS[code],
                                            "content": {"application/json": {"schema": _REF}}}
            if require_dashboard in set(dependency_calls(route.dependant)) and settings.dashboard_public:
                op["security"] = [{}, *op.get("security", [])]  # the token is optional
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    _declare_no_nul({k: v for k, v in schema.items() if k != "components"})
    _declare_no_nul({k: v for k, v in components.items() if k != "ErrorOut"})
    return schema


def _declare_no_nul(node: Any, names: bool = False) -> None:
    """Give every string schema under ``node`` without a pattern of its own (or an enum) the pattern
    :data:`NO_NUL`: requests with NUL get 422 (:mod:`kernelfleet.service.params`, the request
    models), and a schema that allowed it promised otherwise. ``names``: ``node`` is a
    ``propertyNames`` schema (always strings)."""
    if isinstance(node, list):
        for item in node:
            _declare_no_nul(item)
        return
    if not isinstance(node, dict):
        return
    if (names or node.get("type") == "string") and not {"pattern", "enum", "const", "format"} & node.keys():
        node["pattern"] = NO_NUL
    for key, value in node.items():
        if key == "propertyNames" and isinstance(value, dict):
            _declare_no_nul(value, names=True)
        elif key not in ("example", "examples", "default"):
            _declare_no_nul(value)


def install_openapi(app: FastAPI, settings: Settings) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app, settings)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
