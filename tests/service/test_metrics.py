"""``GET /metrics``: scraped from a real server and parsed with prometheus_client's own parser; the
counts follow the requests made, the job gauges follow the queue, labels are route templates."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from conftest import Coordinator
from coordinator_helpers import create_campaign, enroll, lease
from prometheus_client.parser import text_string_to_metric_families

# /metrics counts what its process served (prometheus_client's registry is per process)
pytestmark = pytest.mark.coordinator_process

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(coordinator: Coordinator, token: str | None = None) -> Samples:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    r = httpx.get(coordinator.url + "/metrics", headers=headers, timeout=30.0)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"].startswith("text/plain")
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(r.text) for s in family.samples}


REQUESTS = "kernelfleet_http_requests_total"


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def delta(after: Samples, before: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def test_metrics_count_requests_by_route_template_and_track_the_queue(coordinator: Coordinator) -> None:
    _, worker = enroll(coordinator)
    create_campaign(coordinator, shapes=["1x64", "2x64", "3x64"])
    before = scrape(coordinator)
    assert value(before, "kernelfleet_jobs", state="queued") == 3
    assert value(before, "kernelfleet_jobs", state="leased") == 0

    me = {"route": "/api/v1/workers/me", "method": "GET", "status": "200"}
    with coordinator.client(worker) as c:
        for _ in range(7):
            assert c.get("/workers/me").status_code == 200
        for job_id in (11, 12, 13):  # three ids, one route
            assert c.post(f"/jobs/{job_id}/heartbeat", json={"lease_token": "kfl_x"}).status_code == 404
        held = lease(c)
    assert held is not None
    with httpx.Client(base_url=coordinator.url, timeout=30.0) as http:
        for n in range(4):
            assert http.get(f"/no/such/page/{n}").status_code == 404

    after = scrape(coordinator)
    assert delta(after, before, REQUESTS, **me) == 7
    assert delta(after, before, "kernelfleet_http_request_duration_seconds_count", route=me["route"],
                 method="GET") == 7
    heartbeat = {"route": "/api/v1/jobs/{job_id}/heartbeat", "method": "POST", "status": "404"}
    assert value(after, REQUESTS, **heartbeat) == 3
    assert value(after, REQUESTS, route="unmatched", method="GET", status="404") == 4
    routes = {dict(labels).get("route") for name, labels in after if name == REQUESTS}
    assert not any(str(r).startswith(("/no/", "/api/v1/jobs/1")) for r in routes), routes  # templates only
    assert delta(after, before, "kernelfleet_leases_granted_total") == 1
    assert value(after, "kernelfleet_jobs", state="queued") == 2
    assert value(after, "kernelfleet_jobs", state="leased") == 1
    assert value(after, "kernelfleet_expired_leases") == 0
    assert value(after, "kernelfleet_reaper_last_pass_timestamp_seconds") > 0
    assert ("kernelfleet_reaper_lag_seconds", frozenset()) in after


def wait_for(predicate: Callable[[], bool], what: str, limit: float = 60.0) -> None:
    deadline = time.monotonic() + limit
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.2)


def test_expired_leases_and_reaper_lag(coordinator_factory) -> None:  # type: ignore[no-untyped-def]
    # the reaper passes once at start and then sleeps for an hour: the lease stays expired
    coordinator: Coordinator = coordinator_factory(KERNELFLEET_LEASE_SECONDS="1",
                                                   KERNELFLEET_REAPER_INTERVAL_SECONDS="3600")
    _, worker = enroll(coordinator)
    create_campaign(coordinator, shapes=["1x64"])
    wait_for(lambda: value(scrape(coordinator), "kernelfleet_reaper_last_pass_timestamp_seconds") > 0,
             "the reaper's first pass")
    first = scrape(coordinator)
    with coordinator.client(worker) as c:
        assert lease(c) is not None
    wait_for(lambda: value(scrape(coordinator), "kernelfleet_expired_leases") == 1, "the lease to expire")
    later = scrape(coordinator)
    assert value(later, "kernelfleet_jobs", state="leased") == 1
    # no pass since the first one: the lag grew by at least the time the lease took to expire
    assert value(later, "kernelfleet_reaper_last_pass_timestamp_seconds") == \
        value(first, "kernelfleet_reaper_last_pass_timestamp_seconds")
    assert value(later, "kernelfleet_reaper_lag_seconds") > value(first, "kernelfleet_reaper_lag_seconds")


def test_multiprocess_mode_and_private_dashboard(coordinator_factory, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """With PROMETHEUS_MULTIPROC_DIR set, samples go through the directory and still add up; with a
    private dashboard, /metrics wants the admin token like the pages do."""
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    coordinator: Coordinator = coordinator_factory(PROMETHEUS_MULTIPROC_DIR=str(metrics_dir),
                                                   KERNELFLEET_DASHBOARD_PUBLIC="false")
    r = httpx.get(coordinator.url + "/metrics", timeout=30.0)
    assert r.status_code == 401 and "admin token" in r.json()["detail"]
    _, worker = enroll(coordinator)
    with coordinator.client(worker) as c:
        for _ in range(5):
            assert c.get("/workers/me").status_code == 200
    samples = scrape(coordinator, coordinator.admin_token)
    assert value(samples, REQUESTS, route="/api/v1/workers/me", method="GET", status="200") == 5
    assert value(samples, REQUESTS, route="/metrics", method="GET", status="401") == 1
    assert any(metrics_dir.glob("counter_*.db")), list(metrics_dir.iterdir())


def test_background_queues_and_their_lag(coordinator_factory) -> None:  # type: ignore[no-untyped-def]
    """A slow profile build keeps the other chips waiting: the profiles queue and its lag show them;
    once the builder is through, both are back to 0."""
    from coordinator_helpers import make_report

    coordinator: Coordinator = coordinator_factory(KERNELFLEET_PROFILE_BUILD_DELAY_SECONDS="3")
    chips = ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100 80GB"]
    with coordinator.admin() as admin:
        r = admin.post("/results/import", json={"reports": [make_report(chip=c) for c in chips]})
        assert r.status_code == 201, r.text
    wait_for(lambda: value(scrape(coordinator), "kernelfleet_background_lag_seconds", queue="profiles") > 1,
             "chips waiting behind the first (slow) build")
    busy = scrape(coordinator)
    assert 1 <= value(busy, "kernelfleet_background_queue", queue="profiles") <= len(chips)
    for chip in chips:
        coordinator.profile(chip, timeout=60)
    coordinator.settle(profiles=True)
    idle: Samples = {}

    def through() -> bool:
        """One scrape with the queue and its lag both back to 0 (a calibration after the queue first
        drained queues its backend's chips again: a loaded run once scraped queue 0, then lag 0.73 s)."""
        idle.clear()
        idle.update(scrape(coordinator))
        return (value(idle, "kernelfleet_background_queue", queue="profiles") == 0
                and value(idle, "kernelfleet_background_lag_seconds", queue="profiles") == 0)

    wait_for(through, "the builder to be through")
    assert value(idle, "kernelfleet_background_queue", queue="reactions") == 0
    assert ("kernelfleet_background_lag_seconds", frozenset({("queue", "reactions")})) in idle
