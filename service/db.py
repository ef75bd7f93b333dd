"""Engine and session construction for SQLite and PostgreSQL.

SQLite runs in WAL mode with a busy timeout. Transactions that write start with
``BEGIN IMMEDIATE`` (see :func:`immediate`), so the leasing ``UPDATE ... RETURNING``
is atomic against other writers.

JSON columns are written with orjson (:func:`json_dumps`): a 40 KB report's trials (each one's samples
and config) took 1.5 ms to encode with ``json.dumps`` and 0.09 ms with orjson on the quiet 2-core
development host (6.5 and 0.32 ms with the test suite running beside it). They are read with
``json.loads`` (orjson would read an integer over 64 bits as a float).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path
from typing import Any, cast

import orjson
from sqlalchemy import (
    JSON,
    DateTime,
    Engine,
    Table,
    create_engine,
    event,
    exc,
    literal,
    text,
)
from sqlalchemy.engine import make_url
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.sql.expression import ColumnElement, FunctionElement


def is_sqlite(url_or_engine: str | Engine) -> bool:
    url = url_or_engine.url if isinstance(url_or_engine, Engine) else make_url(url_or_engine)
    return url.get_backend_name() == "sqlite"


def normalize_url(url: str) -> str:
    """Use psycopg 3 for plain ``postgresql://`` URLs."""
    if url.startswith("postgresql://") or url.startswith("postgres://"):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    return url


JSON_OPTIONS = orjson.OPT_NON_STR_KEYS | orjson.OPT_SERIALIZE_NUMPY  # as json.dumps takes them


def json_dumps(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """A JSON column's text: orjson's, or ``json.dumps``'s for what orjson refuses (a lone surrogate, an
    integer over 64 bits), ``default`` then writing what ``json.dumps`` cannot (orjson writes times
    itself). A NaN is written as null (PostgreSQL's JSON refuses ``NaN``; SQLite kept it)."""
    try:
        return orjson.dumps(value, option=JSON_OPTIONS).decode()
    except TypeError:
        return json.dumps(value, default=default)


def make_engine(url: str, **kwargs: Any) -> Engine:
    url = normalize_url(url)
    kwargs = {"json_serializer": json_dumps, **kwargs}
    if is_sqlite(url):
        database = make_url(url).database
        if database and database != ":memory:":
            Path(database).expanduser().parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(url, connect_args={"timeout": 30, "check_same_thread": False}, **kwargs)

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
            # Let SQLAlchemy, not pysqlite, emit BEGIN (so BEGIN IMMEDIATE works).
            dbapi_connection.isolation_level = None
            cur = dbapi_connection.cursor()
            cur.execute("PRAGMA journal_mode=WAL")
            cur.execute("PRAGMA busy_timeout=30000")
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA synchronous=NORMAL")
            cur.close()

        # Writers of this process queue on a lock before BEGIN IMMEDIATE: SQLite's busy handler polls
        # with sleeps of up to 100 ms, so 30 threads contending for the write lock through it took
        # seconds per write; the busy timeout is then left to writers in other processes.
        write_lock = threading.Lock()

        @event.listens_for(engine, "begin")
        def _sqlite_begin(conn: Any) -> None:
            immediate = bool(conn.get_execution_options().get("sqlite_immediate"))
            if immediate:
                write_lock.acquire()
                conn.info["kf_write_lock"] = True
            try:
                conn.exec_driver_sql(f"BEGIN {'IMMEDIATE' if immediate else 'DEFERRED'}")
            except BaseException:
                _release(conn)
                raise

        def _release(conn: Any) -> None:
            if conn.info.pop("kf_write_lock", False):
                write_lock.release()

        event.listen(engine, "commit", _release)
        event.listen(engine, "rollback", _release)

        return engine
    if "pool_pre_ping" in kwargs:  # the caller's choice (the health probe pings every checkout)
        return create_engine(url, **kwargs)
    engine = create_engine(url, **kwargs)
    _ping_when_idle(engine)
    return engine


# a pooled PostgreSQL connection idle longer than this is pinged before use (a server, firewall or
# proxy may have dropped it meanwhile); one in steady use is not: a ping is a round trip of its own,
# on each request, to a database that may be milliseconds away
PING_IDLE_SECONDS = 10.0


def _ping_when_idle(engine: Engine) -> None:
    """``pool_pre_ping`` for connections that sat in the pool over :data:`PING_IDLE_SECONDS`: a dead
    one is replaced before the request uses it (SQLAlchemy retries the checkout on a
    ``DisconnectionError``). A connection that dies while in steady use fails its request's first
    statement, which invalidates the pool, as it would between a ping and that statement."""

    def fresh(_dbapi_connection: Any, record: Any) -> None:
        record.info["kf_idle_since"] = time.monotonic()

    def checkout(dbapi_connection: Any, record: Any, _proxy: Any) -> None:
        idle_since = record.info.get("kf_idle_since")
        if idle_since is not None and time.monotonic() - idle_since <= PING_IDLE_SECONDS:
            return
        try:
            engine.dialect.do_ping(dbapi_connection)
        except engine.dialect.loaded_dbapi.Error as e:
            if engine.dialect.is_disconnect(e, dbapi_connection, None):
                raise exc.DisconnectionError(str(e)) from e
            raise

    event.listen(engine.pool, "connect", fresh)
    event.listen(engine.pool, "checkin", fresh)
    event.listen(engine.pool, "checkout", checkout)


def upsert_insert(session: Session) -> Any:
    """The dialect's ``insert`` (with ``on_conflict_do_nothing``) for the session's database."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    return sqlite_insert if is_sqlite(session.get_bind().engine) else pg_insert


def insert_rows(session: Session, table: Table, rows: Sequence[dict[str, Any]],
                conflict: Sequence[str] = ()) -> int:
    """Insert ``rows`` (dicts with the same keys) into ``table``, each left out where it meets a row on the
    ``conflict`` columns' unique index (none: a plain insert); the rows inserted.

    On PostgreSQL one statement with one parameter whatever the number of rows: the rows as one JSON
    array (:func:`json_dumps`, times written as ISO 8601 either way), unpacked by
    ``json_to_recordset`` into the columns' types, each value first bound as SQLAlchemy binds it (a column
    type's bind processor: an enum as its value) and a JSON column's null stored as JSON ``null``, as
    SQLAlchemy's ``JSON`` stores None. A float NaN would arrive as NULL (orjson writes it null): the
    values stored this way are finite (reports refuse NaN, and statistics are of positive medians).
    psycopg's executemany sends a statement a row, and its per-row Python work was most of a 40 KB
    report's two inserts (``results/coordinator_result_cpu_profile.txt``); arrays a column (``unnest``)
    moved that work into psycopg's array dumping. Elsewhere (SQLite, in-process) an executemany."""
    if not rows:
        return 0
    if is_sqlite(session.get_bind().engine):
        stmt = upsert_insert(session)(table)
        if conflict:
            stmt = stmt.on_conflict_do_nothing(index_elements=list(conflict))
        done = session.execute(stmt, list(rows), execution_options={"preserve_rowcount": True})
        return int(cast(Any, done).rowcount)
    sql, binds = _recordset_insert(table, tuple(rows[0]), tuple(conflict), session.get_bind().dialect)
    if binds:
        rows = [{**r, **{name: bind(r[name]) for name, bind in binds}} for r in rows]
    body = json_dumps(list(rows), default=_iso)
    return int(cast(Any, session.execute(sql, {"rows": body})).rowcount)


@lru_cache(maxsize=64)
def _recordset_insert(table: Table, names: tuple[str, ...], conflict: tuple[str, ...], dialect: Any
                      ) -> tuple[Any, tuple[tuple[str, Callable[[Any], Any]], ...]]:
    """:func:`insert_rows`' statement on PostgreSQL for rows with these keys, and the bind processors
    of its columns that have one (JSON columns aside), made once per table, keys and dialect: not on
    every report."""
    quote = dialect.identifier_preparer.quote
    columns = [table.c[name] for name in names]
    binds = tuple((c.name, b) for c in columns if not isinstance(c.type, JSON)
                  and (b := c.type.dialect_impl(dialect).bind_processor(dialect)) is not None)
    record = ", ".join(f"{quote(c.name)} {c.type.compile(dialect=dialect)}" for c in columns)
    values = ", ".join(f"COALESCE(r.{quote(c.name)}, 'null'::json)" if isinstance(c.type, JSON)
                       else f"r.{quote(c.name)}" for c in columns)
    sql = (f"INSERT INTO {dialect.identifier_preparer.format_table(table)} "
           f"({', '.join(quote(c.name) for c in columns)}) "
           f"SELECT {values} FROM json_to_recordset(CAST(:rows AS json)) AS r({record})")
    if conflict:
        sql += f" ON CONFLICT ({', '.join(map(quote, conflict))}) DO NOTHING"
    return text(sql), binds


def _iso(value: Any) -> str:
    """json.dumps' ``default`` for :func:`insert_rows`: a time as orjson writes it (ISO 8601)."""
    if isinstance(value, datetime):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def stored_utc(value: datetime) -> datetime:
    """A time read back from the database as an aware UTC datetime: SQLite returns naive ones, and
    every stored time is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(engine, expire_on_commit=False)


def keep_newest(session: Session, table: Any, n: int, *where: ColumnElement[bool]) -> None:
    """Delete the rows of ``table`` matching ``where`` except the ``n`` newest (highest ``id``):
    bounded history for logs and versions. Runs in the caller's transaction."""
    from sqlalchemy import delete, select

    cutoff = session.scalar(select(table.id).where(*where).order_by(table.id.desc()).offset(n).limit(1))
    if cutoff is not None:
        session.execute(delete(table).where(*where, table.id <= cutoff))


@contextmanager
def immediate(session: Session) -> Iterator[Session]:
    """A write transaction that takes SQLite's write lock up front (``BEGIN IMMEDIATE``).

    On PostgreSQL it is a plain transaction. Commits on success, rolls back on error.
    The session must not already be in a transaction.
    """
    with session.begin():
        session.connection(execution_options={"sqlite_immediate": True})
        yield session


class db_now(FunctionElement[datetime]):  # noqa: N801 - reads like the SQL function it renders
    """The database clock, optionally shifted: ``db_now()``, ``db_now(30.0)``, ``db_now(col)``.

    Rendered as ``now() + make_interval(secs => x)`` on PostgreSQL and as
    ``strftime('%Y-%m-%d %H:%M:%f', 'now', x || ' seconds')`` on SQLite (UTC, millisecond precision).
    All lease, heartbeat and result times come from this, never from the coordinator's clock.
    """

    type = DateTime(timezone=True)
    inherit_cache = True
    name = "db_now"

    def __init__(self, seconds: float | ColumnElement[Any] | None = None) -> None:
        if seconds is None:
            super().__init__()
        else:
            super().__init__(seconds if isinstance(seconds, ColumnElement) else literal(float(seconds)))


@compiles(db_now, "postgresql")
def _db_now_pg(element: db_now, compiler: Any, **kw: Any) -> str:
    args = list(element.clauses)
    if not args:
        return "now()"
    return f"(now() + make_interval(secs => CAST({compiler.process(args[0], **kw)} AS double precision)))"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element: db_now, compiler: Any, **kw: Any) -> str:
    args = list(element.clauses)
    if not args:
        return "strftime('%Y-%m-%d %H:%M:%f', 'now')"
    shift = compiler.process(args[0], **kw)
    return f"strftime('%Y-%m-%d %H:%M:%f', 'now', printf('%+.3f seconds', {shift}))"
