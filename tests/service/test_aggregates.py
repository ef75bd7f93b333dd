"""Incremental config statistics (service/aggregates.py): what one more run does to a series' rows,
and two results of one new series stored at once (PostgreSQL: concurrent transactions)."""

from __future__ import annotations

import threading

import pytest
from coordinator_helpers import make_report
from sqlalchemy import select

from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import ConfigStat
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport


def _stats(url: str) -> dict[str, ConfigStat]:
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session:
            return {r.config_key: r for r in session.scalars(select(ConfigStat))}
    finally:
        engine.dispose()


def _store(url: str, report: dict[str, object], barrier: threading.Barrier | None = None) -> None:
    engine = make_engine(url)
    try:
        with make_sessionmaker(engine)() as session, immediate(session):
            if barrier is not None:
                barrier.wait(timeout=30)
            store_report(session, TuningReport.model_validate(report), source="import")
    finally:
        engine.dispose()


def test_runs_fold_into_the_series_rows(migrated_db_url: str) -> None:
    for median in (10.0, 12.0, 11.0):
        _store(migrated_db_url, make_report(median=median))
    stats = _stats(migrated_db_url)
    assert set(stats) == {"builtin", "tg=256,vec=4"}  # the failed trial makes no row
    tuned, builtin = stats["tg=256,vec=4"], stats["builtin"]
    assert tuned.runs == builtin.runs == 3 and tuned.imported_runs == 3 and tuned.worker_ids == []
    assert tuned.medians_us == [10.0, 12.0, 11.0] and tuned.center_us == 11.0
    assert tuned.spread == pytest.approx(1.4826 * 1.0 / 11.0)
    # the built-in is 1.2x each run's tuned median: the same-run speedup, with its interval
    assert tuned.speedup == pytest.approx(1.2) and len(tuned.speedups) == 3
    assert tuned.speedup_lo is not None and tuned.speedup_lo < 1.2 < (tuned.speedup_hi or 0)
    assert tuned.first_seen_at is not None and tuned.last_seen_at is not None
    assert tuned.last_result_id == max(r.last_result_id for r in stats.values())


def test_two_results_of_one_new_series_at_once_keep_both_runs(migrated_db_url: str) -> None:
    if migrated_db_url.startswith("sqlite"):
        pytest.skip("SQLite serializes writers (BEGIN IMMEDIATE): no two transactions at once")
    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def store(median: float) -> None:
        try:
            _store(migrated_db_url, make_report(median=median), barrier)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=store, args=(m,)) for m in (10.0, 20.0)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors, errors
    stats = _stats(migrated_db_url)
    assert stats["tg=256,vec=4"].runs == 2 and sorted(stats["tg=256,vec=4"].medians_us) == [10.0, 20.0]
    assert stats["builtin"].runs == 2


def test_median_rank_is_scipys_binomial_quantile_without_scipy() -> None:
    """The order-statistic rank of the speedup interval is Binom(n, 1/2)'s 2.5 % quantile, as scipy
    gives it, for every window size and beyond; computed in exact integers so that storing a result
    never imports scipy.stats (over a second, holding the GIL, in the first result of a process)."""
    from scipy.stats import binom

    from kernelfleet.service.aggregates import _median_rank

    assert [_median_rank(n) for n in range(301)] == [int(binom.ppf(0.025, n, 0.5)) for n in range(301)]
