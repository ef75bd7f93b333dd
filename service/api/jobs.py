"""Jobs (admin): ``GET /jobs?campaign_id=&state=&limit=&offset=`` and ``GET /jobs/{id}``."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query
from sqlalchemy import select

from kernelfleet.service.deps import AdminDep, DbDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import Job, JobState
from kernelfleet.service.params import Offset, OptRowId, RowId
from kernelfleet.service.schemas import JobOut, JobStateName

router = APIRouter(tags=["jobs"])


@router.get("/jobs")
def list_jobs(_: AdminDep, db: DbDep, campaign_id: OptRowId = None,
              state: JobStateName | None = None, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
              offset: Offset = 0) -> list[JobOut]:
    with db() as session:
        q = select(Job).order_by(Job.id).limit(limit).offset(offset)
        if campaign_id is not None:
            q = q.where(Job.campaign_id == campaign_id)
        if state is not None:
            q = q.where(Job.state == JobState(state))
        return [JobOut.model_validate(j) for j in session.scalars(q).all()]


@router.get("/jobs/{job_id}")
def show_job(job_id: RowId, _: AdminDep, db: DbDep) -> JobOut:
    with db() as session:
        job = session.get(Job, job_id)
        if job is None:
            raise NotFound(f"job {job_id} does not exist")
        return JobOut.model_validate(job)
