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
    # 3 s leases, not FAST's 1 s: the second worker's lease must outlive the checks made while it holds
    # it (a loaded CI host once took over 1 s between its lease and its result: 409)
    coordinator: Coordinator = coordinator_factory(**{**FAST, "KERNELFLEET_LEASE_SECONDS": "3"})
    create_campaign(coordinator)
    _, gone = enroll(coordinator, "gone")
    _, alive = enroll(coordinator, "alive")
    with coordinator.client(gone) as g, coordinator.client(alive) as a:
        first = lease(g)
        assert first is not None and first["lease_seconds"] == 3.0
        assert lease(a) is None  # the only job is leased
        # the first worker disappears: no heartbeat, no result
        second = wait_for(lambda: lease(a))
        assert second["job_id"] == first["job_id"] and second["lease_token"] != first["lease_token"]
        state = job(coordinator, first["job_id"])
        assert state["attempts"] == 2 and "lease expired" in state["last_error"]
        # as the agent does: a heartbeat keeps the lease, then the result
        hb = a.post(f"/jobs/{second['job_id']}/heartbeat", json={"lease_token": second["lease_token"]})
        assert hb.status_code == 200, hb.text
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


def test_a_lease_running_out_unconfirmed_mid_pass_is_refunded_not_charged(coordinator_factory: Any) -> None:
    """An unconfirmed lease that runs out between a reaper pass's refund statement and its look for
    expired leases (on SQLite each statement reads the clock anew) is not reaped as a vanished
    worker's lease (an attempt spent, a backoff): the next pass refunds it. Before the fix this was
    test_abandoned_leases failing now and then on SQLite: a job queued with 1 attempt spent."""
    from sqlalchemy import event

    from kernelfleet.service.db import make_engine, make_sessionmaker
    from kernelfleet.service.reaper import reap_once
    from kernelfleet.service.settings import Settings

    # the server's own reaper stays out of the way: this test runs the passes
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_LEASE_CONFIRM_SECONDS="600",
                                                   KERNELFLEET_REAPER_INTERVAL_SECONDS="3600")
    create_campaign(coordinator)
    _, token = enroll(coordinator)
    with coordinator.client(token) as c:
        got = lease(c, confirm=False)
    assert got is not None
    engine = make_engine(coordinator.db_url)
    ran_out: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def lease_runs_out(conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        """Just before the pass looks for expired leases (after its refund), the lease runs out."""
        looks = statement.lstrip().upper().startswith("SELECT") and "lease_expires_at <" in statement
        if looks and not ran_out:
            ran_out.append(statement)
            cursor.connection.cursor().execute(
                f"UPDATE jobs SET lease_expires_at = '2000-01-01 00:00:00' WHERE id = {int(got['job_id'])}")

    settings = Settings(database_url=coordinator.db_url)
    try:
        factory = make_sessionmaker(engine)
        assert reap_once(factory, settings) == []
        assert ran_out, "the pass never looked for expired leases"
        left = job(coordinator, got["job_id"])
        assert (left["state"], left["attempts"]) == ("leased", 1), left  # left to the next pass
        refunded = reap_once(factory, settings)
        assert [(t.job_id, t.state.value, t.attempts) for t in refunded] == [(got["job_id"], "queued", 0)]
    finally:
        engine.dispose()
    after = job(coordinator, got["job_id"])
    assert (after["state"], after["attempts"], after["last_error"]) == ("queued", 0, None), after
