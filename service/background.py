"""The background loop: reactions to new results, then profiles, then the campaign sweep; beside it,
the alerts loop and the regression-scan loop.

``kernelfleet serve`` runs it in one process of its own beside the server process(es)
(:func:`start_process`), so profile builds and regression detection never compete with requests
for the server's interpreter lock; an app made by ``create_app`` with
:attr:`Settings.background_in_server` (the default, e.g. in tests) runs it in its lifespan instead.

Requests only queue work (``result_events``, ``profile_requests``, ``regression_scans``); this loop
does it, every
:attr:`Settings.background_interval_seconds`, each step under its own locks so that several
processes and replicas share it without doubling it (:mod:`kernelfleet.service.reactions`,
:mod:`kernelfleet.service.profile_builder`, :mod:`kernelfleet.service.campaign_control`). Webhook
alerts (:mod:`kernelfleet.service.notifications`) and queued change-point scans
(:mod:`kernelfleet.service.regression_scans`) run in loops of their own at the same interval, so a
slow receiver or a long scan never delays reactions or profiles.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import multiprocessing
import os
import signal
import sys
import threading
from collections.abc import Callable
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event
from pathlib import Path
from types import FrameType
from typing import Any

from sqlalchemy import Engine, event
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import campaign_control, notifications, profile_builder, reactions, regression_scans
from kernelfleet.service.regressions import engine
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)
PROCESS_NAME = "kf-background"  # the background process's name (/proc/PID/comm), at most 15 bytes
PR_SET_PDEATHSIG = 1  # prctl(2): the signal this process gets when the thread that started it ends
PARENT_WATCH_SECONDS = 0.5  # elsewhere than Linux: how often the process looks for its parent
# PostgreSQL (14+) checks this often (ms) whether the client of a running query is still there, so
# that a background process that is gone releases its locks mid-query, not when the query ends
CLIENT_CHECK_MS = 1000


def run_once(factory: sessionmaker[Session], settings: Settings) -> None:
    reactions.run_pending(factory, settings)
    engine.settle_unconfirmable(factory, settings)  # suspects no worker of their chip re-ran in time
    profile_builder.build_pending(factory, settings)
    campaign_control.sweep(factory)


async def _loop(name: str, step: Callable[[sessionmaker[Session], Settings], object],
                factory: sessionmaker[Session], settings: Settings) -> None:
    while True:
        try:
            await asyncio.to_thread(step, factory, settings)
        except Exception:  # keep the loop alive: the queued work stays queued
            logger.exception("%s pass failed", name)
        await asyncio.sleep(settings.background_interval_seconds)


async def run_background(factory: sessionmaker[Session], settings: Settings) -> None:
    """Loop for ever; a failed pass is logged and retried on the next one."""
    await asyncio.gather(_loop("background", run_once, factory, settings),
                         _loop("alerts", notifications.run_pending, factory, settings),
                         _loop("regression scan", regression_scans.run_pending, factory, settings))


def _check_client(dbapi_connection: Any, _record: object) -> None:
    """PostgreSQL 14+: end a query of ours whose client (this process) is gone, within a second."""
    try:
        with dbapi_connection.cursor() as cur:
            cur.execute(f"SET client_connection_check_interval = {CLIENT_CHECK_MS}")
        dbapi_connection.commit()
    except Exception:  # older servers, or a pooler that refuses SET: locks then end with the query
        dbapi_connection.rollback()


def _exit_with_parent(parent: int, engine: Engine) -> None:
    """End this process at once (``os._exit``) when the server that started it is gone or stops
    it: a pass in progress runs on a worker thread that no cancellation reaches, so waiting for it
    (``asyncio.run`` does) kept the process, its connections and its per-chip locks for minutes.
    Its work is transactional: what it was doing rolls back and stays queued for the next pass.

    On Linux the kernel sends SIGTERM the moment the parent dies (``PR_SET_PDEATHSIG``, kill -9
    included); a thread watching the parent's pid covers other systems and the window before
    ``prctl``."""
    def leave(*_: object) -> None:
        with contextlib.suppress(Exception):  # idle pooled connections end cleanly; the rest with us
            engine.dispose()
        logging.shutdown()
        os._exit(0)

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        leave()

    signal.signal(signal.SIGTERM, on_term)  # stop_process, and the parent's death below
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)

    def watch() -> None:
        while os.getppid() == parent:
            threading.Event().wait(PARENT_WATCH_SECONDS)
        leave()

    threading.Thread(target=watch, name="kf-parent-watch", daemon=True).start()


def _process_main(settings: Settings, parent: int, log_level: str, ready: Event) -> None:
    """The background process: the loops, until the process that started it is gone or stops it."""
    from kernelfleet.service.db import is_sqlite, make_engine, make_sessionmaker

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole group: the server stops us
    with contextlib.suppress(OSError):  # Linux: `ps`, `top` and bench-load tell it from server processes
        Path("/proc/self/comm").write_text(PROCESS_NAME)
    if settings.background_nice and hasattr(os, "nice"):  # requests first when the host's cores are busy
        os.nice(settings.background_nice)
    level = getattr(logging, log_level.upper(), logging.DEBUG)  # uvicorn's levels ('trace' is below debug)
    logging.basicConfig(level=level, format="%(levelname)s:     [background] %(name)s: %(message)s")
    # three loops, each a lock-holding session plus the session a hook, build or scan opens beside it
    engine = make_engine(settings.database_url, pool_size=6, max_overflow=2,
                         pool_timeout=settings.db_pool_timeout_seconds)
    if not is_sqlite(engine):
        event.listen(engine, "connect", _check_client)
    factory = make_sessionmaker(engine)
    _exit_with_parent(parent, engine)

    async def main() -> None:
        asyncio.create_task(run_background(factory, settings))
        ready.set()
        await asyncio.Event().wait()  # until _exit_with_parent ends the process

    asyncio.run(main())


def start_process(settings: Settings, log_level: str = "warning") -> BaseProcess:
    """Start the background loop in a process of its own (``kernelfleet serve``); stop it with
    :func:`stop_process`. Its locks are those of the in-process loop, so several replicas (each with
    its own background process) still share the work without doubling it. Returns once the loop
    runs (a fresh interpreter imports the coordinator first: a second or two), so background work
    queued by the first requests is picked up as promptly as by an in-process loop."""
    context = multiprocessing.get_context("spawn")  # never fork a process holding pooled connections
    ready = context.Event()
    process = context.Process(target=_process_main, args=(settings, os.getpid(), log_level, ready),
                              name="kernelfleet-background", daemon=True)
    process.start()
    while not ready.wait(0.1):
        if not process.is_alive():
            raise RuntimeError(f"the background process exited at start (code {process.exitcode}): "
                               f"see its log above")
    return process


def stop_process(process: BaseProcess, timeout: float = 10.0) -> None:
    """Stop the background process: what it was doing stays queued (or committed) for the next pass."""
    if process.is_alive():
        process.terminate()
        process.join(timeout)
    if process.is_alive():
        process.kill()
        process.join()
