"""Coordinator outage during a campaign: real worker processes keep their results in their spools,
lease nothing new, and deliver everything when the coordinator is back (SQLite and PostgreSQL).

"No storm of requeues": the coordinator was down for longer than a lease, so every lease it knew
about had expired by the database clock when it came back. A naive reaper requeues all of them at
once, each requeue costs an attempt (pushing jobs towards dead), re-runs work whose result is already
waiting in a spool, and turns that spooled result into a 409. We call any such requeue part of a
storm: a healthy recovery requeues nothing, so the test demands exactly one attempt per job and no
quarantined (refused) result.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from agent_support import (
    create_campaign,
    jobs,
    mint_enroll_token,
    results,
    start_worker,
    stop_all,
    wait_for,
    workers,
)

# a coordinator process that goes away and comes back
pytestmark = pytest.mark.coordinator_process

# Long enough that a worker on a loaded 2-core CI machine delivers its spool within the one lease
# period the restarted coordinator grants (service/reaper.py: grant_restart_grace), and that no
# lease runs out before the outage: with 5 s, a CI run under load (2026-11-28) had job 2's lease
# requeued before the coordinator was stopped, its result refused with 409 (heartbeats every
# lease/3 went unanswered for over 3 s).
LEASE_SECONDS = 8.0
OUTAGE_SECONDS = LEASE_SECONDS + 2.0


def test_coordinator_outage_longer_than_a_lease(coordinator_factory: Any, tmp_path: Path) -> None:
    coordinator = coordinator_factory(
        KERNELFLEET_LEASE_SECONDS=str(LEASE_SECONDS),
        KERNELFLEET_REAPER_INTERVAL_SECONDS="0.5",
        KERNELFLEET_REQUEUE_BACKOFF_SECONDS="0.2",
    )
    procs = [
        start_worker(
            coordinator.url,
            tmp_path / f"w{i}",
            f"w{i}",
            "--budget",
            "0.3",
            "--poll-seconds",
            "0.2",
            "--backoff-max",
            "1",
            enroll_token=mint_enroll_token(coordinator),
        )
        for i in range(3)
    ]
    logs = lambda: "\n".join(p.log()[-3000:] for p in procs)  # noqa: E731
    try:
        wait_for("three enrolled workers", lambda: len(workers(coordinator)) == 3, diagnostics=logs)
        shapes = [f"{r}x4096" for r in (64, 96, 128, 192, 256)]
        campaign = create_campaign(coordinator, shapes, ["float32", "float16", "bfloat16"])

        def mid_campaign() -> bool:
            states = Counter(j["state"] for j in jobs(coordinator, campaign))
            return states["done"] >= 3 and states["leased"] >= 2 and states["queued"] >= 3

        wait_for("the campaign under way", mid_campaign, every=0.05, diagnostics=logs)

        down_at = time.monotonic()
        coordinator.stop()
        # the jobs in flight finish and their results land in the spools, not on the wire
        wait_for("a spooled result", lambda: any(p.pending() for p in procs), timeout=30, diagnostics=logs)
        time.sleep(max(0.0, OUTAGE_SECONDS - (time.monotonic() - down_at)))  # past every lease
        outage = time.monotonic() - down_at
        spooled = sum(len(p.pending()) for p in procs)
        assert all(p.alive() for p in procs), logs()
        coordinator.start()

        done = wait_for(
            "every job done",
            lambda: (js := jobs(coordinator, campaign)) and all(j["state"] == "done" for j in js) and js,
            timeout=120,
            diagnostics=logs,
        )
        codes = stop_all(procs)
    finally:
        stop_all(procs)

    assert codes == {"w0": 0, "w1": 0, "w2": 0}, logs()
    assert spooled >= 1 and outage > LEASE_SECONDS
    rows = results(coordinator)
    assert Counter(r["job_id"] for r in rows) == Counter(j["id"] for j in done)  # nothing lost or doubled
    assert all(p.pending() == [] for p in procs), "every spooled result was delivered"
    refused = [f.with_name(f.name + ".reason.txt").read_text() for p in procs for f in p.quarantined()]
    assert refused == [], f"spooled results refused as stale: {refused}\n{logs()}"
    attempts = sum(j["attempts"] for j in done)
    assert attempts == len(done), f"requeue storm: {attempts} attempts for {len(done)} jobs"
    assert any("coordinator unreachable" in p.log() for p in procs)
