"""Queued change-point scans (service/regression_scans.py) on SQLite and PostgreSQL: requests while a
scan is queued join it; one process scans at a time (the lock); a scan left running by a process
that died is marked failed; a finished scan records what it found."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from coordinator_helpers import make_report
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import regression_scans
from kernelfleet.service.db import immediate, is_sqlite, make_engine, make_sessionmaker
from kernelfleet.service.locks import file_lock, pg_try_lock
from kernelfleet.service.models import RegressionScan
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings


@pytest.fixture
def factory(migrated_db_url: str) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(migrated_db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def _enqueue(factory: sessionmaker[Session]) -> tuple[int, bool]:
    with factory() as session, immediate(session):
        row, joined = regression_scans.enqueue(session)
        return row.id, joined


def _scans(factory: sessionmaker[Session]) -> list[RegressionScan]:
    with factory() as session:
        return list(session.scalars(select(RegressionScan).order_by(RegressionScan.id)))


def test_requests_join_the_queued_scan_which_runs_once(factory: sessionmaker[Session],
                                                       migrated_db_url: str) -> None:
    with factory() as session, immediate(session):
        store_report(session, TuningReport.model_validate(make_report()), source="import")
    first, joined = _enqueue(factory)
    assert not joined
    assert _enqueue(factory) == (first, True)  # still queued: the second request joins it
    settings = Settings(database_url=migrated_db_url)
    assert regression_scans.run_pending(factory, settings) == first
    [done] = _scans(factory)
    assert (done.id, done.status, done.requests, done.series, done.findings, done.created, done.moved) == \
        (first, "done", 2, 1, 0, [], [])
    assert done.started_at is not None and done.finished_at is not None and done.runner
    assert regression_scans.run_pending(factory, settings) is None  # nothing queued: nothing runs
    second, joined = _enqueue(factory)  # after it ran, a request queues a new scan
    assert second != first and not joined


def test_one_process_scans_at_a_time(factory: sessionmaker[Session], migrated_db_url: str) -> None:
    scan_id, _ = _enqueue(factory)
    settings = Settings(database_url=migrated_db_url)
    with factory() as holder:  # another process is scanning: it holds the lock
        if is_sqlite(holder.get_bind().engine):
            with file_lock(holder, regression_scans.LOCK) as mine:
                assert mine
                assert regression_scans.run_pending(factory, settings) is None
        else:
            with holder.begin():
                assert pg_try_lock(holder, regression_scans.LOCK)
                assert regression_scans.run_pending(factory, settings) is None
    assert [s.status for s in _scans(factory)] == ["queued"]
    assert regression_scans.run_pending(factory, settings) == scan_id  # the lock is free again
    assert [s.status for s in _scans(factory)] == ["done"]


def test_a_scan_left_running_by_a_dead_process_is_failed(factory: sessionmaker[Session],
                                                          migrated_db_url: str) -> None:
    dead, _ = _enqueue(factory)
    with factory() as session, immediate(session):  # as a process that died mid-scan leaves it
        session.execute(update(RegressionScan).values(status="running"))
    fresh, _ = _enqueue(factory)
    assert regression_scans.run_pending(factory, Settings(database_url=migrated_db_url)) == fresh
    by_id = {s.id: s for s in _scans(factory)}
    assert by_id[dead].status == "failed" and "interrupted" in (by_id[dead].error or "")
    assert by_id[fresh].status == "done"


def test_a_request_whose_queued_scan_started_meanwhile_queues_anew(factory: sessionmaker[Session]) -> None:
    """On PostgreSQL a request's insert may find the queued scan and the background loop claim it
    (running) before the request joins it: the request then queues a new scan, as after a scan started,
    not a 500 (the fuzz test met it: NoResultFound on POST /regressions/scan). The claim's commit is
    played in the request's own connection, just before its join, as READ COMMITTED then sees it."""
    from sqlalchemy import event

    first, _ = _enqueue(factory)
    claimed: list[str] = []

    @event.listens_for(factory.kw["bind"], "before_cursor_execute")
    def claim_meanwhile(conn: object, cursor: Any, statement: str, *_: object) -> None:
        if not claimed and statement.lstrip().upper().startswith("UPDATE REGRESSION_SCANS"):
            claimed.append(statement)
            cursor.connection.cursor().execute("UPDATE regression_scans SET status = 'running'")

    second, joined = _enqueue(factory)
    assert claimed, "the request never tried to join the queued scan"
    assert second != first and not joined
    assert [(s.id, s.status, s.requests) for s in _scans(factory)] == \
        [(first, "running", 1), (second, "queued", 1)]
