"""Job leasing: lease, heartbeat, fail, release and requeue, all on the database clock.

A lease is one atomic statement:

- PostgreSQL: ``UPDATE jobs SET ... WHERE id = (SELECT id ... FOR UPDATE SKIP LOCKED LIMIT 1) RETURNING``
- SQLite: the same ``UPDATE ... WHERE id = (SELECT ...) RETURNING`` inside ``BEGIN IMMEDIATE``
  (SQLite renders no ``FOR UPDATE``; the write lock taken up front serialises leases).

Every other transition is a conditional ``UPDATE ... WHERE id = :id AND lease_token = :token AND
state = 'leased'``, so a stale lease can never change a job.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import ColumnElement, and_, or_, select, update
from sqlalchemy.orm import Session

from kernelfleet.service.auth import LEASE_PREFIX, new_token
from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Conflict, NotFound
from kernelfleet.service.models import Job, JobKind, JobState, Regression, RegressionStatus, Worker


@dataclass(frozen=True)
class Lease:
    job_id: int
    lease_token: str
    kernel: str
    shape: str
    dtype: str
    kind: JobKind
    lease_expires_at: datetime


@dataclass(frozen=True)
class Transition:
    job_id: int
    state: JobState
    attempts: int
    max_attempts: int
    available_at: datetime | None


def chip_matches(pattern: str, chip: str) -> bool:
    """Case-insensitive glob match: ``Apple M3*`` matches ``Apple M3 Max``."""
    return fnmatch.fnmatchcase(chip.casefold(), pattern.casefold())


def backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """Exponential backoff after the ``attempts``-th failed attempt: base, 2*base, 4*base, ... <= cap."""
    return float(min(cap, base * 2 ** max(0, attempts - 1)))


def _runnable_by(session: Session, worker: Worker) -> ColumnElement[bool]:
    patterns = session.scalars(
        select(Job.target_chip).distinct()
        .where(Job.state == JobState.queued, Job.target_chip.is_not(None))
    ).all()
    matching = [p for p in patterns if p is not None and chip_matches(p, worker.chip)]
    chip_ok = or_(Job.target_chip.is_(None), Job.target_chip.in_(matching)) if matching \
        else Job.target_chip.is_(None)
    backend_ok = or_(Job.target_backend.is_(None), Job.target_backend == worker.backend)
    return and_(backend_ok, chip_ok)


def lease_next(session: Session, worker: Worker, lease_seconds: float) -> Lease | None:
    """Lease the next queued job this worker can run, or None when there is none."""
    token = new_token(LEASE_PREFIX)
    with immediate(session):
        pick = (
            select(Job.id)
            .where(Job.state == JobState.queued, Job.available_at <= db_now(), _runnable_by(session, worker))
            .order_by(Job.available_at, Job.id)
            .limit(1)
            .with_for_update(skip_locked=True)
            .scalar_subquery()
        )
        row = session.execute(
            update(Job)
            .where(Job.id == pick, Job.state == JobState.queued)
            .values(state=JobState.leased, lease_token=token, leased_by=worker.id,
                    attempts=Job.attempts + 1, lease_expires_at=db_now(lease_seconds), updated_at=db_now())
            .returning(Job.id, Job.kernel, Job.shape, Job.dtype, Job.kind, Job.lease_expires_at)
            .execution_options(synchronize_session=False)
        ).first()
    if row is None:
        return None
    return Lease(job_id=row.id, lease_token=token, kernel=row.kernel, shape=row.shape, dtype=row.dtype,
                 kind=row.kind, lease_expires_at=row.lease_expires_at)


def _current_lease(job_id: int, token: str, worker_id: int) -> ColumnElement[bool]:
    return and_(Job.id == job_id, Job.lease_token == token, Job.state == JobState.leased,
                Job.leased_by == worker_id)


def explain_stale(session: Session, job_id: int, token: str) -> Conflict | NotFound:
    """The error for a lease that is not (or no longer) the job's current one."""
    job = session.get(Job, job_id)
    if job is None:
        return NotFound(f"job {job_id} does not exist")
    if job.lease_token == token and job.state == JobState.done:
        return Conflict(f"job {job_id} is already done with this lease")
    if job.state == JobState.dead:
        return Conflict(f"job {job_id} is dead (it failed {job.attempts} of {job.max_attempts} attempts)")
    return Conflict(f"this lease on job {job_id} is no longer valid (it expired and the job was requeued, "
                    f"or another worker holds it); lease a new job")


def heartbeat(session: Session, worker: Worker, job_id: int, token: str, lease_seconds: float) -> datetime:
    """Extend the lease when ``token`` is the job's current lease; 409 otherwise."""
    with immediate(session):
        expires = session.execute(
            update(Job).where(_current_lease(job_id, token, worker.id))
            .values(lease_expires_at=db_now(lease_seconds), updated_at=db_now())
            .returning(Job.lease_expires_at).execution_options(synchronize_session=False)
        ).scalar()
        if expires is None:
            raise explain_stale(session, job_id, token)
    return expires


def fail(session: Session, worker: Worker, job_id: int, token: str, error: str,
         base: float, cap: float) -> Transition:
    """Count a failed attempt: requeue with exponential backoff, or mark dead at max_attempts."""
    with immediate(session):
        job = session.scalars(select(Job).where(_current_lease(job_id, token, worker.id))).first()
        if job is None:
            raise explain_stale(session, job_id, token)
        done = _requeue_or_kill(session, job, token, error, base, cap)
        if done is None:
            raise explain_stale(session, job_id, token)
        return done


def release(session: Session, worker: Worker, job_id: int, token: str) -> Transition:
    """Give a leased job back (graceful shutdown); the attempt does not count."""
    with immediate(session):
        row = session.execute(
            update(Job).where(_current_lease(job_id, token, worker.id))
            .values(state=JobState.queued, attempts=Job.attempts - 1, lease_token=None, leased_by=None,
                    lease_expires_at=None, available_at=db_now(), updated_at=db_now())
            .returning(Job.id, Job.state, Job.attempts, Job.max_attempts, Job.available_at)
            .execution_options(synchronize_session=False)
        ).first()
        if row is None:
            raise explain_stale(session, job_id, token)
    return Transition(row.id, row.state, row.attempts, row.max_attempts, row.available_at)


def _requeue_or_kill(session: Session, job: Job, token: str, error: str, base: float, cap: float,
                     *, only_if_expired: bool = False) -> Transition | None:
    dead = job.attempts >= job.max_attempts
    delay = backoff_seconds(job.attempts, base, cap)
    where = [Job.id == job.id, Job.lease_token == token, Job.state == JobState.leased]
    if only_if_expired:  # a heartbeat may have extended it since we looked
        where.append(Job.lease_expires_at < db_now())
    row = session.execute(
        update(Job).where(*where)
        .values(state=JobState.dead if dead else JobState.queued,
                lease_token=None, leased_by=None, lease_expires_at=None,
                available_at=db_now(0 if dead else delay),
                finished_at=db_now() if dead else None,
                last_error=error[:8000], updated_at=db_now())
        .returning(Job.id, Job.state, Job.attempts, Job.max_attempts, Job.available_at)
        .execution_options(synchronize_session=False)
    ).first()
    if row is None:
        return None
    if dead and job.kind == JobKind.confirm:
        _unconfirmable(session, job.id, error)
    return Transition(row.id, row.state, row.attempts, row.max_attempts, None if dead else row.available_at)


def _unconfirmable(session: Session, job_id: int, error: str) -> None:
    """A confirmation job that died leaves its suspected regression unconfirmed: dismiss it, saying why
    (otherwise it would stay 'confirming' for ever)."""
    session.execute(
        update(Regression)
        .where(Regression.confirm_job_id == job_id, Regression.status == RegressionStatus.confirming)
        .values(status=RegressionStatus.dismissed,
                acknowledged_note=f"not confirmed: the confirmation run failed ({error[:500]})")
        .execution_options(synchronize_session=False)
    )


def reap_expired(session: Session, base: float, cap: float) -> list[Transition]:
    """Requeue (with backoff) or kill every job whose lease has expired. Runs in the caller's transaction."""
    expired = session.scalars(
        select(Job).where(Job.state == JobState.leased, Job.lease_expires_at < db_now()).order_by(Job.id)
    ).all()
    out: list[Transition] = []
    for job in expired:
        if job.lease_token is None:
            continue
        who = f"worker {job.leased_by}" if job.leased_by is not None else "its worker"
        why = f"lease expired: {who} stopped sending heartbeats"
        done = _requeue_or_kill(session, job, job.lease_token, why, base, cap, only_if_expired=True)
        if done is not None:
            out.append(done)
    return out
