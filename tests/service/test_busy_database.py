"""A database that does not answer, made so by a table lock another connection holds (PostgreSQL;
in-thread coordinator):

- ``/healthz``: a lock on the jobs table (which leases, heartbeats and results all need) makes it
  503 "unresponsive" within its bound, not "ok"; "ok" again once the lock goes.
- public reads: readers stuck on a locked table hold at most their slots; one more gets 503 with
  Retry-After, while a worker's heartbeat goes through."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease
from sqlalchemy import text

from kernelfleet.service.db import make_engine


def test_healthz_reports_a_database_that_does_not_answer(coordinator_factory: Any,
                                                         migrated_db_url: str) -> None:
    if migrated_db_url.startswith("sqlite"):
        pytest.skip("a table lock that blocks readers: PostgreSQL")
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_HEALTHZ_TIMEOUT_SECONDS="0.5")
    assert httpx.get(coordinator.url + "/healthz", timeout=10).json()["database"] == "ok"
    engine = make_engine(coordinator.db_url)
    try:
        with engine.connect() as conn:
            conn.execute(text("LOCK TABLE jobs IN ACCESS EXCLUSIVE MODE"))
            r = httpx.get(coordinator.url + "/healthz", timeout=10)  # the lock is held for good: bounded
            assert r.status_code == 503, r.text
            assert r.json()["database"] == "unresponsive" and "0.5 s" in r.json()["detail"]
            assert r.headers["retry-after"] == "5"
            conn.rollback()  # the lock goes
        deadline = time.monotonic() + 5
        while (r := httpx.get(coordinator.url + "/healthz", timeout=10)).status_code != 200:
            assert time.monotonic() < deadline, r.text
            time.sleep(0.05)
        assert r.json() == {"status": "ok", "database": "ok", "detail": None}
    finally:
        engine.dispose()


def test_public_readers_cannot_take_the_workers_capacity(coordinator_factory: Any,
                                                        migrated_db_url: str) -> None:
    if migrated_db_url.startswith("sqlite"):
        pytest.skip("a table lock that blocks readers: PostgreSQL")
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_PUBLIC_READ_CONCURRENCY="2",
                                                   KERNELFLEET_PUBLIC_READ_WAIT_SECONDS="0.2")
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    engine = make_engine(coordinator.db_url)
    with coordinator.client(token) as worker, httpx.Client(base_url=coordinator.url, timeout=30) as anon:
        held = lease(worker)
        assert held is not None
        try:
            with engine.connect() as conn, ThreadPoolExecutor(2) as pool:
                conn.execute(text("LOCK TABLE profiles IN ACCESS EXCLUSIVE MODE"))
                stuck = [pool.submit(anon.get, "/api/v1/profiles") for _ in range(2)]
                deadline = time.monotonic() + 10
                while _waiting_on_locks(engine) < 2:  # both readers hold their slots, stuck on the lock
                    assert time.monotonic() < deadline, "the readers never reached the lock"
                    time.sleep(0.05)
                r = anon.get("/api/v1/profiles")
                assert r.status_code == 503, r.text
                assert r.headers["retry-after"] == "1" and "read token" in r.json()["detail"]
                beat = worker.post(f"/jobs/{held['job_id']}/heartbeat",
                                   json={"lease_token": held["lease_token"]})
                assert beat.status_code == 200, beat.text  # workers are not behind the readers
                conn.rollback()
                assert [f.result().status_code for f in stuck] == [200, 200]
        finally:
            engine.dispose()
        assert anon.get("/api/v1/profiles").status_code == 200


def _waiting_on_locks(engine: Any) -> int:
    with engine.connect() as conn:
        return int(conn.scalar(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                                    "AND datname = current_database()")))
