"""Run page (``/runs/{id}``): one stored result with its environment, golden output and every trial."""

from __future__ import annotations

from fastapi import Request
from fastapi.responses import HTMLResponse
from sqlalchemy import case, select

from kernelfleet.chips import lookup
from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Result, Trial, TrialStatus, Worker
from kernelfleet.service.params import RowId
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.figures import samples_figure
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router
from kernelfleet.web.search_figures import Measured, bandwidth_figure, param_figure, parameters

router = page_router()

BOXES = 8


def _bytes_moved(kernel: str, shape: str, dtype: str) -> int | None:
    """The catalog kernel's minimum bytes read and written for this shape; None for a kernel the
    catalog does not hold (an imported report of another version)."""
    from kernelfleet.kernels.catalog import get_spec
    from kernelfleet.kernels.spec import KernelError, parse_shape

    try:
        return int(get_spec(kernel).bytes_moved(parse_shape(shape), dtype))
    except (KernelError, KeyError, ValueError, IndexError):
        return None


@router.get("/runs/{result_id}", response_class=HTMLResponse)
def run(request: Request, db: DbDep, result_id: RowId) -> HTMLResponse:
    with db() as session:
        r = session.get(Result, result_id)
        if r is None:
            raise PageNotFound(
                f"no run with id {result_id}", hint="Runs are linked from the chip and kernel pages."
            )
        worker = session.scalar(select(Worker.name).where(Worker.id == r.worker_id)) if r.worker_id else None
        ok_first = case((Trial.status == TrialStatus.ok, 0), else_=1)
        trials = session.execute(
            select(
                Trial.id,
                Trial.config_key,
                Trial.is_builtin,
                Trial.status,
                Trial.error,
                Trial.median_us,
                Trial.p10_us,
                Trial.p90_us,
                Trial.n,
                Trial.max_abs_err,
                Trial.max_rel_err,
                Trial.shares_measurement_with,
            )
            .where(Trial.result_id == result_id)
            .order_by(ok_first, Trial.median_us, Trial.config_key)
        ).all()
        fastest = [t.id for t in trials if t.status == TrialStatus.ok][:BOXES]
        builtin = [t.id for t in trials
                   if t.is_builtin and t.status == TrialStatus.ok and t.id not in fastest]
        samples = (
            dict(
                session.execute(select(Trial.id, Trial.samples_us).where(Trial.id.in_(fastest + builtin)))
                .all()
            )
            if fastest
            else {}
        )
        keyed = {t.id: t.config_key for t in trials}
        boxes = [(keyed[i], samples[i]) for i in fastest + builtin if samples.get(i)]
        figure = samples_figure(boxes) if boxes else None
        measured = [Measured(t.config_key, t.median_us) for t in trials
                    if t.status == TrialStatus.ok and t.median_us and t.median_us > 0]
        builtin_us = next((m.median_us for m in measured if m.config_key == "builtin"), None)
        params = [(name, param_figure(measured, name, builtin_us)) for name in parameters(measured)]
        nbytes = _bytes_moved(r.kernel, r.shape, r.dtype)
        chip_row = lookup(r.chip)
        peak = chip_row.bandwidth_gbs if chip_row else None
        bandwidth = bandwidth_figure(measured, nbytes, peak, r.chip) if measured and nbytes else None
        return page(
            request,
            "run.html",
            title=f"Run {r.id}",
            r=r,
            worker=worker,
            trials=trials,
            figure=figure,
            params=params,
            bandwidth=bandwidth,
            nbytes=nbytes,
            peak=peak,
            now=db_clock(session),
        )
