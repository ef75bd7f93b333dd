"""Regressions on a chip with no worker to re-run them (issue 29, item 5): imported reports, or a Mac
that is off. They used to stay ``confirming`` for ever (no worker could lease the confirmation job),
never alerting, and the series was frozen. Now, once ``regression_confirm_wait_seconds`` pass with the
job unleased and no worker of the chip online, the runs stored after the suspect settle it, or it is
raised as "unconfirmed: no worker of this chip"; an open one alerts and the series is watched again.
In-thread coordinator and webhook receiver."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from typing import Any

import httpx
import numpy as np
import pytest
from inproc import fast_settings, serve_in_thread
from test_regressions_api import make_report

ADMIN = "kfa_test-admin"


@pytest.fixture
def webhooks() -> Iterator[tuple[str, list[dict[str, Any]]]]:
    received: list[dict[str, Any]] = []

    class Hook(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Hook)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    server.shutdown()


def wait_for(what: str, probe: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (got := probe()):
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s"
        time.sleep(0.05)
    return got


def test_regressions_without_a_worker_of_their_chip_are_confirmed_or_raised_and_alert(
    migrated_db_url: str, webhooks: tuple[str, list[dict[str, Any]]]
) -> None:
    hook, received = webhooks
    settings = fast_settings(
        migrated_db_url,
        webhook_urls=[hook],
        regression_confirm_wait_seconds=1.5,
        worker_offline_after_seconds=4.0,
        webhook_backoff_seconds=0.1,
    )
    rng = np.random.default_rng(7)
    h100, m3 = ("NVIDIA H100 80GB HBM3", "cuda"), ("Apple M3 Max", "metal")
    with (
        serve_in_thread(settings) as (url, _),
        httpx.Client(
            base_url=url + "/api/v1", headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
        ) as admin,
    ):

        def imported(chip: tuple[str, str], shape: str, medians: list[float]) -> None:
            reports = [make_report(shape, m, rng=rng, chip=chip[0], backend=chip[1], mlx="0.32.4")
                       for m in medians]
            assert admin.post("/results/import", json={"reports": reports}).status_code == 201

        def regressions(shape: str) -> list[dict[str, Any]]:
            rows = admin.get("/regressions", params={"limit": 100}).json()
            return [r for r in rows if r["shape"] == shape]

        base = [100.0] * 6
        # imported history, no worker of the H100 enrolled: four slower runs stored one after the
        # other (two or three of +15 % alone could be a bad pair and a spike: the detector waits for
        # a fourth)
        imported(h100, "4096x4096", [*base, 115.0, 116.0, 115.5, 115.8])
        # a single slower run at the end of the imported history: nothing stored after it
        imported(h100, "1024x4096", [*base, 118.0])
        # a Mac, enrolled and online (seen through its requests) when its regression is found, then off
        token = admin.post("/enroll-tokens", json={}).json()["token"]
        enrolled = httpx.post(
            url + "/api/v1/workers/enroll",
            json={"enrollment_token": token, "name": "mac", "chip": m3[0], "backend": "metal"},
            timeout=30.0,
        )
        assert enrolled.status_code == 201
        imported(m3, "2048x4096", [*base, 117.0])
        with httpx.Client(
            base_url=url + "/api/v1", headers={"Authorization": f"Bearer {enrolled.json()['token']}"}
        ) as mac_worker:

            def found_while_polling() -> list[dict[str, Any]]:
                assert mac_worker.get("/workers/me").status_code == 200  # seen: online
                return regressions("2048x4096")

            (mac,) = wait_for("the Mac's suspect", found_while_polling)
        assert mac["status"] == "confirming" and mac["confirm_job_id"] is not None  # the Mac may re-run it
        (a,) = wait_for(
            "the stored runs confirm A",
            lambda: [r for r in regressions("4096x4096") if r["status"] == "open"],
        )
        assert a["confirmation"] == "stored runs"
        assert admin.get(f"/jobs/{a['confirm_job_id']}").json()["state"] == "cancelled"  # nobody ran it
        (b,) = wait_for(
            "B raised unconfirmed", lambda: [r for r in regressions("1024x4096") if r["status"] == "open"]
        )
        assert b["confirmation"] == "unconfirmed: no worker of this chip"
        (mac,) = wait_for(
            "the Mac's raised once it is off",
            lambda: [r for r in regressions("2048x4096") if r["status"] == "open"],
        )
        assert mac["confirmation"] == "unconfirmed: no worker of this chip"
        job = admin.get(f"/jobs/{mac['confirm_job_id']}").json()
        assert job["state"] == "cancelled"

        texts = wait_for(
            "three alerts", lambda: [m["text"] for m in received] if len(received) >= 3 else None
        )
        assert sorted(m["regression"]["id"] for m in received) == sorted([a["id"], b["id"], mac["id"]])
        assert sum("(unconfirmed: no worker of this chip)" in t for t in texts) == 2, texts

        # the series keeps being watched: a further slowdown on B is detected again
        imported(h100, "1024x4096", [140.0, 141.0, 142.0])
        wait_for("a new suspect on B", lambda: len(regressions("1024x4096")) >= 2)
