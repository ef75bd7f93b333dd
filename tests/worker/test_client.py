"""The worker's coordinator client against a real ``kernelfleet serve`` (SQLite and PostgreSQL), plus
real non-KernelFleet HTTP servers and a closed port for the error types."""

from __future__ import annotations

import http.server
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from kernelfleet.worker.client import (
    CoordinatorClient,
    LeaseConflict,
    NotACoordinator,
    Rejected,
    Unauthorized,
    Unreachable,
)

MACHINE: dict[str, Any] = {"name": "client-test", "chip": "Test CPU", "backend": "cpu",
                           "os": "Linux test", "mlx_version": "0.32.4", "gpu_cores": None,
                           "memory_bytes": 1 << 30, "driver": None}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Handler(http.server.BaseHTTPRequestHandler):
    body = b"<html>hello</html>"
    status = 404
    ctype = "text/html"

    def do_GET(self) -> None:  # noqa: N802 - http.server's naming
        self.send_response(self.status)
        self.send_header("Content-Type", self.ctype)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def other_server(request: pytest.FixtureRequest) -> Iterator[str]:
    status, ctype, body = request.param
    handler = type("H", (_Handler,), {"status": status, "ctype": ctype, "body": body})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_closed_port_is_unreachable() -> None:
    with CoordinatorClient(f"http://127.0.0.1:{free_port()}") as c, \
            pytest.raises(Unreachable, match="cannot reach"):
        c.health()


def test_bad_scheme_is_refused() -> None:
    with pytest.raises(NotACoordinator, match="must look like http://"):
        CoordinatorClient("ftp://example.invalid")


@pytest.mark.parametrize("other_server", [
    (404, "text/html", b"<html>not found</html>"),
    (200, "text/html", b"<html>some web site</html>"),
    (200, "application/json", b'{"hello": "world"}'),
], indirect=True)
def test_other_http_servers_are_not_coordinators(other_server: str) -> None:
    with CoordinatorClient(other_server) as c, pytest.raises(NotACoordinator, match="not a KernelFleet"):
        c.health()


def test_full_lease_cycle_and_error_types(coordinator: Any) -> None:
    with coordinator.admin() as admin:
        enroll_token = admin.post("/enroll-tokens", json={}).json()["token"]
        with CoordinatorClient(coordinator.url) as c:
            assert c.health()["status"] == "ok"
            with pytest.raises(Unauthorized) as bad:
                c.enroll("kfe_not-a-real-token", MACHINE)
            assert bad.value.status == 401 and "enrollment token" in (bad.value.detail or "")

            enrolled = c.enroll(enroll_token, MACHINE)
            c.token = enrolled.token
            assert c.me()["name"] == "client-test"
            assert c.lease() is None  # 204: nothing queued

            campaign = admin.post("/campaigns", json={
                "name": "client", "kernels": ["rmsnorm"], "shapes": ["8x64"],
                "dtypes": ["float32", "float16"], "target_backend": "cpu"})
            assert campaign.status_code == 201, campaign.text
            first, second = c.lease(), c.lease()
            assert first is not None and second is not None and first.job_id != second.job_id
            assert first.lease_seconds > 0 and first.kind == "tune" and first.kernel == "rmsnorm"
            assert "lease_expires_at" in c.heartbeat(first.job_id, first.lease_token)

            with pytest.raises(LeaseConflict) as stale:
                c.heartbeat(first.job_id, "kfl_some-other-lease")
            assert stale.value.status == 409
            with pytest.raises(Rejected) as invalid:  # a report that is not a tuning report
                c.post("result", first.job_id, {"lease_token": first.lease_token, "report": {"kernel": "x"}})
            assert invalid.value.status == 422 and invalid.value.detail

            c.release(first.job_id, first.lease_token)
            assert admin.get(f"/jobs/{first.job_id}").json()["state"] == "queued"
            c.post("fail", second.job_id,
                   {"lease_token": second.lease_token, "error": "every candidate failed"})
            job = admin.get(f"/jobs/{second.job_id}").json()
            assert job["state"] == "queued" and "every candidate failed" in job["last_error"]
            with pytest.raises(LeaseConflict):  # the fail settled that lease
                c.heartbeat(second.job_id, second.lease_token)

            assert admin.post(f"/workers/{enrolled.worker_id}/revoke").status_code == 200
            with pytest.raises(Unauthorized) as revoked:
                c.lease()
            assert revoked.value.status == 401
