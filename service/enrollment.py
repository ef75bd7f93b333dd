"""Enrollment: admins mint short-lived, single-use enrollment tokens; a worker trades one for its own
token (shown once, stored as a SHA-256 digest)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import case, select, update
from sqlalchemy.orm import Session

from kernelfleet.service.auth import ENROLL_PREFIX, WORKER_PREFIX, digest, new_token, revoke
from kernelfleet.service.campaigns import runtime_jobs_for_chip
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Unauthorized
from kernelfleet.service.models import Backend, EnrollmentToken, Worker
from kernelfleet.service.schemas import EnrollIn


def mint_enrollment_token(session: Session, ttl_seconds: float, uses: int = 1) -> tuple[str, datetime]:
    """A new enrollment token that enrolls up to ``uses`` workers (one per GPU of a host) before it
    expires."""
    token = new_token(ENROLL_PREFIX)
    with immediate(session):
        row = EnrollmentToken(token_digest=digest(token), expires_at=db_now(ttl_seconds), max_uses=uses,
                              uses=0)
        session.add(row)
        session.flush()
        session.refresh(row)
    return token, row.expires_at


def enroll_worker(session: Session, body: EnrollIn) -> tuple[int, str]:
    """Consume the enrollment token and create the worker; returns ``(worker_id, worker_token)``."""
    wanted = digest(body.enrollment_token)
    token = new_token(WORKER_PREFIX)
    with immediate(session):
        claimed = session.execute(
            update(EnrollmentToken)
            .where(EnrollmentToken.token_digest == wanted, EnrollmentToken.uses < EnrollmentToken.max_uses,
                   EnrollmentToken.expires_at > db_now())
            .values(uses=EnrollmentToken.uses + 1,
                    used_at=case((EnrollmentToken.uses + 1 >= EnrollmentToken.max_uses, db_now()),
                                 else_=EnrollmentToken.used_at))
            .returning(EnrollmentToken.id)
            .execution_options(synchronize_session=False)
        ).scalar()
        if claimed is None:
            raise _why_refused(session, wanted)
        worker = Worker(name=body.name, token_digest=digest(token), chip=body.chip,
                        backend=Backend(body.backend),
                        gpu_cores=body.gpu_cores, memory_bytes=body.memory_bytes, os=body.os,
                        mlx_version=body.mlx_version, driver=body.driver, last_heartbeat_at=db_now())
        session.add(worker)
        session.flush()
        session.execute(update(EnrollmentToken).where(EnrollmentToken.id == claimed)
                        .values(worker_id=worker.id).execution_options(synchronize_session=False))
        worker_id = worker.id
        others = session.scalar(select(Worker.id).where(
            Worker.backend == worker.backend, Worker.chip == worker.chip, Worker.id != worker_id,
            Worker.revoked_at.is_(None)).limit(1))
        if others is None:  # the chip's first worker: the campaigns made before it get its jobs
            runtime_jobs_for_chip(session, worker.backend, worker.chip)
    return worker_id, token


def _why_refused(session: Session, wanted: str) -> Unauthorized:
    row = session.scalars(select(EnrollmentToken).where(EnrollmentToken.token_digest == wanted)).first()
    if row is None:
        return Unauthorized("unknown enrollment token: ask an admin for one "
                            "(`kernelfleet admin enroll-token`)")
    if row.uses >= row.max_uses:
        each = "one worker" if row.max_uses == 1 else f"{row.max_uses} workers"
        return Unauthorized(f"this enrollment token was already used; it enrolls {each}")
    return Unauthorized("this enrollment token has expired; ask an admin for a new one")


def revoke_worker(session: Session, worker_id: int) -> Worker:
    return revoke(session, Worker, worker_id, f"worker {worker_id} does not exist")
