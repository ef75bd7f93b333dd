"""Tokens: the admin token (from settings), enrollment tokens and worker tokens.

Enrollment and worker tokens are stored only as SHA-256 digests and compared in constant time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from sqlalchemy import select, update
from sqlalchemy.orm import Session

from kernelfleet.service.db import db_now, immediate
from kernelfleet.service.errors import Forbidden, Unauthorized
from kernelfleet.service.models import Worker

ADMIN_PREFIX = "kfa_"
ENROLL_PREFIX = "kfe_"
WORKER_PREFIX = "kfw_"
LEASE_PREFIX = "kfl_"


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


def authenticate_worker(session: Session, token: str | None) -> Worker:
    """The worker owning ``token``; records its heartbeat (database clock). Raises 401 otherwise.

    Runs (and commits) its own short write transaction.
    """
    if token is None:
        raise Unauthorized("missing worker token: send `Authorization: Bearer <worker token>`")
    with immediate(session):
        worker = _find_worker(session, token)
        if worker is None:
            raise Unauthorized("invalid worker token: enroll again with "
                               "`kernelfleet worker --enroll-token ...`")
        if worker.revoked_at is not None:
            raise Unauthorized(f"worker {worker.id} ({worker.name}) was revoked; "
                               f"enroll it again to get a new token")
        session.execute(update(Worker).where(Worker.id == worker.id).values(last_heartbeat_at=db_now()))
        session.refresh(worker)
    return worker


def authenticate_admin(session: Session, token: str | None, admin_token: str | None) -> None:
    """Accept only the admin token: 401 without a valid token, 403 for a worker token."""
    if token is None:
        raise Unauthorized("missing admin token: send `Authorization: Bearer <admin token>` "
                           "(the coordinator's KERNELFLEET_ADMIN_TOKEN)")
    if is_admin_token(token, admin_token):
        return
    worker = _find_worker(session, token)
    session.rollback()
    if worker is not None:
        raise Forbidden("this route needs the admin token; a worker token is not accepted here")
    raise Unauthorized("invalid admin token: use the coordinator's KERNELFLEET_ADMIN_TOKEN")
