"""Enrollment: ``POST /enroll-tokens`` (admin) and ``POST /workers/enroll`` (with an enrollment token)."""

from __future__ import annotations

from fastapi import APIRouter, status

from kernelfleet.service.deps import AdminDep, DbDep, SettingsDep
from kernelfleet.service.enrollment import enroll_worker, mint_enrollment_token
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.schemas import EnrollIn, EnrollOut, EnrollTokenIn, EnrollTokenOut

router = APIRouter(tags=["enrollment"])


@router.post("/enroll-tokens", status_code=status.HTTP_201_CREATED)
def create_enroll_token(_: AdminDep, db: DbDep, settings: SettingsDep,
                        body: EnrollTokenIn | None = None) -> EnrollTokenOut:
    with db() as session:
        ttl = body.ttl_seconds if body and body.ttl_seconds else settings.enrollment_token_ttl_seconds
        token, expires_at = mint_enrollment_token(session, ttl)
        return EnrollTokenOut(token=token, expires_at=expires_at)


@router.post("/workers/enroll", status_code=status.HTTP_201_CREATED, responses=error_responses(401))
def enroll(body: EnrollIn, db: DbDep) -> EnrollOut:
    with db() as session:
        worker_id, token = enroll_worker(session, body)
        return EnrollOut(worker_id=worker_id, token=token)
