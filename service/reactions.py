"""Reactions to stored results, off the request path: the result hooks run in the background.

Storing a result queues a ``result_events`` row in the result's own transaction. Every
:attr:`Settings.background_interval_seconds`, :func:`run_pending` (one drainer at a time: an
advisory lock on PostgreSQL, a file lock on SQLite) takes the queued events in id order, runs every
registered hook (:mod:`kernelfleet.service.hooks`; e.g. regression detection) for each result and
deletes the events it handled. Results are judged one after the other in the order they were
stored, as before, and a result request answers as soon as its own transaction has committed.
Delivery is at least once: a process killed mid-batch leaves its events queued for the next pass.
"""

from __future__ import annotations

import logging

from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import immediate, is_sqlite
from kernelfleet.service.hooks import run_result_hooks
from kernelfleet.service.locks import background_lock
from kernelfleet.service.models import ResultEvent
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

BATCH = 200


def _drain(factory: sessionmaker[Session], settings: Settings, session: Session, sqlite: bool) -> int:
    events = session.execute(
        select(ResultEvent.id, ResultEvent.result_id).order_by(ResultEvent.id).limit(BATCH)
    ).all()
    if sqlite:  # end the read snapshot: the hooks write, and an older snapshot could not write after
        session.rollback()
    for _, result_id in events:
        run_result_hooks(factory, result_id, settings)
    if events:
        done = delete(ResultEvent).where(ResultEvent.id <= events[-1].id)
        if sqlite:
            with immediate(session):
                session.execute(done)
        else:
            session.execute(done)
    return len(events)


def run_pending(factory: sessionmaker[Session], settings: Settings) -> int:
    """Run the hooks of every queued result (in batches); returns how many results were handled."""
    total = 0
    while True:
        with factory() as session, background_lock(session, "reactions") as mine:
            if not mine:
                return total
            done = _drain(factory, settings, session, sqlite=is_sqlite(session.get_bind().engine))
        total += done
        if done < BATCH:
            return total
