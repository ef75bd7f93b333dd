"""Workers: ``GET /workers`` and ``POST /workers/{id}/revoke`` (admin), ``GET /workers/me`` (worker)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import select

from kernelfleet.service.deps import AdminDep, DbDep, SettingsDep, WorkerCallDep
from kernelfleet.service.enrollment import revoke_worker
from kernelfleet.service.models import Worker
from kernelfleet.service.params import RowId
from kernelfleet.service.schemas import WorkerOut
from kernelfleet.service.worker_status import worker_status

router = APIRouter(tags=["workers"])


@router.get("/workers")
def list_workers(_: AdminDep, db: DbDep, settings: SettingsDep) -> list[WorkerOut]:
    status = worker_status(settings.worker_offline_after_seconds)
    with db() as session:
        rows = session.execute(select(Worker, status).order_by(Worker.id)).all()
        return [WorkerOut.model_validate(w).model_copy(update={"status": s}) for w, s in rows]


@router.get("/workers/me")
def me(call: WorkerCallDep) -> WorkerOut:
    with call.transaction() as (_, worker):
        return WorkerOut.model_validate(worker)


@router.post("/workers/{worker_id}/revoke")
def revoke(worker_id: RowId, _: AdminDep, db: DbDep) -> WorkerOut:
    with db() as session:
        return WorkerOut.model_validate(revoke_worker(session, worker_id))
