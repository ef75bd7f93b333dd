"""db.insert_rows, the one statement a report's trials and new statistics rows are inserted with on PostgreSQL
(an executemany on SQLite): what it stores is what SQLAlchemy's executemany of the same rows stores, value
for value (an enum as its value, a JSON None as JSON null, not SQL NULL; floats, times, text), and with
``conflict`` the rows that meet the unique key are left out and not counted."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import func, insert, select, text

from kernelfleet.service.db import immediate, insert_rows, make_engine, make_sessionmaker
from kernelfleet.service.models import ConfigStat, Result, Trial, TrialStatus


def _trials(result_id: int, tag: str) -> list[dict[str, Any]]:
    return [
        {"result_id": result_id, "config_key": f"{tag}-a", "config": {"tg": 64, "vec": [1, 2]},
         "is_builtin": False, "status": TrialStatus.ok, "error": None, "median_us": 12.5, "p10_us": 1e-05,
         "p90_us": 3.25e-07, "n": 3, "samples_us": [12.5, 12, 13.25], "max_abs_err": 0.0, "max_rel_err": None,
         "shares_measurement_with": None},
        # a JSON None (samples capped), text with quotes and non-ASCII, an int where a float column is
        {"result_id": result_id, "config_key": f"{tag}-b \"é\"", "config": {}, "is_builtin": True,
         "status": TrialStatus.mismatch, "error": "max |err| 0.5 > 0.01\n", "median_us": 7, "p10_us": None,
         "p90_us": None, "n": 0, "samples_us": None, "max_abs_err": 1e300, "max_rel_err": 5e-324,
         "shares_measurement_with": "a"},
    ]


def _stored(session: Any, result_id: int) -> list[tuple[Any, ...]]:
    cols = [c for c in Trial.__table__.c if c.name not in ("id", "result_id", "config_key")]
    rows = session.execute(select(Trial.config_key, *cols).where(Trial.result_id == result_id)
                           .order_by(Trial.config_key)).all()
    # JSON null is stored as JSON, not as SQL NULL: a query on the column tells them apart
    nulls = session.scalar(select(func.count()).select_from(Trial).where(Trial.result_id == result_id,
                                                                          Trial.samples_us.is_(None)))
    return [(r[0].split("-", 1)[1], *r[1:]) for r in rows] + [("sql nulls", nulls)]


def test_insert_rows_stores_what_executemany_stores(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    try:
        with factory() as session, immediate(session):
            ids = []
            for _ in range(2):
                r = Result(kernel="rmsnorm", shape="1x64", dtype="float32", chip="c", backend="cpu",
                           mlx_version="0", os="", driver="", kernel_hash="h", strategy="s", source="import",
                           payload_digest=f"d{len(ids)}", response={}, golden={}, best_is_builtin=False)
                session.add(r)
                session.flush()
                ids.append(r.id)
            session.execute(insert(Trial.__table__), _trials(ids[0], "x"))  # SQLAlchemy's executemany
            assert insert_rows(session, Trial.__table__, _trials(ids[1], "y")) == 2
            assert insert_rows(session, Trial.__table__, []) == 0
        with factory() as session:
            assert _stored(session, ids[0]) == _stored(session, ids[1])
            assert _stored(session, ids[1])[-1] == ("sql nulls", 0)
    finally:
        engine.dispose()


def test_insert_rows_leaves_out_and_does_not_count_rows_on_the_conflict_key(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    key = ["chip", "backend", "mlx_version", "kernel", "shape", "dtype", "kernel_hash", "config_key"]
    when = datetime(2026, 12, 2, 7, 30, 0, 123456, tzinfo=UTC)

    def row(config_key: str, runs: int) -> dict[str, Any]:
        return {"chip": "c", "backend": "cpu", "mlx_version": "0", "kernel": "k", "shape": "1", "dtype": "f",
                "kernel_hash": "h", "config_key": config_key, "config": {}, "is_builtin": False, "runs": runs,
                "imported_runs": 0, "worker_ids": [], "first_seen_at": when, "last_seen_at": when,
                "last_result_id": 1, "medians_us": [1.5], "speedups": [], "center_us": 1.5, "spread": 0.0,
                "speedup": None, "speedup_lo": None, "speedup_hi": None}
    try:
        with factory() as session, immediate(session):
            assert insert_rows(session, ConfigStat.__table__, [row("a", 1), row("b", 1)], conflict=key) == 2
            assert insert_rows(session, ConfigStat.__table__, [row("b", 2), row("c", 2)], conflict=key) == 1
            # an integer over 64 bits (orjson refuses it: json.dumps writes the rows, times included)
            big = {**row("d", 3), "worker_ids": [2**70]}
            assert insert_rows(session, ConfigStat.__table__, [big], conflict=key) == 1
        with factory() as session:
            got = session.execute(select(ConfigStat.config_key, ConfigStat.runs, ConfigStat.first_seen_at)
                                  .order_by(ConfigStat.config_key)).all()
            assert [(k, n) for k, n, _ in got] == [("a", 1), ("b", 1), ("c", 2), ("d", 3)]  # b kept its first
            ids = session.scalar(select(ConfigStat.worker_ids).where(ConfigStat.config_key == "d"))
            assert ids == [2**70]
            stamps = {t if t.tzinfo else t.replace(tzinfo=UTC) for _, _, t in got}
            assert stamps == {when}
            assert session.execute(text("SELECT count(*) FROM config_stats")).scalar() == 4
    finally:
        engine.dispose()
