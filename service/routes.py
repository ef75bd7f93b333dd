"""The app's routes with their full path templates (router prefixes included).

FastAPI >= 0.16x keeps included routers as routers (``fastapi.routing.iter_route_contexts`` walks
them and ``scope["route"]`` is the route as its router declared it, without the prefix); older
FastAPI copies every route into ``app.routes`` with its full path. :func:`route_templates` hides
the difference for the metrics labels and the OpenAPI post-processing.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from fastapi import FastAPI, routing
from starlette.routing import BaseRoute, compile_path


@dataclass(frozen=True)
class RouteTemplate:
    path: str  # the full template, e.g. /api/v1/jobs/{job_id}/heartbeat
    methods: frozenset[str]
    route: BaseRoute  # as declared (an APIRoute for API routes): its dependant, responses, ...
    include_in_schema: bool
    pattern: str = ""  # the full path with its convertors, e.g. /api/v1/regressions/{regression_id:int}


def route_templates(app: FastAPI) -> Iterator[RouteTemplate]:
    iter_contexts = getattr(routing, "iter_route_contexts", None)
    if iter_contexts is None:  # older FastAPI: app.routes already carry the full paths
        for route in app.routes:
            methods = frozenset(getattr(route, "methods", None) or ())
            yield RouteTemplate(getattr(route, "path_format", ""), methods, route,
                                bool(getattr(route, "include_in_schema", True)), getattr(route, "path", ""))
        return
    for ctx in iter_contexts(app.routes):
        yield RouteTemplate(ctx.path_format or "", frozenset(ctx.methods or ()), ctx.original_route,
                            bool(getattr(ctx, "include_in_schema", True)), ctx.path or "")


def routes_at(app: FastAPI, path: str) -> list[RouteTemplate]:
    """The routes whose path matches ``path`` (a request's), whatever their methods."""
    compiled: list[tuple[re.Pattern[str], RouteTemplate]] | None = getattr(app.state, "route_patterns", None)
    if compiled is None:
        compiled = [(compile_path(t.pattern)[0], t) for t in route_templates(app) if t.pattern]
        app.state.route_patterns = compiled
    return [t for regex, t in compiled if regex.match(path)]


def _key(route: BaseRoute) -> tuple[object, object, object]:
    # routes are not hashable; a route is its endpoint at its declared path for these methods
    methods = frozenset(getattr(route, "methods", None) or ())
    return getattr(route, "endpoint", None), getattr(route, "path_format", None), methods


def template_of(app: FastAPI, route: BaseRoute | None) -> str | None:
    """The full path template of the route a request matched (``scope["route"]``)."""
    if route is None:
        return None
    index: dict[tuple[object, object, object], str] | None = getattr(app.state, "route_template_index", None)
    if index is None:
        index = {_key(t.route): t.path for t in route_templates(app)}
        app.state.route_template_index = index
    return index.get(_key(route)) or getattr(route, "path_format", None)
