"""Profile building is background work: a slow build never holds up results, leases or heartbeats,
two coordinator replicas on one database never build the same chip's profile at once, and a build
answers only the requests whose results it saw."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Any

import pytest
from conftest import POSTGRES_URL, Coordinator
from coordinator_helpers import create_campaign, enroll, lease, make_report, measured_shapes, shapes
from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet.service import profile_builder, series_summaries
from kernelfleet.service.db import make_engine, make_sessionmaker
from kernelfleet.service.models import ProfileBuild, ProfileRequest, Result
from kernelfleet.service.reports import store_report
from kernelfleet.service.schemas import TuningReport
from kernelfleet.service.settings import Settings

CHIP = "NVIDIA H100 80GB HBM3"


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _rows(coordinator: Coordinator, query: Any) -> list[Any]:
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            return list(conn.execute(query).all())
    finally:
        engine.dispose()


def _wait_idle(coordinator: Coordinator, timeout: float = 60.0) -> None:
    """Until the builders have answered every queued request."""
    deadline = time.monotonic() + timeout
    while _rows(coordinator, select(ProfileRequest.id)):
        assert time.monotonic() < deadline, "profile requests still queued"
        time.sleep(0.2)


def test_a_slow_build_holds_up_no_request(coordinator_factory: Any) -> None:
    delay = 6.0
    coordinator = coordinator_factory(KERNELFLEET_PROFILE_BUILD_DELAY_SECONDS=str(delay))
    jobs = 6
    create_campaign(coordinator, shapes=shapes(jobs))
    _, token = enroll(coordinator)
    with coordinator.admin() as admin:  # something to build: the first build starts within 0.2 s
        assert admin.post("/results/import", json={"reports": [make_report()]}).status_code == 201
    time.sleep(1.0)
    slowest = 0.0
    posted: list[tuple[datetime, datetime]] = []  # each result request's span: stored within it
    with coordinator.client(token) as c:
        for _ in range(jobs):
            t = time.monotonic()
            got = lease(c)
            assert got is not None
            hb = c.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
            assert hb.status_code == 200, hb.text
            report = make_report(kernel=got["kernel"], shape=got["shape"], dtype=got["dtype"])
            sent = datetime.now(UTC)
            r = c.post(f"/jobs/{got['job_id']}/result",
                       json={"lease_token": got["lease_token"], "report": report})
            posted.append((sent, datetime.now(UTC)))
            assert r.status_code == 201, r.text
            slowest = max(slowest, time.monotonic() - t)
    # each lease + heartbeat + result round took less than one build: none waited for a build (the bound
    # is the build itself, not half of it: a loaded CI host once took 3.4 s for a round; `during` below
    # is the sharper proof)
    assert slowest < delay, f"a lease/heartbeat/result round took {slowest:.1f} s"
    _wait_idle(coordinator)
    builds = _rows(coordinator, select(ProfileBuild.started_at, ProfileBuild.finished_at))
    assert len(_rows(coordinator, select(Result.id).where(Result.source == "lease"))) == jobs
    assert all((_utc(f) - _utc(s)).total_seconds() >= delay - 0.5 for s, f in builds)
    # and results were stored while a build was running (they did not queue behind it): requests
    # that began and ended inside a build (timed here, on the database's host clock: a result's
    # created_at on SQLite has whole seconds only)
    during = [p for p in posted if any(_utc(s) < p[0] and p[1] < _utc(f) for s, f in builds)]
    assert during, f"no result stored during a build: builds {builds}, result requests {posted}"
    # the results of those 6 jobs were coalesced into fewer builds than results
    assert len(builds) < jobs + 1


@pytest.mark.coordinator_process  # replicas: one process each, locks shared only through the database
def test_two_replicas_never_build_one_chip_at_once(coordinator_factory: Any) -> None:
    env = {"KERNELFLEET_PROFILE_BUILD_DELAY_SECONDS": "0.4"}
    first, second = coordinator_factory(**env), coordinator_factory(**env)
    chips = [CHIP, "NVIDIA H200", "NVIDIA A100 80GB"]
    for round_ in range(8):
        target = (first, second)[round_ % 2]
        with target.admin() as admin:
            reports = [make_report(chip=chip, shape=f"{round_ + 1}x4096", median=10.0 + round_)
                       for chip in chips]
            assert admin.post("/results/import", json={"reports": reports}).status_code == 201
        time.sleep(0.3)
    _wait_idle(first)
    builds = _rows(first, select(ProfileBuild.chip, ProfileBuild.builder, ProfileBuild.started_at,
                                 ProfileBuild.finished_at).order_by(ProfileBuild.started_at))
    assert {b.chip for b in builds} == set(chips)
    for chip in chips:
        mine = [b for b in builds if b.chip == chip]
        for earlier, later in zip(mine, mine[1:], strict=False):
            assert _utc(later.started_at) >= _utc(earlier.finished_at), (
                f"{chip}: a build by {later.builder} started before {earlier.builder}'s finished")
    if "postgresql" in first.db_url:  # per-chip locks: both replicas take part
        assert len({b.builder for b in builds}) == 2
    # every chip's final profile holds all 8 rounds' shapes
    for chip in chips:
        body = first.profile(chip)
        measured = {e["shape"] for e in body["entries"] if not e["predicted"]}
        assert {f"{n}x4096" for n in range(1, 9)} <= measured


def test_a_busy_chip_is_rebuilt_at_most_once_per_interval(coordinator_factory: Any) -> None:
    # results keep arriving for one chip: its requests coalesce into one build per interval (3 s here)
    coordinator = coordinator_factory(KERNELFLEET_PROFILE_MIN_INTERVAL_SECONDS="3")
    with coordinator.admin() as admin:
        for n in range(6):
            report = make_report(shape=f"{n + 1}x4096")
            assert admin.post("/results/import", json={"reports": [report]}).status_code == 201
            time.sleep(1.0)
    _wait_idle(coordinator)
    builds = _rows(coordinator, select(ProfileBuild.started_at, ProfileBuild.finished_at,
                                       ProfileBuild.requests)
                   .where(ProfileBuild.chip == CHIP).order_by(ProfileBuild.started_at))
    # the imports span 5 s: the first one's build, then at least one for the later ones
    assert len(builds) >= 2 and sum(b.requests for b in builds) >= 6  # calibrations queue some too
    for earlier, later in zip(builds, builds[1:], strict=False):
        assert (_utc(later.started_at) - _utc(earlier.finished_at)).total_seconds() >= 3.0
    # nothing was lost to the coalescing: the last version holds every shape
    measured = {e["shape"] for e in coordinator.profile(CHIP)["entries"] if not e["predicted"]}
    assert {f"{n}x4096" for n in range(1, 7)} <= measured


@pytest.mark.skipif(not POSTGRES_URL, reason="PostgreSQL only (KERNELFLEET_TEST_POSTGRES_URL)")
@pytest.mark.parametrize("db_url", ["postgres"], indirect=True)
def test_a_request_committed_after_a_newer_one_is_not_answered_unseen(
        migrated_db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """PostgreSQL hands out a request's id at insert, not at commit: a result whose transaction got
    id N but committed after the builder read the queue (and the stats) is still queued after that
    build, and the next build holds it. (SQLite: one writer at a time, so ids follow commit order.)"""
    engine = make_engine(migrated_db_url)
    factory = make_sessionmaker(engine)
    settings = Settings(database_url=migrated_db_url, profile_min_interval_seconds=0)

    def store(session: Session, shape: str) -> None:
        store_report(session, TuningReport.model_validate(make_report(shape=shape)), source="import")

    try:
        with factory() as session, session.begin():
            store(session, "1x4096")
        assert profile_builder.build_pending(factory, settings) == 1
        late = factory()
        late.begin()
        store(late, "2x4096")
        late.flush()  # its request has its id now; the transaction commits later
        with factory() as session, session.begin():  # a newer request commits first
            session.add(ProfileRequest(chip=CHIP))
        refresh = series_summaries.SeriesCache.refresh

        def then_commit(*args: Any, **kwargs: Any) -> Any:  # the build has read the stats: commit now
            changed = refresh(*args, **kwargs)
            if late.in_transaction():
                late.commit()
            return changed

        monkeypatch.setattr(series_summaries.SeriesCache, "refresh", then_commit)
        assert profile_builder.build_pending(factory, settings) == 1
        late.close()
        assert measured_shapes(factory, CHIP) == {"1x4096"}  # built before the late result committed ...
        assert profile_builder.build_pending(factory, settings) == 1  # ... whose request is still queued
        assert measured_shapes(factory, CHIP) == {"1x4096", "2x4096"}
    finally:
        engine.dispose()
