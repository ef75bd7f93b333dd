"""Long-polled leases: idle lease requests wait here, and one poller per process looks for work.

A lease request that finds nothing may wait up to ``wait_seconds`` (bounded by
``settings.lease_wait_max_seconds``) instead of coming back every few seconds. Waiting requests
hold no database connection and no thread: each is a future on the event loop, registered with the
worker's backend and chip. While anybody waits, one task per process asks the database every
``lease_poll_seconds`` which job targets have available work, one index probe per target
(``ix_jobs_queued_target``, at most as many rows as there are waiters), and wakes that many
matching waiters, oldest first; each woken request tries one lease. So 10,000 idle workers cost one
small query per second per process, not one per worker.
"""

from __future__ import annotations

import asyncio
import logging
from contextlib import suppress
from dataclasses import dataclass, field

from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import db_now
from kernelfleet.service.models import Backend, Job, JobState, JobTarget
from kernelfleet.service.targets import target_matches

logger = logging.getLogger(__name__)

Machine = tuple[Backend, str]  # (backend, chip): what a waiting worker can run


@dataclass(eq=False)
class _Waiter:
    machine: Machine
    woken: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())


def _ready(session_factory: sessionmaker[Session], wanted: dict[Machine, int]) -> dict[Machine, int]:
    """How many jobs are available now for each waiting machine (capped at its number of waiters)."""
    with session_factory() as session:
        targets = session.execute(select(JobTarget.id, JobTarget.target_backend, JobTarget.target_chip)).all()
        out: dict[Machine, int] = {}
        counted: dict[int, int] = {}
        for (backend, chip), cap in wanted.items():
            total = 0
            for t in targets:
                if total >= cap or not target_matches(t.target_backend, t.target_chip, backend, chip):
                    continue
                if t.id not in counted:
                    probe = (select(Job.id).where(Job.target_id == t.id, Job.state == JobState.queued,
                                                  Job.available_at <= db_now()).limit(cap).subquery())
                    counted[t.id] = int(session.scalar(select(func.count()).select_from(probe)) or 0)
                total += counted[t.id]
            if total:
                out[(backend, chip)] = min(total, cap)
        return out


class LeaseWaiters:
    """The waiting lease requests of this process, and the poller that wakes them."""

    def __init__(self, session_factory: sessionmaker[Session], poll_seconds: float) -> None:
        self._factory = session_factory
        self._poll_seconds = poll_seconds
        self._waiters: dict[_Waiter, None] = {}  # insertion-ordered: oldest first, O(1) removal
        self._poller: asyncio.Task[None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False

    @property
    def waiting(self) -> int:
        return len(self._waiters)

    @property
    def stopping(self) -> bool:
        """The server is shutting down: no request waits for work any more."""
        return self._stopping

    async def wait(self, backend: Backend, chip: str, seconds: float) -> bool:
        """Wait until work for this machine may be available (True) or ``seconds`` pass (False); False
        at once when the server is shutting down (:meth:`stop_waiting`)."""
        if self._stopping:
            return False
        self._loop = asyncio.get_running_loop()
        waiter = _Waiter((backend, chip))
        self._waiters[waiter] = None
        self._ensure_poller()
        try:
            await asyncio.wait_for(waiter.woken, timeout=seconds)
            return not self._stopping
        except TimeoutError:
            return False
        finally:
            self._waiters.pop(waiter, None)

    def _ensure_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll(), name="kernelfleet-lease-poller")

    async def _poll(self) -> None:
        while self._waiters:
            await asyncio.sleep(self._poll_seconds)
            wanted: dict[Machine, int] = {}
            for w in self._waiters:
                wanted[w.machine] = wanted.get(w.machine, 0) + 1
            if not wanted:
                break
            try:
                ready = await asyncio.to_thread(_ready, self._factory, wanted)
            except Exception:  # the poller's boundary: keep waiting; requests still time out on their own
                logger.exception("lease poller: looking for work failed")
                continue
            for w in list(self._waiters):
                n = ready.get(w.machine, 0)
                if n and not w.woken.done():
                    w.woken.set_result(None)
                    self._waiters.pop(w, None)
                    ready[w.machine] = n - 1

    def stop_waiting(self) -> None:
        """The server is shutting down: every waiting request ends now (its worker gets 204 and Retry-After)
        and no new one waits. Otherwise each long poll would hold the graceful shutdown until it timed
        out (a worker's --lease-wait, 10 s), while the worker, asked to stop too, waits for its answer.
        Safe from a signal handler or another thread: the waiters are woken on their event loop."""
        self._stopping = True
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._wake_all)

    def _wake_all(self) -> None:
        for w in list(self._waiters):
            if not w.woken.done():
                w.woken.set_result(None)
        self._waiters.clear()

    async def close(self) -> None:
        if self._poller is not None:
            self._poller.cancel()
            with suppress(asyncio.CancelledError):
                await self._poller
