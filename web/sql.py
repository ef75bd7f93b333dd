"""Small SQL helpers that render on both SQLite and PostgreSQL."""

from __future__ import annotations

from typing import Any

from sqlalchemy import String
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.sql.expression import ColumnElement, FunctionElement


class utc_day(FunctionElement[str]):  # noqa: N801 - reads like the SQL function it renders
    """The UTC calendar day of a timestamp, as ``'YYYY-MM-DD'`` text."""

    type = String()
    inherit_cache = True
    name = "utc_day"

    def __init__(self, column: ColumnElement[Any]) -> None:
        super().__init__(column)


@compiles(utc_day, "sqlite")
def _utc_day_sqlite(element: utc_day, compiler: Any, **kw: Any) -> str:
    (col,) = list(element.clauses)
    return f"substr({compiler.process(col, **kw)}, 1, 10)"


@compiles(utc_day, "postgresql")
def _utc_day_pg(element: utc_day, compiler: Any, **kw: Any) -> str:
    (col,) = list(element.clauses)
    return f"to_char(({compiler.process(col, **kw)}) AT TIME ZONE 'UTC', 'YYYY-MM-DD')"
