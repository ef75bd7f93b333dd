"""Non-blocking locks for background work shared by coordinator processes and replicas.

- PostgreSQL: ``pg_try_advisory_xact_lock(KEY, hashtext(name))``, held until the transaction ends;
  one per name (a chip, a backend, ``reactions``), so replicas share the work and never double it.
- SQLite (one machine): an exclusive ``flock`` on ``<database>.<name>.lock`` beside the database,
  shared by every process that serves that file.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from kernelfleet.service.db import is_sqlite

LOCK_CLASS = 0x6B66  # first key of KernelFleet's PostgreSQL advisory locks ("kf")


def pg_try_lock(session: Session, name: str) -> bool:
    """Take the transaction-scoped advisory lock ``name`` if free (PostgreSQL)."""
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:c, hashtext(:n))"),
                               {"c": LOCK_CLASS, "n": name}))


@contextlib.contextmanager
def file_lock(session: Session, name: str) -> Iterator[bool]:
    """An exclusive, non-blocking lock beside the SQLite database; yields whether it was taken."""
    database = make_url(str(session.get_bind().engine.url)).database or ""
    if not database or database == ":memory:":
        yield True
        return
    db = Path(database).expanduser()
    with open(db.with_name(f"{db.name}.{name}.lock"), "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


@contextlib.contextmanager
def background_lock(session: Session, name: str) -> Iterator[bool]:
    """The lock ``name`` for one pass of background work; yields whether this process holds it.

    PostgreSQL: the advisory lock, in a transaction of ``session`` that lasts until the block ends, so
    the block's work on ``session`` runs inside it. SQLite: the file lock, with no transaction open:
    the block opens its own (e.g. :func:`kernelfleet.service.db.immediate`)."""
    if is_sqlite(session.get_bind().engine):
        with file_lock(session, name) as mine:
            yield mine
        return
    with session.begin():
        yield pg_try_lock(session, name)
