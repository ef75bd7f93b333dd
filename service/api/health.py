"""``GET /healthz``: the process is up, the database answers, and it accepts writes.

The write probe updates the one row of ``alembic_version`` to itself inside a transaction that is
rolled back (on SQLite under ``BEGIN IMMEDIATE``): it needs no table of its own and leaves nothing
behind, yet fails the way real writes fail on a read-only database (a PostgreSQL standby or
``default_transaction_read_only``, a SQLite file that cannot be written). A disk that fills up is
seen only at commit, which the probe never reaches. 503 when either step fails; the reason is
logged, not shown (the route is public).
"""

from __future__ import annotations

import logging
from typing import Literal

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from kernelfleet.service.db import immediate
from kernelfleet.service.deps import DbDep
from kernelfleet.service.schemas import Health

logger = logging.getLogger(__name__)
router = APIRouter(tags=["health"])

WRITE_PROBE = text("UPDATE alembic_version SET version_num = version_num")


class _Probe(Exception):
    pass


def _reason(exc: SQLAlchemyError) -> str:
    return str(getattr(exc, "orig", None) or exc).strip().splitlines()[0][:200]


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(factory: DbDep) -> Health | JSONResponse:
    with factory() as session:
        try:
            session.execute(text("SELECT 1"))
            session.rollback()
        except SQLAlchemyError as e:
            logger.warning("healthz: database unreachable: %s", _reason(e))
            return _degraded("unreachable", "cannot reach the database")
        try:
            with immediate(session):
                session.execute(WRITE_PROBE)
                raise _Probe  # roll the probe back
        except _Probe:
            pass
        except SQLAlchemyError as e:
            logger.warning("healthz: database refuses writes: %s", _reason(e))
            return _degraded("read-only", "the database refuses writes")
    return Health(status="ok", database="ok")


def _degraded(database: Literal["unreachable", "read-only"], detail: str) -> JSONResponse:
    body = Health(status="degraded", database=database, detail=detail)
    return JSONResponse(status_code=503, content=body.model_dump(), headers={"Retry-After": "5"})
