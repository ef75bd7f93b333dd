"""Completing a leased job: the result is stored in the same transaction that marks the job done.

- the current ``(job_id, lease_token)`` of this worker -> 201 and the result id
- the same payload again for that lease -> the original response (200)
- a different payload for that lease -> 422
- a lease that is not the job's current one, or a replay by a worker other than the one that
  completed it (even with the right token and payload) -> 409
- a runtime_settings job's result is the runtime-settings file it chose
  (:func:`kernelfleet.service.runtime_settings.store_settings`); a tuning report for it, or runtime
  settings for a tuning job, -> 422

Lease tokens are compared and stored as SHA-256 digests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import bindparam, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from kernelfleet.service.auth import WorkerCall, digest
from kernelfleet.service.db import db_now
from kernelfleet.service.errors import Conflict, Invalid
from kernelfleet.service.leasing import explain_stale
from kernelfleet.service.models import Job, JobKind, JobState, Result, Worker
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import CompleteIn, RuntimeSettingsFile, TuningReport
from kernelfleet.service.settings import Settings


@dataclass(frozen=True)
class Completion:
    response: dict[str, Any]
    created: bool  # False for a replay of an already accepted payload


def _replay(session: Session, worker: Worker, job_id: int, token: str, payload: str) -> Completion | None:
    prior = session.scalars(select(Result).where(Result.job_id == job_id)).first()
    if prior is None:
        return None
    if prior.lease_token != digest(token) or prior.worker_id != worker.id:
        raise Conflict(f"job {job_id} was already completed under another lease; this lease is stale")
    if prior.payload_digest != payload:
        raise Invalid(f"job {job_id} already has a different result for this lease; a lease accepts "
                      f"exactly one result (resend the original payload, or lease a new job)")
    return Completion(response=dict(prior.response), created=False)


def check_origin(worker: Worker, chip: str, backend: str, *, what: str = "this report says chip",
                 acts: str = "reports") -> None:
    """What a worker sends (a result; runtime settings) is for the chip and backend it enrolled as:
    anything claiming another is refused."""
    claimed, enrolled = (chip, str(backend)), (worker.chip, str(worker.backend))
    if claimed != enrolled:
        raise Invalid(f"{what} {claimed[0]!r} ({claimed[1]}), but worker {worker.id} is enrolled as "
                      f"{enrolled[0]!r} ({enrolled[1]}); a worker {acts} only for its own chip (enroll this "
                      f"machine as its own worker)")


def _wrong_kind(job: Any, sent: str) -> Invalid:
    wants = "runtime_settings" if job.kind == JobKind.runtime_settings else "a report"
    return Invalid(f"job {job.id} is a {job.kind.value} job ({job.kernel}/{job.shape}/{job.dtype}): its "
                   f"result is {wants}, not {sent}")


# built once and run on the session's connection with parameters: building the ORM update and running
# it through the ORM's bulk-update path was 9 % of a result's server CPU (py-spy --gil, request_cost.py)
_FINISH = (
    update(Job)
    .where(Job.id == bindparam("finish_job"), Job.lease_token == bindparam("finish_lease"),
           Job.state == JobState.leased, Job.leased_by == bindparam("finish_worker"))
    .values(state=JobState.done, finished_at=db_now(), lease_expires_at=None, updated_at=db_now(),
            last_error=None, lease_confirmed=True)
    .returning(Job.id, Job.kind, Job.kernel, Job.shape, Job.dtype)
)


def _finish_leased(session: Session, worker: Worker, job_id: int, token: str) -> Any:
    """Mark the job done when ``token`` is this worker's current lease on it (one statement, in the
    transaction that stores its result): the job's kind, kernel, shape and dtype, or None. Nothing of
    the session is pending here (the worker is authenticated by statements), so nothing to flush first."""
    return session.connection().execute(
        _FINISH, {"finish_job": job_id, "finish_lease": digest(token), "finish_worker": worker.id}).first()


def _complete(session: Session, worker: Worker, job_id: int, token: str, report: TuningReport) -> Completion:
    """The job is marked done first, by one conditional UPDATE: when that finds no current lease, the
    call is a replay (answered from the stored result) or stale (409); a report that does not fit
    the job raises, and the update rolls back with the transaction."""
    check_origin(worker, report.env.chip, report.env.backend)
    payload = report.digest()
    job = _finish_leased(session, worker, job_id, token)
    if job is None:
        replay = _replay(session, worker, job_id, token, payload)
        if replay is not None:
            return replay
        raise explain_stale(session, job_id, token)
    if job.kind == JobKind.runtime_settings:
        raise _wrong_kind(job, "a tuning report")
    wanted = (job.kernel, job.shape, job.dtype)
    got = (report.kernel, report.shape, report.dtype)
    if wanted != got:
        raise Invalid(f"job {job_id} is {'/'.join(wanted)} but the report is for {'/'.join(got)}")
    result = store_report(session, report, source="lease", job_id=job_id, worker_id=worker.id,
                          lease_token=digest(token), payload_digest=payload,
                          respond=lambda row_id: {"result_id": row_id, "job_id": job_id, "state": "done"})
    return Completion(response=dict(result.response), created=True)


def _complete_runtime(session: Session, worker: Worker, job_id: int, token: str, body: RuntimeSettingsFile,
                      min_effect: float) -> Completion:
    """A runtime_settings job's chosen settings, stored as the worker's chip's (no result row: a
    replay of this lease, once done, is answered from the job and stores nothing again)."""
    response = {"result_id": None, "job_id": job_id, "state": "done", "stored": len(body.entries)}
    prior = session.get(Job, job_id)
    if (prior is not None and prior.kind == JobKind.runtime_settings and prior.state == JobState.done
            and prior.lease_token == digest(token) and prior.leased_by == worker.id):
        return Completion(response=response, created=False)
    job = _finish_leased(session, worker, job_id, token)  # a check below that fails rolls it back
    if job is None:
        raise explain_stale(session, job_id, token)
    if job.kind != JobKind.runtime_settings:
        raise _wrong_kind(job, "runtime_settings")
    strays = sorted({f"{e.model}/{e.dtype}" for e in body.entries} - {f"{job.shape}/{job.dtype}"})
    if strays:
        raise Invalid(f"job {job_id} searches {job.shape}/{job.dtype}, but the settings are for "
                      f"{', '.join(strays)}")
    from kernelfleet.service.runtime_settings import store_settings  # it imports check_origin from here

    store_settings(session, worker, body, min_effect)
    return Completion(response=response, created=True)


def complete(call: WorkerCall, job_id: int, body: CompleteIn, settings: Settings) -> Completion:
    """Store ``body``'s result (a tuning report, or a runtime_settings job's settings) as the result of
    this worker's current lease on ``job_id`` (or answer a replay), authenticating the worker in the same
    transaction."""
    token = body.lease_token
    if body.runtime_settings is not None:
        runtime = body.runtime_settings
        with call.transaction() as (session, worker):
            return _complete_runtime(session, worker, job_id, token, runtime, settings.regression_min_effect)
    assert body.report is not None  # CompleteIn holds one of the two
    report = body.report
    try:
        with call.transaction() as (session, worker):
            return _complete(session, worker, job_id, token, report)
    except IntegrityError:  # a concurrent identical completion won the unique(job_id) race
        with call.transaction() as (session, worker):
            replay = _replay(session, worker, job_id, token, report.digest())
        if replay is None:
            raise Conflict(f"job {job_id} changed while completing it; retry the request") from None
        return replay
