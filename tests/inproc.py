"""A coordinator app served by uvicorn on a thread of the test process (for tests whose subject is not
processes): the real HTTP stack on a free loopback port, started in well under a second, with the
app's lifespan (reaper, background loop) running; and the ``kernelfleet`` CLI run in-process."""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import uvicorn
from click.testing import CliRunner, Result

from kernelfleet.service.app import create_app
from kernelfleet.service.cli import KEEP_ALIVE
from kernelfleet.service.settings import Settings


class ThreadServer:
    """``create_app(settings)`` under uvicorn on a thread of this process: the real HTTP stack with the
    app's lifespan (reaper, background loop). Warnings and errors the app logs (tracebacks included)
    go to ``log_path`` while it runs."""

    def __init__(self, settings: Settings, log_path: Path | None = None, *, port: int | None = None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.app: Any = None
        self.port = settings.port if port is None else port  # the bound port once started
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._handler: logging.Handler | None = None

    def start(self, timeout: float = 90.0) -> None:
        self.app = create_app(self.settings)
        # log_config=None: uvicorn leaves the process's logging alone (no dictConfig per server); idle
        # keep-alive connections stay open as long as `kernelfleet serve` keeps them (uvicorn's 5 s
        # default closed one as test_concurrency's client reused it: a reset request on a loaded host)
        server = uvicorn.Server(uvicorn.Config(self.app, host=self.settings.host, port=self.port,
                                               log_config=None, log_level="warning", lifespan="on",
                                               timeout_graceful_shutdown=10, timeout_keep_alive=KEEP_ALIVE))
        started = threading.Event()
        original = server.startup

        async def startup(sockets: Any = None) -> None:
            await original(sockets)
            if server.started:
                started.set()

        server.startup = startup  # type: ignore[method-assign]
        if self.log_path is not None:
            self._handler = logging.FileHandler(self.log_path)
            self._handler.setLevel(logging.WARNING)
            logging.getLogger().addHandler(self._handler)
        self._server = server
        self._thread = threading.Thread(target=server.run, name="coordinator", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not started.wait(0.05):
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the in-thread coordinator did not start:\n{self.logs()}")
        self.port = server.servers[0].sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._server is not None and self._thread is not None:
            self._server.should_exit = True
            self._thread.join(30)
        self._server = self._thread = None
        if self._handler is not None:
            logging.getLogger().removeHandler(self._handler)
            self._handler.close()
            self._handler = None

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""


def settings_from_env(env: Mapping[str, str], **values: Any) -> Settings:
    """Settings as ``kernelfleet serve`` reads them from ``env`` (its ``KERNELFLEET_*`` variables)."""
    with mock.patch.dict(os.environ, {k: v for k, v in env.items() if k.startswith("KERNELFLEET_")}):
        return Settings(**values)


@contextmanager
def serve_in_thread(settings: Settings) -> Iterator[tuple[str, Any]]:
    """``(url, app)`` of ``create_app(settings)`` served on 127.0.0.1 (a free port); stopped on exit."""
    server = ThreadServer(settings.model_copy(update={"host": "127.0.0.1"}), port=0)
    server.start()
    try:
        yield f"http://127.0.0.1:{server.port}", server.app
    finally:
        server.stop()


def fast_settings(database_url: str, **overrides: Any) -> Settings:
    """Settings for a test coordinator: background passes every 0.1 s, profiles rebuilt at once."""
    values: dict[str, Any] = {"database_url": database_url, "admin_token": "kfa_test-admin",
                              "background_interval_seconds": 0.1, "profile_min_interval_seconds": 0,
                              "calibration_interval_seconds": 0}
    return Settings(**{**values, **overrides})


def run_cli(*args: str, env: Mapping[str, str | None] | None = None) -> Result:
    """``kernelfleet ARGS`` in this process (click's runner: output captured, exit code kept)."""
    from kernelfleet.worker.cli import command

    return CliRunner().invoke(command(), list(args), env=dict(env or {}), catch_exceptions=False)


def stop_group(proc: subprocess.Popen[Any], timeout: float = 20.0) -> None:
    """SIGTERM a process started with ``start_new_session=True`` and its group; SIGKILL after
    ``timeout``."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


# Ports for servers the tests start. A port the kernel hands out for port 0 is free only until someone
# else asks: a server another test binds to port 0, or the local end of any outgoing connection, may
# take it before our server binds it (CI once saw a test's coordinator URL answered by another test's
# fake router). So ports come from below the ephemeral range (Linux: 32768-60999), a slice of their
# own for each pytest-xdist worker, each checked free by a bind before it is handed out.
PORTS = range(20000, 32000)
_SLICES = 8
_next_port = None


def free_port() -> int:
    global _next_port
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    width = len(PORTS) // _SLICES
    first = PORTS.start + (index % _SLICES) * width
    if _next_port is None:  # a random start: two runs side by side (two checkouts) rarely meet
        _next_port = int.from_bytes(os.urandom(2), "big") % width
    for _ in range(width):
        port = first + _next_port
        _next_port = (_next_port + 1) % width
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port in {first}-{first + width - 1}")
