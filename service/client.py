"""A small HTTP client for the admin CLI commands; every failure becomes a :class:`ClientError`
with a message a person can act on."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import httpx

from kernelfleet.service.local_admin import admin_token_path
from kernelfleet.service.settings import Settings
from kernelfleet.worker.coordinator_url import (
    BadCoordinatorUrl,
    answer_detail,
    coordinator_base,
    unreachable_message,
)

DEFAULT_COORDINATOR = "http://127.0.0.1:8600"


class ClientError(Exception):
    pass


def wait_until_healthy(url: str, timeout: float = float("inf"), stopping: Callable[[], bool] = lambda: False,
                       ) -> bool:
    """Poll ``url``/healthz until it answers 200 (True), ``timeout`` passes or ``stopping()`` (False)."""
    deadline = time.monotonic() + timeout
    while not stopping() and time.monotonic() < deadline:
        try:
            if httpx.get(url + "/healthz", timeout=2.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    return False


def resolve_admin_token(explicit: str | None) -> str:
    """``--admin-token``, else KERNELFLEET_ADMIN_TOKEN, else local mode's generated token file."""
    if explicit:
        return explicit
    env = os.environ.get("KERNELFLEET_ADMIN_TOKEN")
    if env:
        return env
    try:
        path = admin_token_path(Settings())
        if path.exists():
            token = path.read_text().strip()
            if token:
                return token
    except OSError:
        pass
    raise ClientError("no admin token: pass --admin-token or set KERNELFLEET_ADMIN_TOKEN")


class AdminClient:
    def __init__(self, coordinator: str, token: str, timeout: float = 60.0) -> None:
        try:
            self.base = coordinator_base(coordinator)
        except BadCoordinatorUrl as e:
            raise ClientError(str(e)) from None
        self.http = httpx.Client(base_url=self.base + "/api/v1", timeout=timeout,
                                 headers={"Authorization": f"Bearer {token}"})

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def request(self, method: str, path: str, *, json: Any = None,
                params: dict[str, Any] | None = None) -> Any:
        try:
            r = self.http.request(method, path, json=json, params=params)
        except httpx.InvalidURL as e:
            raise ClientError(f"bad coordinator URL {self.base!r}: {e}") from e
        except httpx.TransportError as e:
            raise ClientError(unreachable_message(self.base, e)) from e
        if r.status_code >= 400:
            raise ClientError(f"the coordinator answered {r.status_code}: {answer_detail(r, 500)}")
        if r.status_code == 204 or not r.content:
            return None
        try:
            return r.json()
        except ValueError as e:
            raise ClientError(f"{self.base} did not answer with JSON: "
                              f"is it a KernelFleet coordinator?") from e
