"""Request bodies parsed and validated off the event loop.

FastAPI parses a route's JSON body and validates it on the event loop; a 1.1 MB report took the
loop for tens of milliseconds, and four workers posting such reports back to back raised another
worker's heartbeat p99 from 10.6 to 289 ms (issue 33). A route that takes big bodies reads the raw
bytes (``await request.body()``) and calls :func:`parse_body` on a thread of a bounded limiter;
:func:`body_schema` keeps the body in the OpenAPI schema. The errors are FastAPI's own (422 with
the same messages), since validation is the same: ``json.loads``, then the model in Python mode.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)
BODY_MODELS: dict[str, type[BaseModel]] = {}  # the models of body_schema(), by name: their schemas


def parse_body(model: type[Model], raw: bytes) -> Model:
    """``raw`` as ``model``, or :class:`RequestValidationError` as FastAPI raises it (422)."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                       "input": None}])
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        where = ("body", e.pos) if isinstance(e, json.JSONDecodeError) else ("body",)
        why = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
        raise RequestValidationError([{"type": "json_invalid", "loc": where, "msg": "JSON decode error",
                                       "input": {}, "ctx": {"error": why}}]) from None
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise RequestValidationError([{**err, "loc": ("body", *err["loc"])} for err in e.errors()]) from None


def body_schema(model: type[BaseModel]) -> dict[str, Any]:
    """``openapi_extra`` for a route that parses ``model`` itself: the required JSON body, by
    reference (:func:`kernelfleet.service.openapi.build_openapi` adds the model's schema)."""
    BODY_MODELS[model.__name__] = model
    return {"requestBody": {"required": True, "content": {"application/json": {
        "schema": {"$ref": f"#/components/schemas/{model.__name__}"}}}}}


def add_body_schemas(components: dict[str, Any]) -> None:
    """Put the schemas of :data:`BODY_MODELS` (and the models they use) into ``components``."""
    for name, model in BODY_MODELS.items():
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        for used, sub in schema.pop("$defs", {}).items():
            components.setdefault(used, sub)
        components.setdefault(name, schema)
