"""Restarting the coordinator in the middle of a campaign loses nothing."""

from __future__ import annotations

import pytest
from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease, shapes

# a coordinator process stopped and started mid-campaign
pytestmark = pytest.mark.coordinator_process


def test_restart_mid_campaign_loses_nothing(coordinator: Coordinator) -> None:
    campaign = create_campaign(coordinator, shapes=shapes(10))
    worker_id, token = enroll(coordinator)
    with coordinator.client(token) as c:
        done = [lease(c) for _ in range(4)]
        for got in done:
            assert got is not None and complete(c, got).status_code == 201
        held = lease(c)
        assert held is not None
        with coordinator.admin() as admin:
            jobs_before = admin.get("/jobs").json()
            workers_before = admin.get("/workers").json()

    coordinator.stop()
    coordinator.start()

    with coordinator.admin() as admin:
        assert admin.get(f"/campaigns/{campaign['id']}").json()["progress"] == {
            "total": 10, "queued": 5, "leased": 1, "done": 4, "dead": 0, "cancelled": 0}
        assert [(j["id"], j["state"], j["attempts"]) for j in admin.get("/jobs").json()] == \
            [(j["id"], j["state"], j["attempts"]) for j in jobs_before]
        assert [w["id"] for w in admin.get("/workers").json()] == [w["id"] for w in workers_before]
    with coordinator.client(token) as c:
        # the worker's token, its lease and replays of accepted results all survive the restart
        assert c.get("/workers/me").json()["id"] == worker_id
        first = done[0]
        assert first is not None
        assert complete(c, first).status_code == 200
        assert c.post(f"/jobs/{held['job_id']}/heartbeat",
                      json={"lease_token": held["lease_token"]}).status_code == 200
        assert complete(c, held).status_code == 201
        while (got := lease(c)) is not None:
            assert complete(c, got).status_code == 201
    with coordinator.admin() as admin:
        assert admin.get(f"/campaigns/{campaign['id']}").json()["progress"]["done"] == 10
