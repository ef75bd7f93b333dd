"""A small typed client for the coordinator's HTTP API (``/api/v1``), used by the worker agent.

Every failure becomes one of the :class:`CoordinatorError` subclasses below, so the agent decides
what to do by type, never by parsing messages:

- :class:`Unreachable`      no answer (connection refused, DNS, timeout) or a 5xx: retry later
- :class:`NotACoordinator`  something answered, but it is not a KernelFleet coordinator
- :class:`Unauthorized`     401: the token is missing, wrong, expired or revoked
- :class:`LeaseConflict`    409: the lease is no longer ours (expired and requeued, completed, ...)
- :class:`Rejected`         any other 4xx (422 validation, 413 too large, 404 unknown id, ...)

Only ``httpx`` is needed, so the worker runs on a bare GPU host.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx

from kernelfleet.worker.coordinator_url import (
    API_PREFIX,
    BadCoordinatorUrl,
    coordinator_base,
    unreachable_message,
)


class CoordinatorError(Exception):
    """Base class: something went wrong talking to the coordinator."""

    def __init__(self, message: str, status: int | None = None, detail: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.detail = detail


class Unreachable(CoordinatorError):
    """The coordinator could not be reached or failed on its side (5xx); worth retrying."""


class NotACoordinator(CoordinatorError):
    """The URL answers, but not like a KernelFleet coordinator."""


class Unauthorized(CoordinatorError):
    """401: the token was refused (missing, invalid, expired or revoked)."""


class LeaseConflict(CoordinatorError):
    """409: this lease is no longer the job's current lease."""


class Rejected(CoordinatorError):
    """Any other 4xx: the request itself was refused and resending it will not help."""


@dataclass(frozen=True)
class Lease:
    job_id: int | str
    lease_token: str
    kernel: str
    shape: str
    dtype: str
    kind: str
    lease_expires_at: str
    lease_seconds: float
    runtime_settings: dict[str, Any] | None = None  # a runtime_settings job's search request


@dataclass(frozen=True)
class Idle:
    """No work: the coordinator asks to come back after ``retry_after`` seconds (None: not said)."""

    retry_after: float | None


@dataclass(frozen=True)
class Enrollment:
    worker_id: int | str
    token: str


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase
    if isinstance(body, dict) and "detail" in body:
        detail = body["detail"]
        if isinstance(detail, list):  # FastAPI validation errors: [{"loc": [...], "msg": ...}, ...]
            return "; ".join(
                f"{'.'.join(str(x) for x in d.get('loc', []))}: {d.get('msg', d)}" if isinstance(d, dict)
                else str(d) for d in detail)
        return str(detail)
    return str(body)[:300]


class CoordinatorClient:
    """Synchronous client; thread-safe (httpx.Client is), so the heartbeat thread shares it."""

    def __init__(self, base_url: str, token: str | None = None, *, timeout: float = 30.0,
                 connect_timeout: float = 5.0) -> None:
        try:
            self.base_url = coordinator_base(base_url)
        except BadCoordinatorUrl as e:
            raise NotACoordinator(str(e)) from None
        self.token = token
        try:
            self._http = httpx.Client(base_url=self.base_url,
                                      timeout=httpx.Timeout(timeout, connect=connect_timeout),
                                      headers={"User-Agent": "kernelfleet-worker"})
        except (httpx.InvalidURL, ValueError) as e:  # pragma: no cover - httpx validates lazily today
            raise NotACoordinator(f"{base_url!r} is not a valid URL: {e}") from e

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> CoordinatorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ transport

    def _request(self, method: str, path: str, *, json: dict[str, Any] | None = None,
                 auth: bool = True, timeout: float = 0.0) -> httpx.Response:
        """``timeout``: extra seconds the server may take on purpose (a long-polled lease)."""
        headers = {"Authorization": f"Bearer {self.token}"} if auth and self.token else {}
        extra: dict[str, Any] = {}
        if timeout > 0:
            base = self._http.timeout
            extra["timeout"] = httpx.Timeout((base.read or 30.0) + timeout, connect=base.connect)
        try:
            response = self._http.request(method, path, json=json, headers=headers, **extra)
        except (httpx.InvalidURL, httpx.UnsupportedProtocol) as e:
            raise NotACoordinator(f"{self.base_url} is not a usable URL: {e}") from e
        except httpx.TransportError as e:
            raise Unreachable(unreachable_message(self.base_url, e)) from e
        return response

    def _check(self, response: httpx.Response, what: str) -> httpx.Response:
        status = response.status_code
        if status < 400:
            return response
        detail = _detail(response)
        message = f"{what}: the coordinator answered {status}: {detail}"
        if status >= 500:
            raise Unreachable(message, status, detail)
        if status == 401:
            raise Unauthorized(message, status, detail)
        if status == 409:
            raise LeaseConflict(message, status, detail)
        if status == 404 and not _is_json(response):
            raise NotACoordinator(f"{self.base_url} has no KernelFleet API ({what} gave 404); is this the "
                                  "coordinator's URL?", status, detail)
        raise Rejected(message, status, detail)

    def _json(self, response: httpx.Response, what: str) -> dict[str, Any]:
        try:
            body = response.json()
        except ValueError as e:
            raise NotACoordinator(f"{self.base_url} did not answer {what} with JSON; is this a KernelFleet "
                                  "coordinator?", response.status_code) from e
        if not isinstance(body, dict):
            raise NotACoordinator(f"unexpected answer to {what} from {self.base_url}: {str(body)[:200]}")
        return body

    # ------------------------------------------------------------------ endpoints

    def health(self) -> dict[str, Any]:
        """GET /healthz. Raises Unreachable (no answer / 5xx) or NotACoordinator."""
        response = self._request("GET", "/healthz", auth=False)
        if response.status_code >= 500:
            raise Unreachable(f"the coordinator at {self.base_url} is unhealthy ({response.status_code}: "
                              f"{_detail(response)})", response.status_code)
        if response.status_code != 200:
            raise NotACoordinator(f"{self.base_url} is not a KernelFleet coordinator (GET /healthz answered "
                                  f"{response.status_code})", response.status_code)
        try:
            body = response.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or body.get("status") != "ok":
            raise NotACoordinator(f"{self.base_url} is not a KernelFleet coordinator (GET /healthz did not "
                                  "answer {\"status\": \"ok\"})", response.status_code)
        return body

    def enroll(self, enrollment_token: str, info: dict[str, Any]) -> Enrollment:
        response = self._request("POST", f"{API_PREFIX}/workers/enroll",
                                 json={"enrollment_token": enrollment_token, **info}, auth=False)
        body = self._json(self._check(response, "enrollment"), "enrollment")
        try:
            return Enrollment(worker_id=body["worker_id"], token=str(body["token"]))
        except KeyError as e:
            raise NotACoordinator(f"enrollment answer lacks {e}; is this a KernelFleet coordinator?") from e

    def me(self) -> dict[str, Any]:
        return self._json(self._check(self._request("GET", f"{API_PREFIX}/workers/me"), "GET /workers/me"),
                          "GET /workers/me")

    def lease(self) -> Lease | None:
        """Lease the next job this worker can run, or None when nothing is queued for it."""
        got = self.poll()
        return None if isinstance(got, Idle) else got

    def poll(self, wait_seconds: float = 0.0) -> Lease | Idle:
        """Lease the next job, waiting up to ``wait_seconds`` on the coordinator for one to be queued;
        :class:`Idle` (with the coordinator's ``Retry-After``) when none came."""
        body_in = {"wait_seconds": wait_seconds} if wait_seconds > 0 else {}
        response = self._check(self._request("POST", f"{API_PREFIX}/leases", json=body_in,
                                             timeout=wait_seconds), "lease")
        if response.status_code == 204:
            return Idle(_retry_after(response))
        body = self._json(response, "lease")
        try:
            return Lease(job_id=body["job_id"], lease_token=str(body["lease_token"]),
                         kernel=str(body["kernel"]), shape=str(body["shape"]), dtype=str(body["dtype"]),
                         kind=str(body.get("kind", "tune")),
                         lease_expires_at=str(body["lease_expires_at"]),
                         lease_seconds=float(body["lease_seconds"]),
                         runtime_settings=body.get("runtime_settings"))
        except (KeyError, TypeError, ValueError) as e:
            raise NotACoordinator(f"malformed lease from the coordinator ({e}): {str(body)[:200]}") from e

    def heartbeat(self, job_id: int | str, lease_token: str) -> dict[str, Any]:
        response = self._request("POST", f"{API_PREFIX}/jobs/{job_id}/heartbeat",
                                 json={"lease_token": lease_token})
        return self._json(self._check(response, f"heartbeat for job {job_id}"), "heartbeat")

    def post(self, action: str, job_id: int | str, body: dict[str, Any]) -> dict[str, Any]:
        """POST /jobs/{id}/{action} (result, fail or release) with a body holding the lease token."""
        response = self._request("POST", f"{API_PREFIX}/jobs/{job_id}/{action}", json=body)
        checked = self._check(response, f"{action} for job {job_id}")
        return self._json(checked, action) if checked.content else {}

    def release(self, job_id: int | str, lease_token: str) -> dict[str, Any]:
        return self.post("release", job_id, {"lease_token": lease_token})


def _retry_after(response: httpx.Response) -> float | None:
    try:
        return max(0.0, float(response.headers["retry-after"]))
    except (KeyError, ValueError):
        return None


def _is_json(response: httpx.Response) -> bool:
    return response.headers.get("content-type", "").startswith("application/json")
