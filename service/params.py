"""Shared request parameter types and the request-wide input check every route runs.

- :data:`RowId` bounds a path id to PostgreSQL's ``integer`` (1 .. 2**31-1), :data:`OptRowId` the
  same as an optional query filter; :data:`Offset` bounds paging offsets to ``bigint``. Values
  outside get 422 instead of a database error.
- :func:`reject_nul` (an app-wide dependency) refuses NUL characters in the path and the query
  string with 422: PostgreSQL cannot store them in text. Request bodies are checked by the
  request models (:class:`kernelfleet.service.schemas.Strict`).
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Path, Query, Request
from fastapi.exceptions import RequestValidationError

MAX_ROW_ID = 2**31 - 1  # PostgreSQL `integer` primary keys
MAX_OFFSET = 2**63 - 1  # SQLite and PostgreSQL LIMIT/OFFSET are 64-bit

RowId = Annotated[int, Path(ge=1, le=MAX_ROW_ID, description="a row id (1 .. 2**31-1)")]
OptRowId = Annotated[int | None, Query(ge=1, le=MAX_ROW_ID)]
Offset = Annotated[int, Query(ge=0, le=MAX_OFFSET, description="rows to skip")]

NUL = "\x00"
NUL_MESSAGE = "must not contain NUL characters (\\u0000)"


async def reject_nul(request: Request) -> None:  # async: no I/O, no threadpool hop
    """422 for a NUL character in a path parameter or in a query parameter's name or value."""
    errors = [
        {"type": "string_nul", "loc": ("path", name), "msg": NUL_MESSAGE, "input": value}
        for name, value in request.path_params.items() if isinstance(value, str) and NUL in value
    ]
    errors += [
        {"type": "string_nul", "loc": ("query", name.replace(NUL, "\\u0000")), "msg": NUL_MESSAGE,
         "input": value}
        for name, value in request.query_params.multi_items() if NUL in name or NUL in value
    ]
    if errors:
        raise RequestValidationError(errors)
