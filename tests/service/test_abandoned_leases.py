"""Lease requests whose clients went away leave no job leased to nobody and spend no attempt.

Two ways a client gives up: it times out while its lease request is still long-polling on the
coordinator (work arrives after it left), or it gets a lease and vanishes before confirming it
(its first heartbeat). Afterwards every job is queued again with no attempt spent, and a real
worker can run them all.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
from conftest import Coordinator
from coordinator_helpers import complete, create_campaign, enroll, lease, shapes
from prometheus_client.parser import text_string_to_metric_families

FAST = {"KERNELFLEET_LEASE_CONFIRM_SECONDS": "1", "KERNELFLEET_REAPER_INTERVAL_SECONDS": "0.2",
        "KERNELFLEET_LEASE_POLL_SECONDS": "0.2"}
JOBS = 20


def jobs(coordinator: Coordinator) -> list[dict[str, Any]]:
    with coordinator.admin() as admin:
        return list(admin.get("/jobs").json())


def settled(coordinator: Coordinator, timeout: float = 60.0) -> list[dict[str, Any]]:
    """The jobs once none is leased any more."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        now = jobs(coordinator)
        if not any(j["state"] == "leased" for j in now):
            return now
        time.sleep(0.2)
    raise AssertionError(f"jobs still leased: {[j for j in jobs(coordinator) if j['state'] == 'leased']}")


async def give_up_while_waiting(coordinator: Coordinator, tokens: list[str]) -> int:
    """Each client asks for a lease that may wait 5 s but gives up after 0.5 s; the work is queued
    after they all gave up, while the coordinator could still be waiting for them."""
    async def one(token: str) -> int:
        async with httpx.AsyncClient(base_url=coordinator.url + "/api/v1", timeout=0.5,
                                     headers={"Authorization": f"Bearer {token}"}) as c:
            try:
                await c.post("/leases", json={"wait_seconds": 5})
            except httpx.TimeoutException:
                return 1
        return 0

    before = lease_requests_ended(coordinator)
    tasks = [asyncio.create_task(one(t)) for t in tokens]
    gave_up = sum(await asyncio.gather(*tasks))
    await asyncio.to_thread(create_campaign, coordinator, shapes=shapes(JOBS))
    # the abandoned requests' long-polls are still running on the server: until each has ended there
    # (the work woke it, or it saw its client gone), whatever it did with the work
    deadline = time.monotonic() + 60.0  # a stall detector: they end within about a second
    while (ended := await asyncio.to_thread(lease_requests_ended, coordinator)) < before + len(tokens):
        assert time.monotonic() < deadline, f"{before + len(tokens) - ended} abandoned requests still running"
        await asyncio.sleep(0.1)
    return gave_up


def lease_requests_ended(coordinator: Coordinator) -> float:
    """How many lease requests the coordinator has finished (its /metrics: an in-thread one counts
    this process's)."""
    r = httpx.get(coordinator.url + "/metrics", timeout=30.0)
    assert r.status_code == 200, r.text
    return sum(s.value for family in text_string_to_metric_families(r.text) for s in family.samples
               if s.name == "kernelfleet_http_requests_total" and s.labels.get("route") == "/api/v1/leases")


def test_abandoned_lease_requests_leave_nothing_leased(coordinator_factory: Any) -> None:
    coordinator: Coordinator = coordinator_factory(**FAST)
    tokens = [enroll(coordinator, f"w{i}")[1] for i in range(10)]
    assert asyncio.run(give_up_while_waiting(coordinator, tokens)) == len(tokens)
    after_wait = settled(coordinator)
    assert len(after_wait) == JOBS
    assert all(j["state"] == "queued" and j["attempts"] == 0 for j in after_wait), after_wait

    # leased, then the client vanishes before confirming (as if the answer never reached it)
    with coordinator.client(tokens[0]) as c:
        vanished = [lease(c, confirm=False) for _ in range(5)]
    assert all(v is not None for v in vanished)
    after_vanish = settled(coordinator)
    assert all(j["state"] == "queued" and j["attempts"] == 0 for j in after_vanish), after_vanish

    with coordinator.client(tokens[1]) as c:  # a worker that stays runs every job
        while (got := lease(c)) is not None:
            assert complete(c, got).status_code == 201
    done = jobs(coordinator)
    assert all(j["state"] == "done" and j["attempts"] == 1 for j in done), done
