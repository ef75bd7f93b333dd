"""An incremental profile build (service/series_summaries.py: only the series changed since the last
build are read again) stores exactly the profile a build from every stats row makes, after each of
several result batches, and it reads only the changed series' rows; a result that commits after a
newer one was seen (PostgreSQL) still reaches the next build."""

from __future__ import annotations

from typing import Any

import pytest
from coordinator_helpers import make_report, measured_shapes
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import aggregates, profile_builder, profiles, series_summaries
from kernelfleet.service.db import immediate, make_engine, make_sessionmaker
from kernelfleet.service.models import ConfigStat, ProfileRequest
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

H100, H200, M3 = "NVIDIA H100 80GB HBM3", "NVIDIA H200", "Apple M3 Max"
CHIPS = {H100: "cuda", H200: "cuda", M3: "metal"}


def _store(session: Session, chip: str, shape: str, median: float, *, kernel: str = "rmsnorm",
           mlx_version: str | None = None, kernel_hash: str | None = None) -> None:
    report = make_report(kernel=kernel, shape=shape, chip=chip, backend=CHIPS[chip], median=median)
    if mlx_version is not None:
        report["env"]["mlx_version"] = mlx_version
    if kernel_hash is not None:  # another kernel source
        report["env"]["kernel_hash"] = kernel_hash
    store_report(session, TuningReport.model_validate(report), source="import")


def _from_scratch(factory: sessionmaker[Session], settings: Settings) -> dict[tuple[str, str | None], Any]:
    """Every chip's profile bodies as a build from all the stats rows makes them."""
    out: dict[tuple[str, str | None], Any] = {}
    with factory() as session:
        for chip in CHIPS:
            versions = sorted(session.scalars(
                select(ConfigStat.mlx_version).where(ConfigStat.chip == chip).distinct()))
            for version in [None, *versions]:
                out[(chip, version)] = profiles.build_body(
                    session, chip, version, threshold=settings.prediction_min_confidence)
    return out


def _stored(factory: sessionmaker[Session]) -> dict[tuple[str, str | None], Any]:
    out: dict[tuple[str, str | None], Any] = {}
    with factory() as session:
        for chip in CHIPS:
            for version in (None, "0.32.4", "0.33.0"):
                row = profiles.latest(session, chip, version)
                if row is not None:
                    out[(chip, version)] = {k: v for k, v in row.body.items() if k not in ("version", "etag")}
    return out


def test_incremental_builds_store_what_a_full_build_makes(migrated_db_url: str,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    series_summaries.forget()
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    settings = Settings(database_url=migrated_db_url, profile_min_interval_seconds=0)
    loaded: list[int] = []
    load_rows = aggregates.load_rows

    def counted(*args: Any, **kwargs: Any) -> Any:
        rows = load_rows(*args, **kwargs)
        loaded.append(len(rows))
        return rows

    monkeypatch.setattr(aggregates, "load_rows", counted)
    batches: list[list[tuple[str, str, float, dict[str, Any]]]] = [
        [(H100, "1x4096", 10.0, {}), (H200, "1x4096", 8.0, {}), (M3, "1x4096", 30.0, {})],
        [(H100, "32x4096", 12.0, {}), (H200, "4096x4096", 50.0, {}), (H100, "1x4096", 14.0, {})],
        [(H200, "32x4096", 9.0, {"kernel": "softmax"}), (M3, "32x4096", 31.0, {}),
         (H100, "1x4096", 11.0, {"mlx_version": "0.33.0"})],
        [(H200, "1x4096", 7.0, {}), (H100, "32x4096", 6.0, {"kernel": "softmax"}),
         (H100, "1x4096", 20.0, {"kernel_hash": "a-newer-source"})],
        # (the process restarts before it: a full reload reads only each series' newest source) the
        # older source reports again and is the newest once more
        [(H100, "1x4096", 9.0, {}), (M3, "4096x4096", 40.0, {})],
    ]
    try:
        for number, batch in enumerate(batches):
            restart = number == 3
            if restart:
                series_summaries.forget()
            with factory() as session, immediate(session):
                for chip, shape, median, extra in batch:
                    _store(session, chip, shape, median, **extra)
            loaded.clear()
            for chip in CHIPS:
                with factory() as session, immediate(session):  # a request per chip: every chip builds
                    session.add(ProfileRequest(chip=chip))
                assert profile_builder.build_chip(factory, chip, settings)
            if number > 0 and not restart:  # a build reads only the rows of the series changed since
                changed = {(chip, extra.get("kernel", "rmsnorm"), shape) for chip, shape, _, extra in batch}
                assert 0 < sum(loaded) <= 2 * len(changed) * len(CHIPS)  # 2 rows a series, per build
            loaded.clear()
            monkeypatch.setattr(aggregates, "load_rows", load_rows)
            scratch = _from_scratch(factory, settings)
            expected = {key: body for key, body in scratch.items() if body is not None}
            monkeypatch.setattr(aggregates, "load_rows", counted)
            assert _stored(factory) == expected, f"after batch {number}"
        assert (H100, "0.33.0") in expected and expected[(M3, None)]["counts"]["measured"] == 3
        entries = expected[(H100, None)]["entries"]
        again = next(e for e in entries if e["shape"] == "1x4096" and not e["predicted"])
        assert again["kernel_hash"] != "a-newer-source" and again["mlx_version"] == "0.32.4"  # older source
    finally:
        series_summaries.forget()
        engine.dispose()


def test_a_result_committed_after_a_newer_one_reaches_the_next_build(migrated_db_url: str) -> None:
    if migrated_db_url.startswith("sqlite"):
        pytest.skip("SQLite serializes writers: ids commit in order")
    series_summaries.forget()
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    settings = Settings(database_url=migrated_db_url, profile_min_interval_seconds=0)

    try:
        with factory() as session, session.begin():
            _store(session, H100, "1x4096", 10.0)
        assert profile_builder.build_chip(factory, H100, settings)
        late = factory()
        late.begin()
        _store(late, H100, "2x4096", 10.0)
        late.flush()  # its result has its id now; it commits after a newer one
        with factory() as session, session.begin():
            _store(session, H100, "4x4096", 10.0)
        assert profile_builder.build_chip(factory, H100, settings)
        # the late one's id is a gap below the newest seen
        assert measured_shapes(factory, H100) == {"1x4096", "4x4096"}
        late.commit()
        late.close()
        assert profile_builder.build_chip(factory, H100, settings)
        assert measured_shapes(factory, H100) == {"1x4096", "2x4096", "4x4096"}
    finally:
        series_summaries.forget()
        engine.dispose()
