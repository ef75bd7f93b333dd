"""The reaper: a background task in the app's lifespan that requeues expired leases (with backoff)
or marks their jobs dead at max_attempts. On PostgreSQL each pass runs under a transaction-level
advisory lock, so only one coordinator replica reaps at a time."""

from __future__ import annotations

import asyncio
import logging

from kernelfleet.service.db import immediate, is_sqlite
from kernelfleet.service.leasing import Transition, reap_expired
from kernelfleet.service.settings import Settings
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

logger = logging.getLogger(__name__)

REAPER_LOCK_KEY = 0x4B46_5245  # "KFRE"


def reap_once(session_factory: sessionmaker[Session], settings: Settings) -> list[Transition]:
    """One reaper pass; returns the jobs it requeued or killed (empty when another replica holds the lock)."""
    with session_factory() as session, immediate(session):
        bind = session.get_bind()
        if not is_sqlite(bind.engine) and not session.scalar(
            select(func.pg_try_advisory_xact_lock(REAPER_LOCK_KEY))
        ):
            return []
        moved = reap_expired(session, settings.requeue_backoff_seconds, settings.requeue_backoff_max_seconds)
    for t in moved:
        logger.info("reaper: job %s lease expired -> %s (attempt %s of %s)", t.job_id, t.state.value,
                    t.attempts, t.max_attempts)
    return moved


async def run_reaper(session_factory: sessionmaker[Session], settings: Settings) -> None:
    """Reap every ``reaper_interval_seconds`` until cancelled."""
    while True:
        try:
            await asyncio.to_thread(reap_once, session_factory, settings)
        except Exception:  # keep reaping after a transient database error
            logger.exception("reaper pass failed")
        await asyncio.sleep(settings.reaper_interval_seconds)
