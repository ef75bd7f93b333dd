"""``GET /healthz``: the process is up, the database answers, and it accepts writes.

The write probe updates the one row of ``alembic_version`` to itself inside a transaction that is
rolled back (on SQLite under ``BEGIN IMMEDIATE``): it needs no table of its own and leaves nothing
behind, yet fails the way real writes fail on a read-only database (a PostgreSQL standby or
``default_transaction_read_only``, a SQLite file that cannot be written). A disk that fills up is
seen only at commit, which the probe never reaches. The read step also touches the ``jobs`` table,
which leases, heartbeats and results all need, so a lock held on it shows. 503 when either step
fails, or when the probe has not answered within ``KERNELFLEET_HEALTHZ_TIMEOUT_SECONDS`` (2 s:
"unresponsive"; on PostgreSQL the probe's statements are cancelled at that bound too); one probe
runs at a time per process, and requests meanwhile wait on it. The reason is logged, not shown
(the route is public).

The bound times the database, not the queue in front of it: the probe runs on a thread of its own
(not the threadpool that a crowd of requests may fill) and, on PostgreSQL, on a connection of its
own (not the pool the crowd may hold). Otherwise a busy but healthy coordinator reads as broken, and
a load balancer that believes it takes replicas out just when they are needed (seen in CI: 200
readers beside 30 workers on 2 cores made the probe wait 2 s for a thread). On SQLite the probe
shares the server's engine: its write probe must queue on the process's write lock as writes do.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import Literal

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service.db import immediate, is_sqlite, make_engine, make_sessionmaker
from kernelfleet.service.deps import DbDep, SettingsDep
from kernelfleet.service.schemas import Health

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])

WRITE_PROBE = text("UPDATE alembic_version SET version_num = version_num")
READ_PROBE = text("SELECT 1 FROM jobs WHERE 1 = 0")  # takes the lock every job query takes


class _Probe(Exception):
    pass


def _reason(exc: SQLAlchemyError) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200]


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(request: Request, factory: DbDep, settings: SettingsDep) -> Health | JSONResponse:
    bound = settings.healthz_timeout_seconds
    state = request.app.state
    probe: asyncio.Task[Health | JSONResponse] | None = getattr(state, "health_probe", None)
    if probe is None or probe.done():  # one probe at a time: a stuck database does not pile them up
        thread, own = _probe_means(state, factory)
        probe = asyncio.ensure_future(asyncio.get_running_loop().run_in_executor(thread, _probe, own, bound))
        state.health_probe = probe
    try:
        return await asyncio.wait_for(asyncio.shield(probe), bound)
    except TimeoutError:
        logger.warning("healthz: the database did not answer within %s s", bound)
        return _degraded("unresponsive", f"the database did not answer within {bound:g} s")


def _probe_means(state: object, factory: sessionmaker[Session]
                 ) -> tuple[ThreadPoolExecutor, sessionmaker[Session]]:
    """The probe's own thread and, on PostgreSQL, its own one-connection engine (made at first use)."""
    means: tuple[ThreadPoolExecutor, sessionmaker[Session]] | None = getattr(state, "health_means", None)
    if means is None:
        engine = factory.kw["bind"]
        own = factory if is_sqlite(engine) else make_sessionmaker(
            make_engine(engine.url.render_as_string(hide_password=False), pool_size=1, max_overflow=0,
                        pool_pre_ping=True))
        means = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="healthz"), own)
        setattr(state, "health_means", means)  # noqa: B010 - Starlette's State takes any attribute
    return means


def close_probe(state: object) -> None:
    """At shutdown: the probe's thread, and its engine where it has one of its own."""
    means: tuple[ThreadPoolExecutor, sessionmaker[Session]] | None = getattr(state, "health_means", None)
    if means is None:
        return
    thread, own = means
    thread.shutdown(wait=False, cancel_futures=True)
    engine = own.kw["bind"]
    if not is_sqlite(engine):
        engine.dispose()


def _bounded(session: Session, seconds: float) -> None:
    """PostgreSQL: cancel this transaction's statements, and its waits for locks, after ``seconds``."""
    if not is_sqlite(session.get_bind().engine):
        ms = max(1, int(seconds * 1000))
        session.execute(text(f"SET LOCAL statement_timeout = {ms}"))
        session.execute(text(f"SET LOCAL lock_timeout = {ms}"))


def _probe(factory: sessionmaker[Session], seconds: float) -> Health | JSONResponse:
    with factory() as session:
        try:
            _bounded(session, seconds)
            session.execute(text("SELECT 1"))
            session.execute(READ_PROBE)
            session.rollback()
        except SQLAlchemyError as e:
            session.rollback()
            logger.warning("healthz: database unreachable: %s", _reason(e))
            return _degraded("unreachable", "cannot reach the database")
        try:
            with immediate(session):
                _bounded(session, seconds)
                session.execute(WRITE_PROBE)
                raise _Probe  # roll the probe back
        except _Probe:
            pass
        except SQLAlchemyError as e:
            logger.warning("healthz: database refuses writes: %s", _reason(e))
            return _degraded("read-only", "the database refuses writes")
    return Health(status="ok", database="ok")


def _degraded(database: Literal["unreachable", "read-only", "unresponsive"], detail: str) -> JSONResponse:
    body = Health(status="degraded", database=database, detail=detail)
    return JSONResponse(status_code=503, content=body.model_dump(), headers={"Retry-After": "5"})
