"""A bound on unauthenticated reads, so that dashboard and public readers cannot take the threads
and database connections that leases, heartbeats and results need.

A GET or HEAD without an ``Authorization`` header (the public dashboard, its JSON, ``/metrics``,
``/api/v1/profiles``) takes one of ``KERNELFLEET_PUBLIC_READ_CONCURRENCY`` slots per process for
as long as it runs. When all are taken it waits up to ``KERNELFLEET_PUBLIC_READ_WAIT_SECONDS`` for
one, then answers 503 with ``Retry-After``. Workers (and every caller with a token) pass freely, as
do ``/healthz`` (probes), ``/static/`` files and ``/downloads/`` (a new worker's wheel).

Measured before (issue 33): 200 concurrent readers of ``/api/v1/profiles`` beside 300 workers cut
throughput from 40 to 4.3 jobs/s and pushed heartbeat p99 to 28 s.
"""

from __future__ import annotations

import asyncio

from starlette.types import ASGIApp, Receive, Scope, Send

from kernelfleet.service.asgi import HttpMiddleware
from kernelfleet.service.limits import reply

FREE_PREFIXES = ("/healthz", "/static/", "/downloads/")
BUSY = ("too many public reads at once: retry shortly, or send a read token "
        "(`kernelfleet admin tokens create`)")


class PublicReadLimitMiddleware(HttpMiddleware):
    def __init__(self, app: ASGIApp, concurrency: int, wait_seconds: float, retry_after: int = 1) -> None:
        super().__init__(app)
        # a queue of waiters, each woken when a slot frees: one that gives up (timeout, or its client
        # went away) leaves the queue holding nothing
        self._slots = asyncio.Semaphore(concurrency)
        self._wait = wait_seconds
        self._retry_after = retry_after

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        if not _public_read(scope):
            await self.app(scope, receive, send)
            return
        try:
            if self._slots.locked():  # all taken (or others queued first): wait at most wait_seconds
                await asyncio.wait_for(self._slots.acquire(), self._wait)
            else:
                await self._slots.acquire()
        except TimeoutError:
            await self._refuse(send)
            return
        try:
            await self.app(scope, receive, send)
        finally:
            self._slots.release()

    async def _refuse(self, send: Send) -> None:
        await reply(send, 503, BUSY, [(b"retry-after", str(self._retry_after).encode())])


def _public_read(scope: Scope) -> bool:
    if scope["method"] not in ("GET", "HEAD") or scope["path"].startswith(FREE_PREFIXES):
        return False
    return not any(name == b"authorization" for name, _ in scope["headers"])
