"""Request bodies parsed and validated off the event loop.

FastAPI parses a route's JSON body and validates it on the event loop; a 1.1 MB report took the
loop for tens of milliseconds, and four workers posting such reports back to back raised another
worker's heartbeat p99 from 10.6 to 289 ms (issue 33). A route that takes big bodies reads the raw
bytes (``await request.body()``) and calls :func:`parse_body` on a thread of a bounded limiter;
:func:`body_schema` keeps the body in the OpenAPI schema. The errors are FastAPI's own (422 with
the same messages), since validation is the same: ``json.loads``'s value, then the model in Python mode.

The body is read by orjson where its value is ``json.loads``'s (:func:`loads`: 0.06 against 0.30 ms for a
40 KB report), by ``json.loads`` where it is not, so the values, errors and messages stay ``json.loads``'s.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import orjson
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

Model = TypeVar("Model", bound=BaseModel)
BODY_MODELS: dict[str, type[BaseModel]] = {}  # the models of body_schema(), by name: their schemas
# a body's digits as 0, the characters that may continue a number's digits (. e E) as ., the rest as space
_DIGIT_RUNS = bytes(48 if 48 <= b <= 57 else 46 if b in b".eE" else 32 for b in range(256))
_LONG_INTEGER = b" " + b"0" * 19  # an integer token of 19 digits or more (int64 holds every 18-digit one)


def loads(raw: bytes) -> Any:
    """``json.loads(raw)``, read by orjson where that gives the same value: orjson reads what JSON
    allows (RFC 8259, UTF-8) to the same values, floats correctly rounded as ``json.loads`` rounds
    them, the last of duplicate keys winning (tests/service/test_bodies.py), and refuses the rest (NaN,
    Infinity, a number past the double range, a lone surrogate, a BOM, invalid UTF-8), which
    ``json.loads`` then reads or refuses as it always did. An integer past 64 bits orjson would read as a
    float: a body with a run of 19 or more digits that may be an integer goes to ``json.loads`` (a run after a
    point or an ``e`` is not; one in a string or after ``e+`` only costs the slower read)."""
    if (b" " + raw.translate(_DIGIT_RUNS)).find(_LONG_INTEGER) < 0:
        try:
            return orjson.loads(raw)
        except orjson.JSONDecodeError:
            pass
    return json.loads(raw)


def parse_body(model: type[Model], raw: bytes) -> Model:
    """``raw`` as ``model``, or :class:`RequestValidationError` as FastAPI raises it (422)."""
    if not raw:
        raise RequestValidationError([{"type": "missing", "loc": ("body",), "msg": "Field required",
                                       "input": None}])
    try:
        data = loads(raw)
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
