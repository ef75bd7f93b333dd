"""The heartbeat's common case is answered before FastAPI's routing (service/fast_heartbeat.py) with
what the route would answer, and every other case goes on to the route, which answers as before."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest
from coordinator_helpers import make_report
from inproc import fast_settings, serve_in_thread
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import exc as sa_exc

from kernelfleet.service import fast_heartbeat, leasing
from kernelfleet.service.fast_heartbeat import FastHeartbeatMiddleware, bearer_token

ADMIN = {"Authorization": "Bearer kfa_test-admin"}
TIME = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|\+00:00)")


def _worker(c: httpx.Client, name: str = "w") -> dict[str, str]:
    enroll = c.post("/api/v1/enroll-tokens", headers=ADMIN, json={}).json()["token"]
    w = c.post("/api/v1/workers/enroll", json={
        "enrollment_token": enroll, "name": name, "chip": "NVIDIA H100 80GB HBM3", "backend": "cuda",
        "os": "Linux 6.1", "mlx_version": "0.32.4"}).json()
    return {"Authorization": f"Bearer {w['token']}"}


def _zone(when: str) -> str:
    found = TIME.fullmatch(when)
    assert found, when
    return found[2]


def _count(c: httpx.Client, status: int) -> float:
    """The metrics' count of heartbeats answered ``status`` under the route's template."""
    wanted = {"route": "/api/v1/jobs/{job_id}/heartbeat", "method": "POST", "status": str(status)}
    text = c.get("/metrics", headers=ADMIN).text
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "kernelfleet_http_requests_total" and sample.labels == wanted)


@pytest.fixture
def served(migrated_db_url: str, monkeypatch: pytest.MonkeyPatch) -> Any:
    """(client, the answers of the fast path: bytes, or None where the route answered)."""
    answers: list[bytes | None] = []
    beat = FastHeartbeatMiddleware._beat

    async def spied(self: FastHeartbeatMiddleware, *args: Any) -> bytes | None:
        answers.append(await beat(self, *args))
        return answers[-1]

    monkeypatch.setattr(FastHeartbeatMiddleware, "_beat", spied)
    settings = fast_settings(migrated_db_url, background_in_server=False, reaper_interval_seconds=3600)
    with serve_in_thread(settings) as (base, _app), httpx.Client(base_url=base, timeout=30) as c:
        assert c.post("/api/v1/campaigns", headers=ADMIN, json={
            "name": "c", "kernels": ["rmsnorm"], "shapes": ["1x4096", "2x4096"], "dtypes": ["float16"]}
        ).status_code == 201
        yield c, answers


def test_a_heartbeat_is_answered_as_the_route_answers_it(served: Any) -> None:
    c, answers = served
    auth = _worker(c)
    got = c.post("/api/v1/leases", json={}, headers=auth).json()
    path, body = f"/api/v1/jobs/{got['job_id']}/heartbeat", {"lease_token": got["lease_token"]}
    before = _count(c, 200)
    fast = c.post(path, json=body, headers=auth)
    assert answers == [fast.content] and fast.status_code == 200, fast.text
    routed = c.post(path + "?via=route", json=body, headers=auth)  # a query string: the route answers
    assert routed.status_code == 200 and len(answers) == 1, routed.text
    assert _count(c, 200) == before + 2  # both under the route's template
    for r in (fast, routed):
        out = r.json()
        assert list(out) == ["lease_expires_at", "next_heartbeat_seconds"], out
        assert TIME.fullmatch(out["lease_expires_at"]) and 0 < out["next_heartbeat_seconds"] <= 40
    assert _zone(fast.json()["lease_expires_at"]) == _zone(routed.json()["lease_expires_at"])
    skip = {"date", "content-length"}
    assert ({k: v for k, v in fast.headers.items() if k not in skip} ==
            {k: v for k, v in routed.headers.items() if k not in skip})
    # the lease was extended (and confirmed): the result is accepted
    report = make_report(kernel=got["kernel"], shape=got["shape"], dtype=got["dtype"])
    assert c.post(f"/api/v1/jobs/{got['job_id']}/result", json={**body, "report": report},
                  headers=auth).status_code == 201


def test_every_other_heartbeat_goes_to_the_route(served: Any) -> None:
    c, answers = served
    auth, other = _worker(c, "a"), _worker(c, "b")
    got = c.post("/api/v1/leases", json={}, headers=auth).json()
    path, token = f"/api/v1/jobs/{got['job_id']}/heartbeat", got["lease_token"]
    cases = [  # (path, body, headers, status, words of the route's answer)
        (path, {"lease_token": "kfl_stale"}, auth, 409, "no longer valid"),
        (path, {"lease_token": token}, other, 409, "no longer valid"),  # another worker's lease
        (path, {"lease_token": ""}, auth, 422, "lease_token"),
        (path, {"lease_token": token, "extra": 1}, auth, 422, "extra"),
        (path, {"lease_token": 5}, auth, 422, "lease_token"),
        ("/api/v1/jobs/999999/heartbeat", {"lease_token": token}, auth, 404, "does not exist"),
        (f"/api/v1/jobs/{2**31}/heartbeat", {"lease_token": token}, auth, 422, "job_id"),
        (path, {"lease_token": token}, {"Authorization": "Bearer kfw_nobody"}, 401, "invalid worker token"),
    ]
    for url, body, headers, status, words in cases:
        r = c.post(url, json=body, headers=headers)
        assert r.status_code == status and words in r.json()["detail"], (url, body, r.status_code, r.text)
    # none was answered by the fast path (those it looked at went on to the route); a revoked worker too
    assert all(a is None for a in answers), answers
    worker_id = c.get("/api/v1/workers/me", headers=auth).json()["id"]
    assert c.post(f"/api/v1/workers/{worker_id}/revoke", headers=ADMIN).status_code == 200
    r = c.post(path, json={"lease_token": token}, headers=auth)
    assert r.status_code == 401 and "revoked" in r.json()["detail"], r.text
    assert answers[-1] is None
    big = c.post(path, content=b'{"lease_token": "' + b"x" * fast_heartbeat.MAX_BODY + b'"}',
                 headers={**auth, "content-type": "application/json"})
    assert big.status_code in (401, 422), big.text  # the route's answer (revoked, or too long a token)


def test_a_database_error_is_answered_as_the_route_answers_it_and_tried_once(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    c, answers = served
    auth = _worker(c)
    got = c.post("/api/v1/leases", json={}, headers=auth).json()
    path, body = f"/api/v1/jobs/{got['job_id']}/heartbeat", {"lease_token": got["lease_token"]}
    tries: list[int] = []

    def down(*_args: Any) -> None:
        tries.append(1)
        raise sa_exc.OperationalError("UPDATE jobs", {}, ConnectionRefusedError("connection refused"))

    monkeypatch.setattr(leasing, "beat", down)
    fast = c.post(path, json=body, headers=auth)
    assert len(tries) == 1 and not answers, (tries, answers)  # the handler answered, no second try
    routed = c.post(path + "?via=route", json=body, headers=auth)
    assert len(tries) == 2
    assert fast.status_code == routed.status_code >= 500 and fast.json() == routed.json(), fast.text
    skip = {"date", "content-length"}
    assert ({k: v for k, v in fast.headers.items() if k not in skip} ==
            {k: v for k, v in routed.headers.items() if k not in skip})


@pytest.mark.parametrize(("header", "token"), [
    (b"Bearer kfw_a", "kfw_a"), (b"bearer  kfw_a ", "kfw_a"), (b"BEARER kfw_a", "kfw_a"),
    (b"Basic kfw_a", None), (b"Bearer", None), (b"Bearer ", None), (b"", None), (None, None)])
def test_the_bearer_token_is_read_as_fastapis_http_bearer_reads_it(header: bytes | None,
                                                                    token: str | None) -> None:
    headers = [(b"host", b"x")] + ([(b"authorization", header)] if header is not None else [])
    assert bearer_token({"headers": headers}) == token
