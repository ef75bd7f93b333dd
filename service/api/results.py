"""Results: ``POST /results/import`` (admin) stores reports made outside a lease (``kernelfleet tune``)."""

from __future__ import annotations

from fastapi import APIRouter, status

from kernelfleet.service.db import immediate
from kernelfleet.service.deps import AdminDep, DbDep
from kernelfleet.service.hooks import run_result_hooks
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import ImportIn, ImportOut

router = APIRouter(tags=["results"])


@router.post("/results/import", status_code=status.HTTP_201_CREATED)
def import_results(body: ImportIn, _: AdminDep, db: DbDep) -> ImportOut:
    """Store every report in one transaction: all of them or none."""
    with db() as session, immediate(session):
        rows = [store_report(session, report, source="import") for report in body.reports]
        ids = [r.id for r in rows]
        for r in rows:
            r.response = {"result_id": r.id, "imported": True}
    for result_id in ids:
        run_result_hooks(db, result_id)
    return ImportOut(imported=len(ids), result_ids=ids)
