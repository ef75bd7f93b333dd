"""The worker's lease lifecycle: lease, heartbeat, result, fail, release."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from kernelfleet.service import leasing, metrics
from kernelfleet.service.completion import complete
from kernelfleet.service.deps import SessionDep, SettingsDep, WorkerDep
from kernelfleet.service.openapi import error_responses
from kernelfleet.service.params import RowId
from kernelfleet.service.schemas import (
    CompleteIn,
    CompleteOut,
    FailIn,
    HeartbeatOut,
    JobTransitionOut,
    LeaseIn,
    LeaseOut,
    LeaseTokenIn,
)

router = APIRouter(tags=["leases"])


@router.post("/leases", response_model=LeaseOut,
             responses={204: {"description": "nothing this worker can run is queued"}})
def lease(worker: WorkerDep, session: SessionDep, settings: SettingsDep,
          body: LeaseIn | None = None) -> LeaseOut | Response:
    got = leasing.lease_next(session, worker, settings.lease_seconds)
    if got is None:
        return Response(status_code=status.HTTP_204_NO_CONTENT)
    metrics.LEASES_GRANTED.inc()
    return LeaseOut(job_id=got.job_id, lease_token=got.lease_token, kernel=got.kernel, shape=got.shape,
                    dtype=got.dtype, kind=got.kind.value, lease_expires_at=got.lease_expires_at,
                    lease_seconds=settings.lease_seconds)


@router.post("/jobs/{job_id}/heartbeat", responses=error_responses(409))
def heartbeat(job_id: RowId, body: LeaseTokenIn, worker: WorkerDep, session: SessionDep,
              settings: SettingsDep) -> HeartbeatOut:
    expires = leasing.heartbeat(session, worker, job_id, body.lease_token, settings.lease_seconds)
    return HeartbeatOut(lease_expires_at=expires)


@router.post("/jobs/{job_id}/result", status_code=status.HTTP_201_CREATED,
             responses={200: {"model": CompleteOut, "description": "a replay of an accepted result"},
                        **error_responses(409)})
def result(job_id: RowId, body: CompleteIn, worker: WorkerDep, session: SessionDep,
           response: Response) -> CompleteOut:
    """Store the result with the job's completion; its reactions (regression detection) and the
    chip's profile follow in the background (service/background.py)."""
    done = complete(session, worker, job_id, body.lease_token, body.report)
    if not done.created:
        response.status_code = status.HTTP_200_OK
    return CompleteOut.model_validate(done.response)


@router.post("/jobs/{job_id}/fail", responses=error_responses(409))
def fail(job_id: RowId, body: FailIn, worker: WorkerDep, session: SessionDep,
         settings: SettingsDep) -> JobTransitionOut:
    t = leasing.fail(session, worker, job_id, body.lease_token, body.error, settings.requeue_backoff_seconds,
                     settings.requeue_backoff_max_seconds)
    return JobTransitionOut(job_id=t.job_id, state=t.state.value, attempts=t.attempts,
                            max_attempts=t.max_attempts, available_at=t.available_at)


@router.post("/jobs/{job_id}/release", responses=error_responses(409))
def release(job_id: RowId, body: LeaseTokenIn, worker: WorkerDep, session: SessionDep) -> JobTransitionOut:
    t = leasing.release(session, worker, job_id, body.lease_token)
    return JobTransitionOut(job_id=t.job_id, state=t.state.value, attempts=t.attempts,
                            max_attempts=t.max_attempts, available_at=t.available_at)
