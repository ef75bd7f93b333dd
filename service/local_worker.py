"""``kernelfleet serve --local-worker``: run one worker agent next to the coordinator as a child
process, enrolled with an enrollment token minted directly in the database."""

from __future__ import annotations

import logging
import subprocess
import threading
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.auth import digest
from kernelfleet.service.client import wait_until_healthy
from kernelfleet.service.enrollment import mint_enrollment_token
from kernelfleet.service.models import Worker
from kernelfleet.worker.child import worker_command, worker_env

logger = logging.getLogger(__name__)

STATE_DIR = "local-worker"
TOKEN_FILE = "token"


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
        cmd = worker_command("--coordinator", self.url, "--state-dir", str(self.state_dir))
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
