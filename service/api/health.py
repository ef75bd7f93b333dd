"""``GET /healthz``: the process is up and the database answers."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from sqlalchemy import text
from sqlalchemy.exc import SQLAlchemyError

from kernelfleet.service.deps import DbDep
from kernelfleet.service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(db: DbDep) -> Health | JSONResponse:
    try:
        with db() as session:
            session.execute(text("SELECT 1"))
    except SQLAlchemyError:
        return JSONResponse(status_code=503, content={"status": "degraded", "database": "unreachable"})
    return Health(status="ok", database="ok")
