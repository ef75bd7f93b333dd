"""Which process runs the coordinator's periodic work (the reaper, and any other loop registered the
same way) when several run: ``kernelfleet serve --workers N`` and replicas.

- PostgreSQL: every process runs the loops, and each pass takes a transaction-level advisory lock
  (``pg_try_advisory_xact_lock(key)``); a pass that does not get it does nothing. Replicas on one
  database need nothing else, and when a replica dies the next pass of another one takes over.
- SQLite (one machine): one process at a time holds an exclusive ``fcntl`` lock on
  ``<data dir>/periodic.lock`` and runs the loops; the others try again before each pass, so the
  work moves on when the holder exits.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.service.db import is_sqlite

LOCK_FILE = "periodic.lock"


class ProcessLock:
    """A non-blocking exclusive lock on a file, held until this process exits or :meth:`release`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None

    def acquire(self) -> bool:
        """True when this process holds the lock (now or already)."""
        if self._fd is not None:
            return True
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd = fd
        return True

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops the flock
            self._fd = None


def try_pass_lock(session: Session, key: int, process_lock: ProcessLock | None) -> bool:
    """May this process run one pass of the periodic job ``key`` in ``session``'s transaction?

    PostgreSQL: the advisory lock ``key`` for this transaction. SQLite: the process lock.
    """
    if is_sqlite(session.get_bind().engine):
        return process_lock is None or process_lock.acquire()
    return bool(session.scalar(select(func.pg_try_advisory_xact_lock(key))))
