"""The change-point scan as background work: requests queue it, the background loop runs it.

``POST /regressions/scan`` calls :func:`enqueue`, which inserts a ``queued`` row into
``regression_scans``, or joins the one already queued (a partial unique index allows one queued row,
so concurrent requests coalesce on PostgreSQL and SQLite alike), and answers 202 at once. A scan
that is running does not absorb new requests: it may have listed the series before their data
arrived, so the next request queues one more, as a profile request during a build does.

:func:`run_pending` (the background loop's scan loop) takes the lock ``regression-scan`` (advisory on
PostgreSQL, ``flock`` beside SQLite's file), so two processes or replicas never scan at once, and
runs the queued scan with :func:`kernelfleet.service.regressions.engine.scan`; the row then says
``done`` with the scan's figures, or ``failed`` with its error. A row left ``running`` by a process
that died mid-scan is marked ``failed`` by the next lock holder (only the holder runs scans).
"""

from __future__ import annotations

import logging
import os
import socket

from sqlalchemy import func, select, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import db_now, immediate, upsert_insert
from kernelfleet.service.locks import background_lock
from kernelfleet.service.models import RegressionScan
from kernelfleet.service.regressions import engine
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

LOCK = "regression-scan"
QUEUED, RUNNING, DONE, FAILED = "queued", "running", "done", "failed"
RUNNER = f"{socket.gethostname()}:{os.getpid()}"


def enqueue(session: Session) -> tuple[RegressionScan, bool]:
    """Queue a scan, or join the queued one: (the scan, whether it was queued already). Runs in the
    caller's write transaction. On PostgreSQL the queued scan that the insert found may start running
    (claimed by a background loop) before this request joins it: the request then queues a new one."""
    while True:
        scan_id = session.execute(
            upsert_insert(session)(RegressionScan).values(status=QUEUED, requests=1)
            .on_conflict_do_nothing(index_elements=["status"], index_where=RegressionScan.status == QUEUED)
            .returning(RegressionScan.id)
        ).scalar()
        joined = scan_id is None
        if joined:  # one was queued already: this request joins it, unless it has started meanwhile
            scan_id = session.execute(
                update(RegressionScan).where(RegressionScan.status == QUEUED)
                .values(requests=RegressionScan.requests + 1)
                .returning(RegressionScan.id).execution_options(synchronize_session=False)
            ).scalar()
        if scan_id is not None:
            scan = session.get(RegressionScan, scan_id, populate_existing=True)
            assert scan is not None
            return scan, joined


def _claim(factory: sessionmaker[Session]) -> int | None:
    """Inside the lock: fail scans a dead process left running, and mark the queued one running."""
    with factory() as session, immediate(session):
        session.execute(
            update(RegressionScan).where(RegressionScan.status == RUNNING)
            .values(status=FAILED, finished_at=db_now(),
                    error="interrupted: the process running it stopped; ask for a new scan")
            .execution_options(synchronize_session=False))
        return session.execute(
            update(RegressionScan).where(RegressionScan.status == QUEUED)
            .values(status=RUNNING, started_at=db_now(), runner=RUNNER)
            .returning(RegressionScan.id).execution_options(synchronize_session=False)
        ).scalar()


def _finish(factory: sessionmaker[Session], scan_id: int, **values: object) -> None:
    with factory() as session, immediate(session):
        session.execute(update(RegressionScan).where(RegressionScan.id == scan_id)
                        .values(finished_at=db_now(), **values).execution_options(synchronize_session=False))


def _run(factory: sessionmaker[Session], settings: Settings) -> int | None:
    scan_id = _claim(factory)
    if scan_id is None:
        return None
    try:
        report = engine.scan(factory, settings)
    except Exception as e:  # recorded on the scan for whoever asked; the loop goes on
        logger.exception("regression scan %s failed", scan_id)
        _finish(factory, scan_id, status=FAILED, error=f"{type(e).__name__}: {e}"[:2000])
    else:
        _finish(factory, scan_id, status=DONE, series=report.series, findings=report.findings,
                created=report.created, moved=report.moved)
        logger.info("regression scan %s: %s series, %s findings, created %s, moved %s", scan_id,
                    report.series, report.findings, report.created, report.moved)
    return scan_id


def pending(factory: sessionmaker[Session]) -> bool:
    with factory() as session:
        return bool(session.scalar(select(func.count()).select_from(RegressionScan)
                                   .where(RegressionScan.status.in_((QUEUED, RUNNING)))))


def run_pending(factory: sessionmaker[Session], settings: Settings) -> int | None:
    """Run the queued scan, if any and if no other process is scanning; returns its id."""
    if not pending(factory):  # the usual case: one small indexed read per pass
        return None
    with factory() as session, background_lock(session, LOCK) as mine:  # held for the whole scan
        return _run(factory, settings) if mine else None
