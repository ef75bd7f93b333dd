"""Index pages: ``/chips`` (every chip with results or workers) and ``/kernels`` (every kernel)."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Result, Worker
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router

router = page_router()


def cpu_only(session: Session) -> bool:
    """True when results exist and all are from MLX's CPU backend, where every speedup is 1.00x (it
    runs no custom kernel): the pages then point to `make demo` and GPU workers. Two LIMIT 1 reads."""
    if session.scalar(select(Result.id).where(Result.backend != "cpu").limit(1)) is not None:
        return False
    return session.scalar(select(Result.id).limit(1)) is not None


@router.get("/chips", response_class=HTMLResponse)
def chips_index(request: Request, db: DbDep) -> HTMLResponse:
    with db() as session:
        q = (
            select(
                Result.chip,
                func.count().label("runs"),
                func.max(Result.created_at).label("last"),
            )
            .group_by(Result.chip)
            .order_by(Result.chip)
        )  # a covering scan of ix_results_series; the backend (not in the index) is read once per chip
        rows = {
            r.chip: {
                "chip": r.chip,
                "runs": int(r.runs),
                "last": r.last,
                "workers": 0,
                "backend": session.scalar(select(Result.backend).where(Result.chip == r.chip).limit(1)),
            }
            for r in session.execute(q)
        }
        for chip, backend, n in session.execute(
            select(Worker.chip, func.max(Worker.backend), func.count()).group_by(Worker.chip)
        ):
            row = rows.setdefault(
                chip, {"chip": chip, "runs": 0, "last": None, "backend": str(backend), "workers": 0}
            )
            row["workers"] = int(n)
        return page(
            request,
            "chips.html",
            title="Chips",
            rows=sorted(rows.values(), key=lambda r: r["chip"]),
            now=db_clock(session),
            cpu_only=cpu_only(session),
        )


@router.get("/kernels", response_class=HTMLResponse)
def kernels_index(request: Request, db: DbDep) -> HTMLResponse:
    with db() as session:
        q = (
            select(Result.kernel, func.count().label("runs"), func.max(Result.created_at).label("last"))
            .group_by(Result.kernel)
            .order_by(Result.kernel)
        )
        rows = [{"kernel": r.kernel, "runs": int(r.runs), "last": r.last} for r in session.execute(q)]
        return page(request, "kernels.html", title="Kernels", rows=rows, now=db_clock(session))
