"""The worker's state directory: its credentials (mode 0600) and its spool.

Default location: the user's data directory (platformdirs), ``.../kernelfleet/worker``. The
credentials file holds the worker token the coordinator showed once at enrollment, the worker id
and the coordinator URL it belongs to. It is written atomically and never readable by others.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kernelfleet.worker.spool import Spool

logger = logging.getLogger(__name__)

TOKEN_FILE = "token"
IDENTITY_FILE = "identity.json"
LOCK_FILE = "agent.lock"


class StateError(Exception):
    """The state directory or its credentials cannot be used."""


def default_state_dir() -> Path:
    from platformdirs import user_data_dir  # only needed when no --state-dir is given

    return Path(user_data_dir("kernelfleet", appauthor=False)) / "worker"


@dataclass(frozen=True)
class Credentials:
    token: str
    worker_id: int | str | None = None
    coordinator: str | None = None


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


class WorkerState:
    def __init__(self, root: Path) -> None:
        self.root = Path(root).expanduser()
        try:
            self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise StateError(f"cannot create the worker state directory {self.root}: {e}") from e
        self.spool = Spool(self.root / "spool")
        self._lock_fd: int | None = None

    def lock(self) -> None:
        """Hold this state directory for the life of the process: two agents sharing one token and
        one spool would confuse the coordinator and each other."""
        path = self.root / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise StateError(f"another worker agent (pid {holder}) is already using {self.root}; stop it "
                             "first, or give this one its own --state-dir") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    @property
    def token_path(self) -> Path:
        return self.root / TOKEN_FILE

    @property
    def identity_path(self) -> Path:
        return self.root / IDENTITY_FILE

    def load_credentials(self) -> Credentials | None:
        path = self.token_path
        if not path.exists():
            return None
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                logger.warning("%s was readable by others (mode %o); tightening it to 0600", path, mode)
                os.chmod(path, 0o600)
            token = path.read_text().strip()
        except OSError as e:
            raise StateError(f"cannot read the worker token {path}: {e}") from e
        if not token:
            raise StateError(f"the worker token file {path} is empty; delete it and enroll again with "
                             "--enroll-token")
        worker_id: int | str | None = None
        coordinator: str | None = None
        try:
            identity = json.loads(self.identity_path.read_text())
            worker_id, coordinator = identity.get("worker_id"), identity.get("coordinator")
        except (OSError, ValueError, AttributeError):
            pass  # the identity file is informational; the token alone identifies the worker
        return Credentials(token=token, worker_id=worker_id, coordinator=coordinator)

    def save_credentials(self, creds: Credentials) -> None:
        """Atomically write the token with mode 0600 (created so, never widened), then the identity."""
        try:
            _write_atomic(self.token_path, creds.token.encode() + b"\n", 0o600)
            _write_atomic(self.identity_path, json.dumps(
                {"worker_id": creds.worker_id, "coordinator": creds.coordinator}).encode(), 0o600)
        except OSError as e:
            raise StateError(f"cannot store the worker token in {self.token_path}: {e}") from e

    def forget_credentials(self) -> None:
        self.token_path.unlink(missing_ok=True)
        self.identity_path.unlink(missing_ok=True)
