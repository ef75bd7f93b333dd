"""Tokens: the admin token (from settings), enrollment tokens and worker tokens.

Enrollment and worker tokens are stored only as SHA-256 digests and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Forbidden, Unauthorized
from kernelfleet.service.models import Worker

ADMIN_PREFIX = "kfa_"
ENROLL_PREFIX = "kfe_"
WORKER_PREFIX = "kfw_"
LEASE_PREFIX = "kfl_"
SEEN_EVERY_SECONDS = 15.0  # a worker's last_heartbeat_at is refreshed at most this often...
SEEN_FRACTION = 0.1  # ...and at least every tenth of the offline threshold (the fleet page's status)


def seen_every(offline_after_seconds: float) -> float:
    """How stale ``last_heartbeat_at`` may get before a request refreshes it."""
    return min(SEEN_EVERY_SECONDS, offline_after_seconds * SEEN_FRACTION)


def new_token(prefix: str) -> str:
    return prefix + secrets.token_urlsafe(32)


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def is_admin_token(token: str, admin_token: str | None) -> bool:
    if not admin_token:
        return False
    return hmac.compare_digest(digest(token), digest(admin_token))


def _find_worker(session: Session, token: str) -> Worker | None:
    wanted = digest(token)
    worker = session.scalars(select(Worker).where(Worker.token_digest == wanted)).first()
    if worker is None or not hmac.compare_digest(worker.token_digest, wanted):
        return None
    return worker


def authenticate_worker(session: Session, token: str | None,
                        refresh_after: float = SEEN_EVERY_SECONDS) -> Worker:
    """The worker owning ``token``; records that it was seen (database clock). Raises 401 otherwise.

    Runs inside the caller's transaction: one SELECT through the unique ``token_digest`` index, and
    an UPDATE of ``last_heartbeat_at`` only when it is older than ``refresh_after`` seconds (see
    :func:`seen_every`; a write, and a row lock, on every request would serialise a worker's
    concurrent requests and cost a write per heartbeat for nothing).
    """
    if token is None:
        raise Unauthorized("missing worker token: send `Authorization: Bearer <worker token>`")
    wanted = digest(token)
    stale = or_(Worker.last_heartbeat_at.is_(None), Worker.last_heartbeat_at < db_now(-refresh_after))
    row = session.execute(select(Worker, stale.label("stale")).where(Worker.token_digest == wanted)).first()
    if row is None or not hmac.compare_digest(row.Worker.token_digest, wanted):
        raise Unauthorized("invalid worker token: enroll again with `kernelfleet worker --enroll-token ...`")
    worker: Worker = row.Worker
    if worker.revoked_at is not None:
        raise Unauthorized(f"worker {worker.id} ({worker.name}) was revoked; "
                           f"enroll it again to get a new token")
    if row.stale:
        session.execute(update(Worker).where(Worker.id == worker.id).values(last_heartbeat_at=db_now())
                        .execution_options(synchronize_session=False))
    return worker


@dataclass(frozen=True)
class WorkerCall:
    """A worker's request: its bearer token, checked in the route's own unit of work.

    ``with call.transaction() as (session, worker):`` opens a session, begins a write transaction
    (``BEGIN IMMEDIATE`` on SQLite), authenticates the worker and commits on success, all on the
    calling thread: the session never waits for another thread while it holds a connection.
    """

    session_factory: sessionmaker[Session]
    token: str | None
    refresh_after: float = SEEN_EVERY_SECONDS  # see seen_every()

    @contextmanager
    def transaction(self) -> Iterator[tuple[Session, Worker]]:
        with self.session_factory() as session, immediate(session):
            yield session, authenticate_worker(session, self.token, self.refresh_after)


def authenticate_admin(session_factory: sessionmaker[Session], token: str | None,
                       admin_token: str | None) -> None:
    """Accept only the admin token: 401 without a valid token, 403 for a worker token (looked up in a
    short session of its own, only when the token is not the admin token)."""
    if token is None:
        raise Unauthorized("missing admin token: send `Authorization: Bearer <admin token>` "
                           "(the coordinator's KERNELFLEET_ADMIN_TOKEN)")
    if is_admin_token(token, admin_token):
        return
    with session_factory() as session:
        worker = _find_worker(session, token)
    if worker is not None:
        raise Forbidden("this route needs the admin token; a worker token is not accepted here")
    raise Unauthorized("invalid admin token: use the coordinator's KERNELFLEET_ADMIN_TOKEN")
