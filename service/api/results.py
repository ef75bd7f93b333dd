"""Results: ``POST /results/import`` (admin) stores reports made outside a lease (``kernelfleet tune``).

Import is idempotent: a report is keyed on the digest of its canonical JSON, and one already
imported (or repeated within the request) is not stored again; its earlier result id is returned."""

from __future__ import annotations

from fastapi import APIRouter, status
from sqlalchemy import select

from kernelfleet.service.db import immediate
from kernelfleet.service.deps import AdminDep, DbDep
from kernelfleet.service.models import Result
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import ImportIn, ImportOut

router = APIRouter(tags=["results"])


@router.post("/results/import", status_code=status.HTTP_201_CREATED)
def import_results(body: ImportIn, _: AdminDep, db: DbDep) -> ImportOut:
    """Store every new report in one transaction: all of them or none. Reports stored before are
    skipped (``duplicates``); ``result_ids`` gives each report's result, new or earlier."""
    digests = [report.digest() for report in body.reports]
    with db() as session, immediate(session):
        known: dict[str, int] = dict(session.execute(
            select(Result.payload_digest, Result.id)
            .where(Result.source == "import", Result.payload_digest.in_(set(digests)))
        ).tuples().all())
        new: list[int] = []
        ids: list[int] = []
        for report, digest in zip(body.reports, digests, strict=True):
            if digest not in known:
                row = store_report(session, report, source="import")
                row.response = {"result_id": row.id, "imported": True}
                known[digest] = row.id
                new.append(row.id)
            ids.append(known[digest])
    return ImportOut(imported=len(new), duplicates=len(ids) - len(new), result_ids=ids)
