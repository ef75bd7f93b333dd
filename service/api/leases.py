"""The worker's lease lifecycle: lease (optionally long-polled), heartbeat, result, fail, release.

Each route opens its own unit of work, in which the worker's token is checked
(:class:`~kernelfleet.service.auth.WorkerCall`), on one thread.
"""

from __future__ import annotations

import asyncio
import random

import anyio
import anyio.to_thread
from fastapi import APIRouter, Request, Response, status
from fastapi.concurrency import run_in_threadpool

from kernelfleet.service import leasing, metrics
from kernelfleet.service.auth import WorkerCall
from kernelfleet.service.bodies import body_schema, parse_body
from kernelfleet.service.completion import complete
from kernelfleet.service.deps import SettingsDep, WorkerCallDep
from kernelfleet.service.longpoll import LeaseWaiters
from kernelfleet.service.models import Backend
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
from kernelfleet.service.settings import Settings

router = APIRouter(tags=["leases"])


def _try_lease(call: WorkerCall, settings: Settings) -> tuple[Backend, str, leasing.Lease | None]:
    """The worker's backend and chip, and the job it leased (None: nothing it can run is queued), in
    Core statements (no ORM session; on PostgreSQL each its own transaction, the lease one atomic
    statement): an idle fleet's polls are most of what a coordinator serves."""
    with call.statements() as (conn, sqlite):
        me = call.identify(conn, sqlite)
        return me.backend, me.chip, leasing.lease_next(conn, me.kf_id, me.backend, me.chip,
                                                       settings.lease_confirm_seconds, me.kf_targets)


def _give_back(call: WorkerCall, got: leasing.Lease) -> None:
    with call.transaction() as (session, worker):
        leasing.release(session, worker, got.job_id, got.lease_token)


@router.post("/leases", response_model=LeaseOut,
             responses={204: {"description": "nothing this worker can run is queued (after waiting up to "
                                              "`wait_seconds`); `Retry-After` says when to ask again"}})
async def lease(call: WorkerCallDep, settings: SettingsDep, request: Request,
                body: LeaseIn | None = None) -> LeaseOut | Response:
    """Lease the next job this worker can run. Confirm it with a heartbeat before ``lease_expires_at``
    (``KERNELFLEET_LEASE_CONFIRM_SECONDS``), or it goes back to the queue without costing an attempt."""
    waiters: LeaseWaiters = request.app.state.lease_waiters
    loop = asyncio.get_running_loop()
    deadline = loop.time() + min(body.wait_seconds if body else 0.0, settings.lease_wait_max_seconds)
    while True:
        backend, chip, got = await run_in_threadpool(_try_lease, call, settings)
        if got is not None:
            if await request.is_disconnected():  # nobody will read it: give it straight back
                await run_in_threadpool(_give_back, call, got)
                return Response(status_code=499)
            metrics.LEASES_GRANTED.inc()
            return LeaseOut(job_id=got.job_id, lease_token=got.lease_token, kernel=got.kernel,
                            shape=got.shape, dtype=got.dtype, kind=got.kind.value,
                            lease_expires_at=got.lease_expires_at, lease_seconds=settings.lease_seconds,
                            runtime_settings=got.request)
        remaining = deadline - loop.time()
        if remaining <= 0 or not await _wait(waiters, request, backend, chip, remaining):
            return Response(status_code=status.HTTP_204_NO_CONTENT,
                            headers={"Retry-After": str(settings.idle_retry_seconds)})


async def _wait(waiters: LeaseWaiters, request: Request, backend: Backend, chip: str, seconds: float) -> bool:
    """Wait for work (True) until ``seconds`` pass, the client goes away or the server shuts down
    (False)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while (left := deadline - loop.time()) > 0:
        if await waiters.wait(backend, chip, min(left, 1.0)):
            return True
        if waiters.stopping or await request.is_disconnected():
            return False
    return False


@router.post("/jobs/{job_id}/heartbeat", responses=error_responses(409))
def heartbeat(job_id: RowId, body: LeaseTokenIn, call: WorkerCallDep, settings: SettingsDep) -> HeartbeatOut:
    """Extend the lease (the first heartbeat also confirms it)."""
    expires = leasing.beat(call, job_id, body.lease_token, settings.lease_seconds)
    if expires is None:  # not a live worker's current lease: the worker's transaction says why
        with call.transaction() as (session, worker):
            expires = leasing.heartbeat(session, worker, job_id, body.lease_token, settings.lease_seconds)
    return HeartbeatOut(lease_expires_at=expires, next_heartbeat_seconds=next_heartbeat(settings))


def next_heartbeat(settings: Settings) -> float:
    """A third of the lease, less a random share of up to ``heartbeat_jitter`` of that: each beat
    draws anew, so a fleet that started in one burst drifts apart instead of beating in waves."""
    third = settings.lease_seconds / 3.0
    return round(third * (1.0 - settings.heartbeat_jitter * random.random()), 3)


@router.post("/jobs/{job_id}/result", status_code=status.HTTP_201_CREATED, response_model_exclude_none=True,
             responses={200: {"model": CompleteOut, "description": "a replay of an accepted result"},
                        **error_responses(409)},
             openapi_extra=body_schema(CompleteIn))
async def result(job_id: RowId, call: WorkerCallDep, request: Request, response: Response,
                 settings: SettingsDep) -> CompleteOut:
    """Store the result with the job's completion; its reactions (regression detection) and the
    chip's profile follow in the background (service/background.py). A runtime_settings job's result
    is the settings file it chose, stored as the worker's chip's runtime settings (a gain lost since
    the MLX version measured before is a regression, found in the same transaction). The body (a report, up to
    the 4 MiB cap) is parsed and validated on a thread, not on the event loop, and at most
    ``KERNELFLEET_RESULT_CONCURRENCY`` results are parsed and stored at once per process, on threads
    of their own, so heartbeats and leases keep flowing beside big reports."""
    limiter: anyio.CapacityLimiter = request.app.state.result_limiter
    raw = await request.body()
    body = await anyio.to_thread.run_sync(parse_body, CompleteIn, raw, limiter=limiter)
    done = await anyio.to_thread.run_sync(complete, call, job_id, body, settings, limiter=limiter)
    if not done.created:
        response.status_code = status.HTTP_200_OK
    return CompleteOut.model_validate(done.response)


@router.post("/jobs/{job_id}/fail", responses=error_responses(409))
def fail(job_id: RowId, body: FailIn, call: WorkerCallDep, settings: SettingsDep) -> JobTransitionOut:
    with call.transaction() as (session, worker):
        t = leasing.fail(session, worker, job_id, body.lease_token, body.error,
                         settings.requeue_backoff_seconds, settings.requeue_backoff_max_seconds)
    return JobTransitionOut(job_id=t.job_id, state=t.state.value, attempts=t.attempts,
                            max_attempts=t.max_attempts, available_at=t.available_at)


@router.post("/jobs/{job_id}/release", responses=error_responses(409))
def release(job_id: RowId, body: LeaseTokenIn, call: WorkerCallDep) -> JobTransitionOut:
    with call.transaction() as (session, worker):
        t = leasing.release(session, worker, job_id, body.lease_token)
    return JobTransitionOut(job_id=t.job_id, state=t.state.value, attempts=t.attempts,
                            max_attempts=t.max_attempts, available_at=t.available_at)
