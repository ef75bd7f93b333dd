"""Job leasing: lease, heartbeat, fail, release and requeue, all on the database clock.

Each function runs inside the caller's transaction (the route's unit of work, opened with
``BEGIN IMMEDIATE`` on SQLite), so a worker request authenticates and acts in one transaction. The two
requests a fleet sends most, a heartbeat (:func:`beat`) and a lease (:func:`lease_next` on
:meth:`~kernelfleet.service.auth.WorkerCall.statements`), run as prebuilt Core statements instead, each
atomic on its own and authenticating the worker inside itself (in autocommit on PostgreSQL).

A lease is one atomic statement, ``UPDATE jobs ... WHERE id = (pick) RETURNING``. The pick matches
the worker against the few job targets (:mod:`kernelfleet.service.targets`) and takes, per matching
target, the oldest available queued job through the partial index ``ix_jobs_queued_target`` (on
PostgreSQL ``FOR UPDATE SKIP LOCKED``; on SQLite the write lock taken up front serialises leases),
then the oldest of those: O(k log n) for k matching targets and n queued jobs.

A fresh lease runs out after ``lease_confirm_seconds`` unless the worker confirms it (its first
heartbeat); an unconfirmed lease that runs out is requeued at once and its attempt refunded, so a
lease request whose client went away spends nothing. Lease tokens are stored as SHA-256 digests.

Every other transition is a conditional ``UPDATE ... WHERE id = :id AND lease_token = :digest AND
state = 'leased' AND leased_by = :worker``, so a stale lease can never change a job.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import BindParameter, ColumnElement, Connection, Float, and_, bindparam, select, update
from sqlalchemy.orm import Session, aliased
from sqlalchemy.sql.dml import ReturningUpdate

from kernelfleet.service.auth import (
    LEASE_PREFIX,
    SEEN,
    WHO_DIGEST,
    WorkerCall,
    digest,
    live_worker_id,
    new_token,
    who_params,
)
from kernelfleet.service.campaigns import runtime_settings_request
from kernelfleet.service.db import db_now
from kernelfleet.service.errors import Conflict, NotFound
from kernelfleet.service.models import (
    Backend,
    Campaign,
    Job,
    JobKind,
    JobState,
    JobTarget,
    Regression,
    RegressionStatus,
    Worker,
)
from kernelfleet.service.targets import runnable_targets


@dataclass(frozen=True)
class Lease:
    job_id: int
    lease_token: str
    kernel: str
    shape: str
    dtype: str
    kind: JobKind
    lease_expires_at: datetime
    request: dict[str, Any] | None = None  # a runtime_settings job's search (its campaign's)


@dataclass(frozen=True)
class Transition:
    job_id: int
    state: JobState
    attempts: int
    max_attempts: int
    available_at: datetime | None


def backoff_seconds(attempts: int, base: float, cap: float) -> float:
    """Exponential backoff after the ``attempts``-th failed attempt: base, 2*base, 4*base, ... <= cap."""
    return float(min(cap, base * 2 ** max(0, attempts - 1)))


def _pick(targets: list[int] | BindParameter[Any]) -> ColumnElement[int]:
    """The id of the oldest available queued job among ``targets``: per target one index probe."""
    cand, picked = aliased(Job), aliased(Job)
    head = (
        select(cand.id)
        .where(cand.target_id == JobTarget.id, cand.state == JobState.queued, cand.available_at <= db_now())
        .order_by(cand.available_at, cand.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .correlate(JobTarget)
        .scalar_subquery()
    )
    return (
        select(picked.id).select_from(JobTarget).join(picked, picked.id == head)
        .where(JobTarget.id.in_(targets))
        .order_by(picked.available_at, picked.id)
        .limit(1)
        .scalar_subquery()
    )


def lease_statement(targets: list[int] | BindParameter[Any], worker_id: int | BindParameter[Any],
                    token_digest: str | BindParameter[Any], confirm_seconds: float | BindParameter[Any],
                    ) -> ReturningUpdate[tuple[int, str, str, str, JobKind, datetime, int | None]]:
    """The one statement that leases: the oldest available job among ``targets``, to ``worker_id``."""
    return (
        update(Job)
        .where(Job.id == _pick(targets), Job.state == JobState.queued)
        .values(state=JobState.leased, lease_token=token_digest, leased_by=worker_id, lease_confirmed=False,
                attempts=Job.attempts + 1, lease_expires_at=db_now(confirm_seconds), updated_at=db_now())
        .returning(Job.id, Job.kernel, Job.shape, Job.dtype, Job.kind, Job.lease_expires_at, Job.campaign_id)
        .execution_options(synchronize_session=False)
    )


# built once, executed with parameters: building it (two aliases of jobs, a correlated subquery)
# cost more CPU than the rest of a lease request (measured: bench-load --profile)
_LEASE = lease_statement(bindparam("targets", expanding=True), bindparam("worker_id"),
                         bindparam("token_digest"), bindparam("confirm_seconds", type_=Float))


def lease_next(db: Session | Connection, worker_id: int, backend: Backend, chip: str,
               confirm_seconds: float, target_count: int | None = None) -> Lease | None:
    """Lease the next queued job the worker ``worker_id`` (of ``backend`` and ``chip``) can run, or None
    when there is none. The lease itself is one atomic statement, so ``db`` may be a session's
    transaction or a connection in autocommit (:meth:`WorkerCall.statements`).

    The lease first runs out after ``confirm_seconds``; the worker's first heartbeat confirms it.
    ``target_count``: the number of job targets, read in the worker's token check
    (:meth:`WorkerCall.identify`), so that the targets are not read again while it is unchanged
    (:func:`~kernelfleet.service.targets.runnable_targets`).
    """
    targets = runnable_targets(db, backend, chip, target_count)
    if not targets:
        return None
    token = new_token(LEASE_PREFIX)
    row = db.execute(_LEASE, {"targets": targets, "worker_id": worker_id, "token_digest": digest(token),
                              "confirm_seconds": float(confirm_seconds)}).first()
    if row is None:
        return None
    request = None
    if row.kind == JobKind.runtime_settings and row.campaign_id is not None:
        spec = db.scalar(select(Campaign.spec).where(Campaign.id == row.campaign_id))
        request = runtime_settings_request(spec or {}, row.dtype)
    return Lease(job_id=row.id, lease_token=token, kernel=row.kernel, shape=row.shape, dtype=row.dtype,
                 kind=row.kind, lease_expires_at=row.lease_expires_at, request=request)


def _current_lease(job_id: int, token: str, worker_id: int) -> ColumnElement[bool]:
    return and_(Job.id == job_id, Job.lease_token == digest(token), Job.state == JobState.leased,
                Job.leased_by == worker_id)


def explain_stale(session: Session, job_id: int, token: str) -> Conflict | NotFound:
    """The error for a lease that is not (or no longer) this worker's current lease on the job."""
    job = session.get(Job, job_id)
    if job is None:
        return NotFound(f"job {job_id} does not exist")
    if job.lease_token == digest(token) and job.state == JobState.done:
        return Conflict(f"job {job_id} is already done with this lease")
    if job.state == JobState.dead:
        return Conflict(f"job {job_id} is dead (it failed {job.attempts} of {job.max_attempts} attempts)")
    return Conflict(f"this lease on job {job_id} is no longer valid (it expired and the job was requeued, "
                    f"or another worker holds it); lease a new job")


def _beat_statement(with_seen: bool) -> ReturningUpdate[tuple[datetime]]:
    """A heartbeat as one statement, authenticated inside it: the lease is extended when the token
    digest is an unrevoked worker's and the lease token its current lease on the job; ``with_seen``
    (PostgreSQL) records in a CTE that the worker was seen (SQLite runs ``SEEN`` after it)."""
    statement = (
        update(Job)
        .where(Job.id == bindparam("beat_job"), Job.lease_token == bindparam("beat_lease"),
               Job.state == JobState.leased, Job.leased_by == live_worker_id(WHO_DIGEST))
        .values(lease_expires_at=db_now(bindparam("beat_seconds", type_=Float)), lease_confirmed=True,
                updated_at=db_now())
        .returning(Job.lease_expires_at)
    )
    if with_seen:
        statement = statement.add_cte(SEEN.returning(Worker.id).cte("kf_seen"))
    return statement


# built once, executed with parameters (building and compiling the ORM statements of the generic path
# was most of a heartbeat's CPU): PostgreSQL, SQLite
_BEAT = {False: _beat_statement(True), True: _beat_statement(False)}


def beat(call: WorkerCall, job_id: int, token: str, lease_seconds: float) -> datetime | None:
    """The heartbeat's common case in one statement (one round trip on PostgreSQL), or None when it did
    not apply: no token, a token that is no live worker's, or a lease that is not this worker's current
    one. Then :func:`heartbeat` in the worker's transaction answers (401, 409, or the extended lease
    when something changed in between): the statement changed nothing."""
    if call.token is None:
        return None
    params = {**who_params(call.token, call.refresh_after), "beat_job": job_id, "beat_lease": digest(token),
              "beat_seconds": float(lease_seconds)}
    with call.statements() as (conn, sqlite):
        expires: datetime | None = conn.execute(_BEAT[sqlite], params).scalar()
        if expires is not None and sqlite:
            conn.execute(SEEN, params)
    return expires


def heartbeat(session: Session, worker: Worker, job_id: int, token: str, lease_seconds: float) -> datetime:
    """Extend (and confirm) the lease when ``token`` is this worker's current lease; 409 otherwise.

    One UPDATE through the primary key."""
    expires = session.execute(
        update(Job).where(_current_lease(job_id, token, worker.id))
        .values(lease_expires_at=db_now(lease_seconds), lease_confirmed=True, updated_at=db_now())
        .returning(Job.lease_expires_at).execution_options(synchronize_session=False)
    ).scalar()
    if expires is None:
        raise explain_stale(session, job_id, token)
    return expires


def fail(session: Session, worker: Worker, job_id: int, token: str, error: str,
         base: float, cap: float) -> Transition:
    """Count a failed attempt: requeue with exponential backoff, or mark dead at max_attempts."""
    job = session.scalars(select(Job).where(_current_lease(job_id, token, worker.id))).first()
    if job is None:
        raise explain_stale(session, job_id, token)
    done = _requeue_or_kill(session, job, error, base, cap)
    if done is None:
        raise explain_stale(session, job_id, token)
    return done


def release(session: Session, worker: Worker, job_id: int, token: str) -> Transition:
    """Give a leased job back (graceful shutdown); the attempt does not count."""
    row = session.execute(
        update(Job).where(_current_lease(job_id, token, worker.id))
        .values(**_REQUEUE_NOW, attempts=Job.attempts - 1)
        .returning(Job.id, Job.state, Job.attempts, Job.max_attempts, Job.available_at)
        .execution_options(synchronize_session=False)
    ).first()
    if row is None:
        raise explain_stale(session, job_id, token)
    return Transition(row.id, row.state, row.attempts, row.max_attempts, row.available_at)


# back in the queue at once, the lease forgotten (release, and unconfirmed leases that ran out)
_REQUEUE_NOW = dict(state=JobState.queued, lease_token=None, leased_by=None, lease_expires_at=None,
                    lease_confirmed=False, available_at=db_now(), updated_at=db_now())


def _requeue_or_kill(session: Session, job: Job, error: str, base: float, cap: float,
                     *, only_if_expired: bool = False) -> Transition | None:
    dead = job.attempts >= job.max_attempts
    delay = backoff_seconds(job.attempts, base, cap)
    where = [Job.id == job.id, Job.lease_token == job.lease_token, Job.state == JobState.leased]
    if only_if_expired:  # a heartbeat may have extended it since we looked
        where.append(Job.lease_expires_at < db_now())
    row = session.execute(
        update(Job).where(*where)
        .values(state=JobState.dead if dead else JobState.queued,
                lease_token=None, leased_by=None, lease_expires_at=None, lease_confirmed=False,
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


def _refund_unconfirmed(session: Session) -> list[Transition]:
    """Requeue, at once and with the attempt given back, every lease nobody confirmed in time: the
    worker never got it (its lease request was abandoned), so nothing ran."""
    rows = session.execute(
        update(Job)
        .where(Job.state == JobState.leased, Job.lease_confirmed.is_(False), Job.lease_expires_at < db_now())
        .values(**_REQUEUE_NOW, attempts=Job.attempts - 1)
        .returning(Job.id, Job.state, Job.attempts, Job.max_attempts, Job.available_at)
        .execution_options(synchronize_session=False)
    ).all()
    return [Transition(r.id, r.state, r.attempts, r.max_attempts, r.available_at) for r in rows]


def reap_expired(session: Session, base: float, cap: float) -> list[Transition]:
    """Requeue (with backoff) or kill every job whose confirmed lease has expired, and requeue unconfirmed
    ones without spending their attempt. Runs in the caller's transaction.

    Only confirmed leases are charged: an unconfirmed one that runs out between the refund and this
    look (on SQLite each statement reads the clock anew) waits for the next pass's refund."""
    out = _refund_unconfirmed(session)
    expired = session.scalars(
        select(Job).where(Job.state == JobState.leased, Job.lease_confirmed.is_(True),
                          Job.lease_expires_at < db_now()).order_by(Job.id)
    ).all()
    for job in expired:
        if job.lease_token is None:
            continue
        who = f"worker {job.leased_by}" if job.leased_by is not None else "its worker"
        why = f"lease expired: {who} stopped sending heartbeats"
        done = _requeue_or_kill(session, job, why, base, cap, only_if_expired=True)
        if done is not None:
            out.append(done)
    return out
