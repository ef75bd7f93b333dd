"""``kernelfleet serve --local-worker``: run one worker agent next to the coordinator as a child
process, enrolled with an enrollment token minted directly in the database."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.auth import digest
from kernelfleet.service.client import wait_until_healthy
from kernelfleet.service.enrollment import mint_enrollment_token
from kernelfleet.service.models import Worker

logger = logging.getLogger(__name__)

STATE_DIR = "local-worker"
TOKEN_FILE = "token"


ENROLL_TOKEN_ENV = "KERNELFLEET_ENROLL_TOKEN"


def worker_command(coordinator_url: str, state_dir: Path) -> list[str]:
    """The agent's command line. It holds no secret: the enrollment token goes in the environment
    (:func:`worker_env`), where ``ps`` does not show it to other users."""
    # -P: the installed package, not a kernelfleet/ folder in the working directory (a clone's)
    return [sys.executable, "-P", "-m", "kernelfleet.worker.cli", "worker", "--coordinator", coordinator_url,
            "--state-dir", str(state_dir)]


def worker_env(enroll_token: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != ENROLL_TOKEN_ENV}
    if enroll_token is not None:
        env[ENROLL_TOKEN_ENV] = enroll_token
    return env


class LocalWorker:
    """Starts the agent once the server answers /healthz; :meth:`stop` terminates it."""

    def __init__(self, session_factory: sessionmaker[Session], coordinator_url: str, data_dir: Path,
                 ttl_seconds: float = 600.0) -> None:
        self.session_factory = session_factory
        self.url = coordinator_url
        self.state_dir = data_dir / STATE_DIR
        self.ttl_seconds = ttl_seconds
        self.proc: subprocess.Popen[bytes] | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._start_when_healthy, name="local-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _start_when_healthy(self) -> None:
        if not wait_until_healthy(self.url, stopping=self._stopping.is_set):
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        enroll = None
        if not self._stored_token_known():
            with self.session_factory() as session:
                enroll, _ = mint_enrollment_token(session, self.ttl_seconds)
        cmd = worker_command(self.url, self.state_dir)
        logger.info("starting the local worker (state in %s)", self.state_dir)
        self.proc = subprocess.Popen(cmd, env=worker_env(enroll))

    def _stored_token_known(self) -> bool:
        """True when the state dir holds a token of a worker in *this* database (revoked or not).

        A missing token, or one from another database (the SQLite file was replaced), needs a
        fresh enrollment; a revoked local worker is not silently re-enrolled.
        """
        try:
            token = (self.state_dir / TOKEN_FILE).read_text().strip()
        except OSError:
            return False
        with self.session_factory() as session:
            return session.scalar(select(Worker.id).where(Worker.token_digest == digest(token))) is not None

    def request_stop(self) -> None:
        """Ask the agent to stop (SIGTERM: it finishes or releases its job) without waiting."""
        self._stopping.set()
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.terminate()

    def stop(self, timeout: float = 20.0) -> None:
        self.request_stop()
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
