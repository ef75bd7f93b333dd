"""Webhook alerts against a real HTTP receiver on a loopback port: a confirmed regression is POSTed
(generic JSON and the Slack-compatible form), a receiver that fails first is retried with backoff
until it answers 2xx, an unreachable one is given up after the configured attempts, and every
attempt is recorded and listed by the API. Also: acknowledging a regression that is still being
confirmed cancels its confirmation job, and the source revision reaches the regression's cause."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from conftest import Coordinator, free_port
from sqlalchemy import update
from test_regressions_api import enroll, import_history, make_report, regressions, run_leased_job

from kernelfleet.service.db import make_engine
from kernelfleet.service.models import Regression, RegressionStatus


class Receiver:
    """A real HTTP server in a thread: answers ``fail_first`` requests with 503, then 204."""

    def __init__(self, fail_first: int = 0) -> None:
        self.fail_first = fail_first
        self.requests: list[tuple[float, dict[str, str], Any]] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                receiver.requests.append((time.monotonic(), dict(self.headers), body))
                failing = len(receiver.requests) <= receiver.fail_first
                self.send_response(503 if failing else 204)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(fail_first=2)
    yield r
    r.close()


def _suspected(coordinator: Coordinator, shape: str = "4096x4096",
               worker: httpx.Client | None = None) -> tuple[dict[str, Any], httpx.Client]:
    """Steady history, then a slower leased run: a ``confirming`` regression and its confirm job."""
    rng = np.random.default_rng(7)
    import_history(coordinator, shape, [100.0 * (1 + 0.005 * np.sin(i)) for i in range(10)], rng)
    worker = worker or enroll(coordinator)
    with coordinator.admin() as admin:
        r = admin.post("/campaigns", json={"name": "n", "kernels": ["rmsnorm"], "shapes": [shape],
                                           "dtypes": ["float16"], "target_backend": "metal"})
        assert r.status_code == 201, r.text
    run_leased_job(worker, make_report(shape, 125.0, rng=rng, mlx="0.32.4"))
    [reg] = regressions(coordinator, status="confirming")
    assert reg["shape"] == shape
    return reg, worker


def _confirm(coordinator: Coordinator, worker: httpx.Client, reg: dict[str, Any]) -> dict[str, Any]:
    """The confirmation run reproduces the slowdown: the regression becomes ``open``."""
    rng = np.random.default_rng(8)
    job = run_leased_job(worker, make_report(reg["shape"], 124.0, rng=rng, mlx="0.32.4"))
    assert job["job_id"] == reg["confirm_job_id"]
    [reg] = regressions(coordinator, status="open")
    return reg


def _confirmed_regression(coordinator: Coordinator) -> tuple[dict[str, Any], httpx.Client]:
    reg, worker = _suspected(coordinator)
    return _confirm(coordinator, worker, reg), worker


def _deliveries(coordinator: Coordinator, done: Any, timeout: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout
    with coordinator.admin() as admin:
        while True:
            rows = admin.get("/webhooks/deliveries").json()
            if done(rows):
                return list(rows)
            assert time.monotonic() < deadline, f"deliveries not settled: {rows}"
            time.sleep(0.1)


def test_webhook_retries_until_delivered(coordinator_factory: Any, receiver: Receiver) -> None:
    dead_url = f"http://127.0.0.1:{free_port()}/nobody"  # nothing listens there
    coordinator = coordinator_factory(
        KERNELFLEET_WEBHOOK_URLS=json.dumps([receiver.url, dead_url]),
        KERNELFLEET_WEBHOOK_BACKOFF_SECONDS="0.5", KERNELFLEET_WEBHOOK_MAX_ATTEMPTS="3",
        KERNELFLEET_WEBHOOK_TIMEOUT_SECONDS="2", KERNELFLEET_PUBLIC_URL="https://fleet.example")
    reg, worker = _confirmed_regression(coordinator)
    rows = _deliveries(coordinator,
                       lambda rows: len(rows) == 2 and all(r["state"] != "pending" for r in rows))
    by_url = {r["url"]: r for r in rows}
    good, bad = by_url[receiver.url], by_url[dead_url]

    # the receiver failed twice (503), then took it: three attempts, the last one 204
    assert good["state"] == "delivered" and good["attempts"] == 3 and good["regression_id"] == reg["id"]
    assert [a["status_code"] for a in good["attempt_log"]] == [503, 503, 204]
    assert [bool(a["error"]) for a in good["attempt_log"]] == [True, True, False]
    assert len(receiver.requests) == 3
    times = [t for t, _, _ in receiver.requests]
    assert times[1] - times[0] >= 0.4 and times[2] - times[1] >= 0.8  # backoff 0.5 s, then 1 s
    _, headers, body = receiver.requests[-1]
    assert headers["X-KernelFleet-Event"] == "regression.confirmed"
    assert headers["X-KernelFleet-Delivery"] == str(good["id"])
    assert body["event"] == "regression.confirmed" and body["regression"]["id"] == reg["id"]
    assert body["regression"]["cause"] == {"mlx_version": ["0.32.3", "0.32.4"]}
    assert body["url"] == f"https://fleet.example/regressions/{reg['id']}"
    assert "rmsnorm 4096x4096 float16 on Apple M3 Max" in body["text"]
    assert all(req[2] == body for req in receiver.requests)  # the same payload each time

    # nothing listens on the other URL: three attempts, each with its connection error, then failed
    assert bad["state"] == "failed" and bad["attempts"] == 3 and bad["delivered_at"] is None
    assert all(a["status_code"] is None and "Connect" in a["error"] for a in bad["attempt_log"])

    # one alert per confirmation: acknowledging it or more passes send nothing new
    with coordinator.admin() as admin:
        assert admin.post(f"/regressions/{reg['id']}/acknowledge", json={}).status_code == 200
        assert len(admin.get("/webhooks/deliveries", params={"state": "delivered"}).json()) == 1
        assert admin.get("/webhooks/deliveries", params={"state": "nope"}).status_code == 422
    time.sleep(1.0)
    assert len(receiver.requests) == 3
    worker.close()


def test_slack_payload_only_once_confirmed(coordinator_factory: Any) -> None:
    slack = Receiver()
    try:
        coordinator = coordinator_factory(KERNELFLEET_WEBHOOK_URLS=json.dumps([slack.url]),
                                          KERNELFLEET_WEBHOOK_FORMAT="slack")
        reg, worker = _suspected(coordinator)
        time.sleep(1.0)
        assert slack.requests == []  # suspected is not confirmed: no alert yet
        _confirm(coordinator, worker, reg)
        _deliveries(coordinator, lambda rows: rows and rows[0]["state"] == "delivered")
        [(_, _, body)] = slack.requests
        assert set(body) == {"text"} and "rmsnorm 4096x4096 float16 on Apple M3 Max is +" in body["text"]
        worker.close()
    finally:
        slack.close()


def _job_state(coordinator: Coordinator, job_id: int) -> str:
    with coordinator.admin() as admin:
        return str(admin.get(f"/jobs/{job_id}").json()["state"])


def test_confirmation_cancelled_when_acknowledged_or_dismissed(coordinator: Coordinator) -> None:
    # acknowledged while it is being confirmed: its queued confirmation job is cancelled at once
    reg, worker = _suspected(coordinator)
    with coordinator.admin() as admin:
        r = admin.post(f"/regressions/{reg['id']}/acknowledge", json={"note": "known"})
    assert r.status_code == 200, r.text
    assert r.json() == {"acknowledged": [reg["id"]], "cancelled_jobs": [reg["confirm_job_id"]]}
    assert _job_state(coordinator, reg["confirm_job_id"]) == "cancelled"
    assert worker.post("/leases", json={}).status_code == 204  # nothing left to confirm

    # dismissed by anything else (here: directly in the database): the background sweep cancels it
    other, _ = _suspected(coordinator, shape="1024x4096", worker=worker)
    engine = make_engine(coordinator.db_url)
    try:
        with engine.begin() as conn:
            conn.execute(update(Regression).where(Regression.id == other["id"])
                         .values(status=RegressionStatus.dismissed))
    finally:
        engine.dispose()
    deadline = time.monotonic() + 20
    while _job_state(coordinator, other["confirm_job_id"]) != "cancelled":
        assert time.monotonic() < deadline, "the confirm job of a dismissed regression stayed queued"
        time.sleep(0.1)
    assert worker.post("/leases", json={}).status_code == 204
    worker.close()


def test_revision_reaches_the_cause(coordinator: Coordinator) -> None:
    rng = np.random.default_rng(3)
    shape = "2048x4096"
    history = [dict(make_report(shape, 100.0 * (1 + 0.004 * np.sin(i)), rng=rng), revision="aaa111")
               for i in range(10)]
    with coordinator.admin() as admin:
        assert admin.post("/results/import", json={"reports": history}).status_code == 201
        slow = dict(make_report(shape, 130.0, rng=rng), revision="bbb222")
        assert admin.post("/results/import", json={"reports": [slow]}).status_code == 201
    [reg] = regressions(coordinator)
    assert reg["cause"] == {"revision": ["aaa111", "bbb222"]}
    assert "revision: aaa111 -> bbb222" in reg["cause_text"]


def test_a_runtime_settings_alert_says_the_gain() -> None:
    """A runtime-settings regression's medians are the step's time relative to MLX's defaults: its
    alert says the settings' gain before and after, and the MLX versions, not microseconds."""
    from kernelfleet.service.notifications import alert_text

    reg = Regression(kernel="runtime_settings", shape="llama h4096 x8 decode:8", dtype="bf16",
                     chip="NVIDIA H100 80GB HBM3",
                     config_key="MLX_MAX_MB_PER_BUFFER=500 MLX_MAX_OPS_PER_BUFFER=50",
                     baseline_median_us=1 / 1.2, new_median_us=1.0, effect=0.2,
                     cause={"mlx_version": ["0.31.0", "0.32.0"]})
    assert alert_text(reg, "http://kf/regressions/1") == (
        "KernelFleet: MLX's runtime settings for llama h4096 x8 decode:8 bf16 on NVIDIA H100 80GB HBM3 "
        "(MLX_MAX_MB_PER_BUFFER=500 MLX_MAX_OPS_PER_BUFFER=50) gain 1.00x over MLX's defaults, down from "
        "1.20x. Cause: mlx_version: 0.31.0 -> 0.32.0. http://kf/regressions/1")
