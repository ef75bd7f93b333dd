"""Expired leases are requeued (with backoff) and finished by another worker; failures end dead."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease

FAST = {"KERNELFLEET_LEASE_SECONDS": "1", "KERNELFLEET_REAPER_INTERVAL_SECONDS": "0.2",
        "KERNELFLEET_REQUEUE_BACKOFF_SECONDS": "0.2"}


def wait_for(what: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = what()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError("condition not reached")


def job(coordinator: Coordinator, job_id: int) -> dict[str, Any]:
    with coordinator.admin() as admin:
        return dict(admin.get(f"/jobs/{job_id}").json())


def test_vanished_worker_lease_is_requeued_and_completed_by_another(coordinator_factory: Any) -> None:
    coordinator: Coordinator = coordinator_factory(**FAST)
    create_campaign(coordinator)
    _, gone = enroll(coordinator, "gone")
    _, alive = enroll(coordinator, "alive")
    with coordinator.client(gone) as g, coordinator.client(alive) as a:
        first = lease(g)
        assert first is not None and first["lease_seconds"] == 1.0
        assert lease(a) is None  # the only job is leased
        # the first worker disappears: no heartbeat, no result
        second = wait_for(lambda: lease(a))
        assert second["job_id"] == first["job_id"] and second["lease_token"] != first["lease_token"]
        state = job(coordinator, first["job_id"])
        assert state["attempts"] == 2 and "lease expired" in state["last_error"]
        assert complete(a, second).status_code == 201
        late = complete(g, first)  # the vanished worker comes back too late
        assert late.status_code == 409, late.text
        late_hb = g.post(f"/jobs/{first['job_id']}/heartbeat", json={"lease_token": first["lease_token"]})
        assert late_hb.status_code == 409
    done = job(coordinator, first["job_id"])
    assert done["state"] == "done" and done["finished_at"] is not None


def test_job_failing_max_attempts_times_is_dead(coordinator_factory: Any) -> None:
    coordinator: Coordinator = coordinator_factory(**FAST)
    create_campaign(coordinator, max_attempts=3)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        for attempt in (1, 2, 3):
            got = wait_for(lambda: lease(c))
            r = c.post(f"/jobs/{got['job_id']}/fail", json={"lease_token": got["lease_token"],
                                                           "error": f"launch failed #{attempt}"})
            assert r.status_code == 200, r.text
            body = r.json()
            assert body["attempts"] == attempt
            assert body["state"] == ("dead" if attempt == 3 else "queued")
            if attempt < 3:
                assert body["available_at"] is not None  # backoff before the next try
        assert lease(c) is None
        dead = job(coordinator, got["job_id"])
        assert dead["state"] == "dead" and dead["last_error"] == "launch failed #3"
        again = c.post(f"/jobs/{got['job_id']}/fail", json={"lease_token": got["lease_token"], "error": "x"})
        assert again.status_code == 409 and "dead" in again.json()["detail"]
    with coordinator.admin() as admin:
        assert admin.get("/jobs", params={"state": "dead"}).json()[0]["id"] == got["job_id"]


def test_expired_leases_count_as_attempts_until_dead(coordinator_factory: Any) -> None:
    coordinator: Coordinator = coordinator_factory(**FAST)
    create_campaign(coordinator, max_attempts=2)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        first = wait_for(lambda: lease(c))
        second = wait_for(lambda: lease(c))  # after the first lease expired and the backoff passed
        assert second["job_id"] == first["job_id"]
        wait_for(lambda: job(coordinator, first["job_id"])["state"] == "dead")
        assert lease(c) is None
        assert complete(c, second).status_code == 409
    with coordinator.admin() as admin:
        campaign = admin.get("/campaigns").json()[0]
    assert campaign["progress"]["dead"] == 1 and campaign["progress"]["done"] == 0


def test_backoff_grows_exponentially() -> None:
    from kernelfleet.service.leasing import backoff_seconds

    assert [backoff_seconds(n, 5.0, 300.0) for n in (1, 2, 3, 4)] == [5.0, 10.0, 20.0, 40.0]
    assert backoff_seconds(20, 5.0, 300.0) == 300.0
