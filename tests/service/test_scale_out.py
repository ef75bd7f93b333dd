"""Several coordinator processes on one database: ``kernelfleet serve --workers 2``, and two
replicas that share nothing but the database (as docker-compose.yml runs them). A lease taken
through one process is heartbeated, completed and reaped through any other; the reaper runs in one
process at a time (service/locks.py)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease

FAST = {"KERNELFLEET_LEASE_SECONDS": "1", "KERNELFLEET_REAPER_INTERVAL_SECONDS": "0.2",
        "KERNELFLEET_REQUEUE_BACKOFF_SECONDS": "0.2"}


@pytest.fixture
def two_processes(migrated_db_url: str, tmp_path: Path) -> Iterator[Coordinator]:
    c = Coordinator(db_url=migrated_db_url, workdir=tmp_path, env_overrides=FAST,
                    serve_args=("--workers", "2"))
    c.start(timeout=60.0)
    yield c
    c.stop()


def wait_for(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if got := what():
            return got
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def test_serve_workers_share_leases_and_reap_once(two_processes: Coordinator) -> None:
    c = two_processes
    create_campaign(c)  # one job
    _, gone = enroll(c, "gone")
    _, alive = enroll(c, "alive")
    with c.client(gone) as g, c.client(alive) as a:
        first = lease(g)
        assert first is not None
        second = wait_for(lambda: lease(a))  # the vanished worker's lease expired and was reaped
        assert second["job_id"] == first["job_id"]
        with c.admin() as admin:
            state = admin.get(f"/jobs/{first['job_id']}").json()
        assert state["attempts"] == 2 and "lease expired" in state["last_error"]  # reaped once
        assert complete(a, second).status_code == 201


@pytest.mark.coordinator_process  # replicas: one process each
def test_two_replicas_share_nothing_but_the_database(coordinator_factory: Any) -> None:
    a, b = coordinator_factory(), coordinator_factory()  # two `kernelfleet serve` on one database
    create_campaign(a)
    _, token = enroll(b)
    with a.client(token) as via_a, b.client(token) as via_b:
        got = lease(via_a)
        assert got is not None
        hb = via_b.post(f"/jobs/{got['job_id']}/heartbeat", json={"lease_token": got["lease_token"]})
        assert hb.status_code == 200, hb.text
        assert complete(via_b, got).status_code == 201
        assert complete(via_a, got).status_code == 200  # the replay, answered by the other replica
    with b.admin() as admin:
        assert admin.get("/jobs").json()[0]["state"] == "done"
