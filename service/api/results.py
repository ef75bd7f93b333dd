"""Results: ``GET /results`` (public-read per settings): every stored run, filtered and keyset-paged,
as JSON or CSV; ``POST /results/import`` (admin) stores reports made outside a lease
(``kernelfleet tune``).

Import is idempotent: a report is keyed on the digest of its canonical JSON, and one already
imported (or repeated within the request) is not stored again; its earlier result id is returned."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Query, Request, status
from fastapi.responses import Response
from pydantic import Field
from sqlalchemy import select

from kernelfleet.service.db import immediate
from kernelfleet.service.deps import AdminDep, DashboardDep, DbDep
from kernelfleet.service.errors import Invalid
from kernelfleet.service.models import Result
from kernelfleet.service.params import OptRowId
from kernelfleet.service.reports import store_report
from kernelfleet.service.result_export import ResultFilter, ResultPage, page, to_csv
from kernelfleet.service.schemas import BackendName, DType, ImportIn, ImportOut

router = APIRouter(tags=["results"])

MAX_VALUES = 64
# repeatable: ?chip=A&chip=B; each value 1-128 characters, at most MAX_VALUES of them (in the schema too)
Values = Annotated[list[Annotated[str, Field(min_length=1, max_length=128)]], Query(max_length=MAX_VALUES)]
CSV = "text/csv"
# a date, optionally with a time and a UTC offset (datetime.fromisoformat's forms); never a number.
# Only real dates match (no 0000-00-00, no February 30, February 29 of leap years only), so that
# every value the schema allows is one the route accepts
_YEAR = r"(000[1-9]|00[1-9]\d|0[1-9]\d{2}|[1-9]\d{3})"
_LEAP_YEAR = r"(\d{2}(0[48]|[2468][048]|[13579][26])|([2468][048]|[13579][26]|0[48])00)"
_MONTH_DAY = r"((0[1-9]|1[0-2])-(0[1-9]|1\d|2[0-8])|(0[13-9]|1[0-2])-(29|30)|(0[13578]|1[02])-31)"
_HOUR, _MINUTE = r"([01]\d|2[0-3])", r"[0-5]\d"
ISO_TIME = (rf"^({_YEAR}-{_MONTH_DAY}|{_LEAP_YEAR}-02-29)"
            rf"([T ]{_HOUR}(:{_MINUTE}(:{_MINUTE}(\.\d{{1,6}})?)?)?(Z|[+-]{_HOUR}(:?{_MINUTE})?)?)?$")


def _time(name: str, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        raise Invalid(f"{name}: {value!r} is not an ISO 8601 time such as 2026-11-26T15:00:00Z") from None


@router.get("/results", response_model=ResultPage,
            responses={200: {"content": {CSV: {"schema": {"type": "string"}}},
                             "description": "a page of runs (JSON, or CSV: format=csv or Accept: text/csv)"}})
def list_results(
    request: Request,
    _: DashboardDep,
    db: DbDep,
    chip: Values = [],  # noqa: B006 - FastAPI copies defaults
    kernel: Values = [],  # noqa: B006
    shape: Values = [],  # noqa: B006
    dtype: Annotated[list[DType], Query()] = [],  # noqa: B006
    backend: Annotated[list[BackendName], Query()] = [],  # noqa: B006
    mlx_version: Values = [],  # noqa: B006
    revision: Values = [],  # noqa: B006
    source: Annotated[list[Literal["lease", "import"]], Query()] = [],  # noqa: B006
    since: Annotated[str | None, Query(pattern=ISO_TIME, description="stored at or after (ISO 8601; UTC if "
                                       "no offset)")] = None,
    until: Annotated[str | None, Query(pattern=ISO_TIME, description="stored before (ISO 8601)")] = None,
    cursor: Annotated[OptRowId, Query(description="next_cursor of the previous page")] = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
    format: Annotated[Literal["json", "csv"] | None, Query(
        description="json or csv (default: from the Accept header, else json)")] = None,
) -> ResultPage | Response:
    """Stored runs, newest first, ``limit`` per page; pass ``next_cursor`` as ``cursor`` for the next
    page (CSV: the ``Link: <...>; rel="next"`` header and ``X-Next-Cursor``)."""
    filters = ResultFilter(
        chip=chip, kernel=kernel, shape=shape,
        dtype=dtype, backend=backend, mlx_version=mlx_version,
        revision=revision, source=source, since=_time("since", since),
        until=_time("until", until),
    )
    with db() as session:
        items, next_cursor = page(session, filters, limit, cursor)
    next_url = str(request.url.include_query_params(cursor=next_cursor)) if next_cursor else None
    wants_csv = format == "csv" or (format is None and CSV in request.headers.get("accept", ""))
    if not wants_csv:
        return ResultPage(items=items, next_cursor=next_cursor, next=next_url)
    headers = {"Content-Disposition": 'attachment; filename="kernelfleet-results.csv"'}
    if next_url:
        headers["Link"] = f'<{next_url}>; rel="next"'
        headers["X-Next-Cursor"] = str(next_cursor)
    return Response(to_csv(items), media_type="text/csv; charset=utf-8", headers=headers)


@router.post("/results/import", status_code=status.HTTP_201_CREATED)
def import_results(body: ImportIn, _: AdminDep, db: DbDep) -> ImportOut:
    """Store every new report in one transaction: all of them or none. Reports stored before are
    skipped (``duplicates``); ``result_ids`` gives each report's result, new or earlier."""
    digests = [report.digest() for report in body.reports]
    with db() as session, immediate(session):
        known: dict[str, int] = dict(session.execute(
            select(Result.payload_digest, Result.id)
            .where(Result.source == "import", Result.payload_digest.in_(set(digests)))
        ).all())
        new: list[int] = []
        ids: list[int] = []
        for report, digest in zip(body.reports, digests, strict=True):
            if digest not in known:
                row = store_report(session, report, source="import", payload_digest=digest,
                                   respond=lambda result_id: {"result_id": result_id, "imported": True})
                known[digest] = row.id
                new.append(row.id)
            ids.append(known[digest])
    return ImportOut(imported=len(new), duplicates=len(ids) - len(new), result_ids=ids)
