"""The regression engine's scan on a stored series, called directly (no server; SQLite and, with
KERNELFLEET_TEST_POSTGRES_URL, PostgreSQL): an alert the scan moves one run early (an odd run just
before the step) is put back at its first slower run by the re-placement."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from test_regressions_api import CHIP, make_report

from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import Regression, RegressionStatus
from kernelfleet.service.regressions import base, engine
from kernelfleet.service.regressions.attribution import attribute, group_key
from kernelfleet.service.regressions.changepoint import ChangePointDetector
from kernelfleet.service.regressions.locate import locate
from kernelfleet.service.regressions.series import SeriesKey, load_runs
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

SHAPE = "4096x4096"
MIN_EFFECT = 0.03


@pytest.fixture
def factory(migrated_db_url: str) -> Iterator[sessionmaker[Session]]:
    db = make_engine(migrated_db_url)
    yield make_sessionmaker(db)
    db.dispose()


def store(factory: sessionmaker[Session], levels: list[float], mlx_at: int, seed: int) -> list[int]:
    """One imported report per level (the MLX upgrade at run ``mlx_at``); their result ids."""
    rng = np.random.default_rng(seed)
    ids = []
    with factory() as session, immediate(session):
        for i, level in enumerate(levels):
            report = make_report(SHAPE, level, rng=rng, mlx="0.32.4" if i >= mlx_at else "0.32.3")
            ids.append(store_report(session, TuningReport.model_validate(report), source="import").id)
    return ids


def test_scan_keeps_an_alert_at_its_first_slower_run_despite_an_odd_run_before_it(
    factory: sessionmaker[Session], migrated_db_url: str
) -> None:
    # +10 % from run 12 (the MLX upgrade), run 11 an odd run 6 % slow: the scan's tamed split cuts
    # at 11, one run early; the re-placement (locate) puts the alert back at 12
    rng = np.random.default_rng(100)
    levels = [(100.0 if i < 12 else 110.0) * float(np.exp(rng.normal(0, 0.004))) for i in range(20)]
    levels[11] *= 1.06
    ids = store(factory, levels, mlx_at=12, seed=0)
    key = SeriesKey(chip=CHIP, kernel="rmsnorm", shape=SHAPE, dtype="float16")
    with factory() as session:
        runs = load_runs(session, key)
    assert [r.result_id for r in runs] == ids
    # the premise: the scan finds the change one run early and would move the alert there, while
    # the maximum-likelihood placement puts it at run 12
    [found] = ChangePointDetector().scan(runs, MIN_EFFECT)
    assert found.index == 11 and base.relocates(12, found, MIN_EFFECT)
    assert locate(runs, [11]) == [12]
    cause = attribute(runs[11], runs[12])
    with factory() as session, immediate(session):  # the alert the online detector confirmed
        session.add(Regression(
            group_key=group_key("rmsnorm", key.as_tuple(), cause), kernel="rmsnorm", shape=SHAPE,
            dtype="float16", chip=key.chip, config_key="tg=256,vec=4", status=RegressionStatus.open,
            detector="step", baseline_median_us=runs[11].median_us, new_median_us=runs[12].median_us,
            effect=0.1, p_value=1e-4, cause=cause, baseline_result_id=ids[11], result_id=ids[12]))
    report = engine.scan(factory, Settings(database_url=migrated_db_url))
    with factory() as session:
        [reg] = session.scalars(select(Regression)).all()
        assert (reg.result_id, reg.baseline_result_id) == (ids[12], ids[11])
        assert reg.cause == {"mlx_version": ["0.32.3", "0.32.4"]}
    assert report.created == [] and report.moved == []  # moved early, then back: where it was
