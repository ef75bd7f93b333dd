"""The reaper: a background task in the app's lifespan that requeues expired leases (with backoff)
or marks their jobs dead at max_attempts, and requeues unconfirmed leases that ran out with their
attempt refunded. One process reaps at a time (:mod:`kernelfleet.service.locks`): on PostgreSQL
each pass runs under the advisory lock ``reaper`` for its transaction, on SQLite under an ``flock``
on ``<database>.reaper.lock``; a process that does not get it skips the pass."""

from __future__ import annotations

import asyncio
import contextlib
import logging

from sqlalchemy import update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import metrics
from kernelfleet.service.db import db_now, immediate, is_sqlite
from kernelfleet.service.leasing import Transition, reap_expired
from kernelfleet.service.locks import background_lock
from kernelfleet.service.models import Job, JobState
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)


def reap_once(session_factory: sessionmaker[Session], settings: Settings) -> list[Transition]:
    """One reaper pass; returns the jobs it requeued or killed (empty when another process holds the lock)."""
    with session_factory() as session, background_lock(session, "reaper") as mine:
        if not mine:
            return []
        sqlite = is_sqlite(session.get_bind().engine)  # PostgreSQL: inside the lock's transaction
        with immediate(session) if sqlite else contextlib.nullcontext():
            moved = reap_expired(session, settings.requeue_backoff_seconds,
                                 settings.requeue_backoff_max_seconds)
    for t in moved:
        logger.info("reaper: job %s lease expired -> %s (attempt %s of %s)", t.job_id, t.state.value,
                    t.attempts, t.max_attempts)
    return moved


def grant_restart_grace(session_factory: sessionmaker[Session], settings: Settings) -> int:
    """At start-up, give every current lease at least one full lease period from now.

    While no coordinator runs, workers can neither heartbeat nor report, so leases run out although
    their workers are alive and their results wait in the workers' spools. Reaping those at once
    would requeue them all (wasted attempts, duplicate tuning, spooled results refused with 409).
    A worker that really vanished is still reaped, one lease period later.
    """
    with session_factory() as session, immediate(session):
        soon = db_now(settings.lease_seconds)
        extended = len(session.execute(
            update(Job).where(Job.state == JobState.leased, Job.lease_expires_at < soon)
            .values(lease_expires_at=soon).returning(Job.id).execution_options(synchronize_session=False)
        ).all())
    if extended:
        logger.info("reaper: extended %s lease(s) by one lease period after start-up", extended)
    return extended


async def run_reaper(session_factory: sessionmaker[Session], settings: Settings) -> None:
    """Reap every ``reaper_interval_seconds`` until cancelled (after :func:`grant_restart_grace`)."""
    try:
        await asyncio.to_thread(grant_restart_grace, session_factory, settings)
    except Exception:  # the reaper still runs; the worst case is an early requeue
        logger.exception("extending leases after start-up failed")
    while True:
        try:
            moved = await asyncio.to_thread(reap_once, session_factory, settings)
            metrics.record_reaper_pass(t.state.value for t in moved)
        except Exception:  # keep reaping after a transient database error
            logger.exception("reaper pass failed")
        await asyncio.sleep(settings.reaper_interval_seconds)
