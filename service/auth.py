"""Tokens: the admin token (from settings), scoped API tokens, enrollment tokens and worker tokens.

API, enrollment and worker tokens are stored only as SHA-256 digests and compared in constant time.
A route names the scopes it accepts (:func:`authorize`): admin routes only ``admin``; the dashboard's
reads ``admin`` or ``read``; minting enrollment tokens ``admin`` or ``enroll``. The settings' admin
token has every scope.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

from sqlalchemy import (
    BindParameter,
    ColumnElement,
    Connection,
    Float,
    ScalarSelect,
    Select,
    Update,
    bindparam,
    or_,
    select,
    update,
)
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import db_now, immediate, is_sqlite
from kernelfleet.service.errors import Forbidden, NotFound, Unauthorized
from kernelfleet.service.models import ApiToken, TokenScope, Worker
from kernelfleet.service.targets import TARGET_COUNT

ADMIN_PREFIX = "kfa_"
ENROLL_PREFIX = "kfe_"
WORKER_PREFIX = "kfw_"
LEASE_PREFIX = "kfl_"
# API tokens say their scope in their first letters, so a config file shows which one it holds
SCOPE_PREFIX = {TokenScope.admin: ADMIN_PREFIX, TokenScope.read: "kfr_", TokenScope.enroll: "kfn_"}
ADMIN_ONLY = frozenset({TokenScope.admin})
READERS = frozenset({TokenScope.admin, TokenScope.read})
ENROLLERS = frozenset({TokenScope.admin, TokenScope.enroll})
SEEN_EVERY_SECONDS = 15.0  # a worker's last_heartbeat_at is refreshed at most this often...
Tokened = TypeVar("Tokened", Worker, ApiToken)  # rows found by their token's digest, revocable
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


def by_digest(session: Session, model: type[Tokened], token: str) -> Tokened | None:
    """The row of ``model`` whose ``token_digest`` is the token's (compared in constant time), or None."""
    wanted = digest(token)
    row = session.scalars(select(model).where(model.token_digest == wanted)).first()
    if row is None or not hmac.compare_digest(row.token_digest, wanted):
        return None
    return row


def _find_worker(session: Session, token: str) -> Worker | None:
    return by_digest(session, Worker, token)


def _stale(cutoff: ColumnElement[Any]) -> ColumnElement[bool]:
    return or_(Worker.last_heartbeat_at.is_(None), Worker.last_heartbeat_at < cutoff)


def live_worker_id(wanted: BindParameter[str]) -> ScalarSelect[int]:
    """The id of the unrevoked worker whose token digest is ``wanted``, as a scalar subquery (NULL for
    none): a worker's own write, authenticated inside its statement."""
    return (select(Worker.id).where(Worker.token_digest == wanted, Worker.revoked_at.is_(None))
            .scalar_subquery())


# a worker's token digest and -refresh_after (who_params()), the parameters of the worker's statements
WHO_DIGEST: BindParameter[str] = bindparam("who_digest")
WHO_SHIFT: BindParameter[float] = bindparam("who_shift", type_=Float)
# the unrevoked worker of :who_digest seen now, when its last-seen time is older than now + :who_shift
SEEN: Update = (update(Worker).where(Worker.token_digest == WHO_DIGEST, Worker.revoked_at.is_(None),
                                     _stale(db_now(WHO_SHIFT)))
                .values(last_heartbeat_at=db_now()).execution_options(synchronize_session=False))


def _who_query(sqlite: bool, *columns: Any) -> Select[Any]:
    """The worker whose token digest is ``:who_digest`` (``columns``, then its id, name, digest, revoked
    time and whether its last-seen time is older than ``now + :who_shift``); on PostgreSQL with
    :data:`SEEN` as a CTE (one round trip; the SELECT reads the row as it was)."""
    query = select(*columns, Worker.id.label("kf_id"), Worker.name.label("kf_name"),
                   Worker.token_digest.label("kf_digest"), Worker.revoked_at.label("kf_revoked"),
                   _stale(db_now(WHO_SHIFT)).label("kf_stale")).where(Worker.token_digest == WHO_DIGEST)
    return query if sqlite else query.add_cte(SEEN.returning(Worker.id).cte("kf_seen"))


# built once, executed with parameters: (SQLite?, the ORM entity or the columns a lease needs: the
# worker's backend and chip, and how many job targets there are)
_LEASE_COLUMNS = (Worker.backend, Worker.chip, TARGET_COUNT.label("kf_targets"))
_WHO = {(sqlite, entity): _who_query(sqlite, *((Worker,) if entity else _LEASE_COLUMNS))
        for sqlite in (False, True) for entity in (False, True)}


def who_params(token: str, refresh_after: float) -> dict[str, Any]:
    return {"who_digest": digest(token), "who_shift": -float(refresh_after)}


def _who(execute: Callable[..., Any], token: str | None, refresh_after: float, sqlite: bool,
         entity: bool) -> Any:
    """The row of :func:`_who_query` for ``token``'s worker, recorded as seen; 401 for none or revoked."""
    if token is None:
        raise Unauthorized(token_refusal(True, None))
    params = who_params(token, refresh_after)
    row = execute(_WHO[sqlite, entity], params).first()
    if row is None or not hmac.compare_digest(row.kf_digest, params["who_digest"]):
        raise Unauthorized(token_refusal(False, None))
    if row.kf_revoked is not None:
        raise Unauthorized(f"worker {row.kf_id} ({row.kf_name}) was revoked; "
                           f"enroll it again to get a new token")
    if row.kf_stale and sqlite:
        execute(SEEN, params)
    return row


def authenticate_worker(session: Session, token: str | None,
                        refresh_after: float = SEEN_EVERY_SECONDS) -> Worker:
    """The worker owning ``token``; records that it was seen (database clock). Raises 401 otherwise.

    Runs inside the caller's transaction: one SELECT through the unique ``token_digest`` index, and
    an UPDATE of ``last_heartbeat_at`` only when it is older than ``refresh_after`` seconds (see
    :func:`seen_every`; a write, and a row lock, on every request would serialise a worker's
    concurrent requests and cost a write per heartbeat for nothing). On PostgreSQL the UPDATE is a
    CTE of the SELECT; on SQLite a statement of its own, when the SELECT found the time stale.
    """
    sqlite = is_sqlite(session.get_bind().engine)
    worker: Worker = _who(session.execute, token, refresh_after, sqlite, True).Worker
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

    @contextmanager
    def statements(self) -> Iterator[tuple[Connection, bool]]:
        """(a Core connection, whether it is SQLite) for a worker's write that authenticates inside its
        own statements (:func:`live_worker_id`, :data:`SEEN`): no ORM session, no worker row loaded. On
        PostgreSQL each statement commits on its own (autocommit: one round trip for a one-statement
        request); on SQLite they run in one ``BEGIN IMMEDIATE`` transaction, committed on success."""
        engine = self.session_factory.kw["bind"]
        if is_sqlite(engine):
            with engine.connect().execution_options(sqlite_immediate=True) as conn, conn.begin():
                yield conn, True
        else:
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn, False

    def identify(self, conn: Connection, sqlite: bool) -> Any:
        """In :meth:`statements`: the worker's id (``kf_id``), ``backend`` and ``chip``, recorded as
        seen (as :func:`authenticate_worker`, without loading the ORM row), and the number of job
        targets (``kf_targets``, :data:`~kernelfleet.service.targets.TARGET_COUNT`); 401 for a bad
        token."""
        return _who(conn.execute, self.token, self.refresh_after, sqlite, False)


def revoke(session: Session, model: type[Tokened], row_id: int, missing: str) -> Tokened:
    """Mark a worker or API token revoked (once: a second revoke keeps the first time); NotFound
    with ``missing`` when there is no such row."""
    with immediate(session):
        row = session.get(model, row_id)
        if row is None:
            raise NotFound(missing)
        if row.revoked_at is None:
            session.execute(update(model).where(model.id == row_id).values(revoked_at=db_now())
                            .execution_options(synchronize_session=False))
        session.refresh(row)
    return row


def find_api_token(session: Session, token: str) -> ApiToken | None:
    """The API token row of ``token`` (revoked or not), or None."""
    return by_digest(session, ApiToken, token)


def _needs(allowed: frozenset[TokenScope]) -> str:
    """The words for what a route accepts: "the admin token", "the admin token or a read token"."""
    others = [f"{'an' if s.value[0] in 'aeiou' else 'a'} {s.value} token" for s in sorted(allowed)
              if s != TokenScope.admin]
    return " or ".join(["the admin token", *others])


def token_refusal(missing: bool, allowed: frozenset[TokenScope] | None) -> str:
    """The 401 for no token (``missing``) or a token that is no one's, on a route that takes a token
    of ``allowed`` (None: a worker's)."""
    if allowed is None:
        return ("missing worker token: send `Authorization: Bearer <worker token>`" if missing else
                "invalid worker token: enroll again with `kernelfleet worker --enroll-token ...`")
    noun = "admin token" if allowed == ADMIN_ONLY else "token"
    where = "the coordinator's KERNELFLEET_ADMIN_TOKEN, or one from `kernelfleet admin tokens create`"
    if missing:
        return f"missing {noun}: send `Authorization: Bearer <token>` ({_needs(allowed)}: {where})"
    return f"invalid {noun}: use {_needs(allowed)} ({where})"


def token_scope(session_factory: sessionmaker[Session], token: str | None, admin_token: str | None,
                ) -> TokenScope | None:
    """The scope ``token`` carries (the settings' admin token: admin), or None for no valid API token."""
    if token is None:
        return None
    if is_admin_token(token, admin_token):
        return TokenScope.admin
    with session_factory() as session:
        row = find_api_token(session, token)
    return row.scope if row is not None and row.revoked_at is None else None


ADMIN_ACTOR = "admin"  # who the settings' admin token is, in what a person changed (regression triage)


def actor_name(row: ApiToken | None) -> str:
    """Who made a change: ``admin`` (the settings' admin token) or ``token ID (NAME)`` (an API token)."""
    return ADMIN_ACTOR if row is None else f"token {row.id} ({row.name})"[:160]


def authorize(session_factory: sessionmaker[Session], token: str | None, admin_token: str | None,
              allowed: frozenset[TokenScope] = ADMIN_ONLY) -> TokenScope:
    """Accept the admin token or an unrevoked API token of an ``allowed`` scope; returns its scope.
    401 without a valid token, 403 for a valid token of another scope or a worker's token (looked up
    in a short session of its own, only when the token is not the admin token)."""
    return identify(session_factory, token, admin_token, allowed)[0]


def identify(session_factory: sessionmaker[Session], token: str | None, admin_token: str | None,
             allowed: frozenset[TokenScope] = ADMIN_ONLY) -> tuple[TokenScope, str]:
    """:func:`authorize`, and who the token is (:func:`actor_name`)."""
    needs = _needs(allowed)
    if token is None:
        raise Unauthorized(token_refusal(True, allowed))
    if is_admin_token(token, admin_token):
        return TokenScope.admin, ADMIN_ACTOR
    with session_factory() as session:
        row = find_api_token(session, token)
        worker = _find_worker(session, token) if row is None else None
    if row is not None:
        if row.revoked_at is not None:
            raise Unauthorized(f"token {row.id} ({row.name}) was revoked; ask an admin for a new one")
        if row.scope in allowed:
            return row.scope, actor_name(row)
        raise Forbidden(f"this needs {needs}; a {row.scope.value} token is not accepted here")
    if worker is not None:
        raise Forbidden(f"this needs {needs}; a worker token is not accepted here")
    raise Unauthorized(token_refusal(False, allowed))


def authenticate_admin(session_factory: sessionmaker[Session], token: str | None,
                       admin_token: str | None) -> None:
    """Accept only an admin token (the settings' or an API token of scope admin)."""
    authorize(session_factory, token, admin_token, ADMIN_ONLY)
