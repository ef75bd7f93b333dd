"""Enrollment: ``POST /enroll-tokens`` and ``POST /workers/add`` (an admin or enroll token; the second
answers with the commands that install and enroll a new machine too), and ``POST /workers/enroll``
(with an enrollment token)."""

from __future__ import annotations

from fastapi import APIRouter, status

from kernelfleet.service import add_worker
from kernelfleet.service.deps import DbDep, EnrollDep, SettingsDep
from kernelfleet.service.enrollment import enroll_worker, mint_enrollment_token
from kernelfleet.service.errors import NotFound
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.schemas import (
    AddWorkerIn,
    AddWorkerOut,
    EnrollIn,
    EnrollOut,
    EnrollTokenIn,
    EnrollTokenOut,
)

router = APIRouter(tags=["enrollment"])


@router.post("/enroll-tokens", status_code=status.HTTP_201_CREATED)
def create_enroll_token(_: EnrollDep, db: DbDep, settings: SettingsDep,
                        body: EnrollTokenIn | None = None) -> EnrollTokenOut:
    with db() as session:
        ttl = body.ttl_seconds if body and body.ttl_seconds else settings.enrollment_token_ttl_seconds
        uses = body.uses if body else 1
        token, expires_at = mint_enrollment_token(session, ttl, uses)
        return EnrollTokenOut(token=token, expires_at=expires_at, uses=uses)


@router.post("/workers/enroll", status_code=status.HTTP_201_CREATED, responses=error_responses(401))
def enroll(body: EnrollIn, db: DbDep) -> EnrollOut:
    with db() as session:
        worker_id, token = enroll_worker(session, body)
        return EnrollOut(worker_id=worker_id, token=token)


@router.post("/workers/add", status_code=status.HTTP_201_CREATED, responses=error_responses(404))
def add(_: EnrollDep, db: DbDep, settings: SettingsDep, body: AddWorkerIn | None = None) -> AddWorkerOut:
    """A fresh enrollment token for ``gpus`` workers and the exact commands that install KernelFleet
    (the coordinator's own wheel) and enroll, for macOS (Metal) and Linux (CUDA)."""
    body = body or AddWorkerIn()
    try:
        got = add_worker.mint(db, settings, body.gpus, body.ttl_seconds)
    except add_worker.WheelUnavailable as e:
        raise NotFound(f"this coordinator has no wheel to serve: {e}") from None
    return AddWorkerOut.model_validate(got, from_attributes=True)
