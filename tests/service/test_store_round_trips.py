"""Storing a result takes a handful of statements (each a round trip to a remote database; an
executemany is one pipelined trip on psycopg), whatever the report's trial count: counted with
SQLAlchemy's ``before_cursor_execute`` around ``store_report`` of a committed H100 report, and
around a worker's whole result request (test_completion_round_trips.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from sqlalchemy import event, func, select

from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import ConfigStat, ProfileRequest, ResultEvent
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport

REPORT = Path(__file__).parents[2] / "benchmarks" / "results" / "h100_session_tuning.jsonl"


def test_a_result_is_stored_in_a_handful_of_statements(migrated_db_url: str) -> None:
    report = TuningReport.model_validate(json.loads(REPORT.open().readline()))
    assert len(report.trials) >= 20
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    statements: list[str] = []

    def count(conn: Any, cursor: Any, statement: str, *args: Any) -> None:
        statements.append(statement.split(None, 1)[0].upper())

    sqlite = migrated_db_url.startswith("sqlite")
    try:
        counts = []
        for source in ("import", "lease"):  # a new series, then a second run of the same series
            with factory() as session, immediate(session):
                event.listen(engine, "before_cursor_execute", count)
                statements.clear()
                store_report(session, report, source=source)
                event.remove(engine, "before_cursor_execute", count)
                counts.append(list(statements))
        # new series: the result, its trials, its stats rows (all new: nothing read back), and the
        # profile request with the result's event (one statement on PostgreSQL)
        assert counts[0] == (["INSERT"] * 5 if sqlite else ["INSERT"] * 3 + ["WITH"]), counts[0]
        # a second run of the series: its stats rows are read (FOR UPDATE) and updated, both once
        queued = ["INSERT"] * 2 if sqlite else ["WITH"]
        assert counts[1] == ["INSERT"] * 3 + ["SELECT", "UPDATE", *queued], counts[1]
        with factory() as session:
            ok = sum(1 for t in report.trials if t.status == "ok" and t.median_us)
            assert session.scalar(select(func.count()).select_from(ConfigStat)) == ok
            assert set(session.scalars(select(ConfigStat.runs))) == {2}
            assert session.scalar(select(func.count()).select_from(ProfileRequest)) == 2
            assert session.scalar(select(func.count()).select_from(ResultEvent)) == 2
    finally:
        engine.dispose()
