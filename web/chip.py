"""Chip page (``/chips/{chip}``): per kernel and shape, the best time per run over time with its
p10–p90 band, points marked by MLX version; the best config per shape and the speedup over the
built-in; MLX's runtime settings its workers chose (``kernelfleet settings push``)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Query, Request
from fastapi.responses import HTMLResponse
from sqlalchemy import select

from kernelfleet.service.deps import DbDep
from kernelfleet.service.models import Result, RuntimeSetting, Worker
from kernelfleet.web.downloads import result_links
from kernelfleet.web.errors import PageNotFound
from kernelfleet.web.figures import series_figure
from kernelfleet.web.render import db_clock, page
from kernelfleet.web.routing import page_router
from kernelfleet.web.series import distinct_values, kernels_on, latest_runs, run_points

router = page_router()

Name = Annotated[str | None, Query(max_length=128)]


@router.get("/chips/{chip:path}", response_class=HTMLResponse)
def chip_page(
    request: Request,
    db: DbDep,
    chip: str,
    kernel: Name = None,
    dtype: Name = None,
    mlx: Name = None,
    runs: Annotated[int, Query(ge=2, le=1000)] = 100,
) -> HTMLResponse:
    with db() as session:
        kernels = kernels_on(session, chip)
        workers = session.execute(
            select(Worker.name, Worker.id, Worker.backend).where(Worker.chip == chip).order_by(Worker.name)
        ).all()
        if not kernels and not workers:
            raise PageNotFound(
                f"no chip called {chip!r}: no worker on it has enrolled and no results came from it",
                hint="See the chips page for the chips KernelFleet knows.",
            )
        names = [k for k, _ in kernels]
        if kernel is not None and kernel not in names:
            raise PageNotFound(
                f"no results for kernel {kernel!r} on {chip}",
                hint=f"Kernels with results on this chip: {', '.join(names) or 'none yet'}.",
            )
        selected = kernel or (names[0] if names else None)
        dtypes = distinct_values(session, Result.dtype, Result.chip == chip)
        versions = distinct_values(session, Result.mlx_version, Result.chip == chip)
        for label, value, known in (("dtype", dtype, dtypes), ("MLX version", mlx, versions)):
            if value and value not in known:
                raise PageNotFound(
                    f"no results on {chip} with {label} {value}",
                    hint=f"{label[0].upper() + label[1:]}s with results on this chip: "
                    f"{', '.join(known) or 'none yet'}.",
                )
        where = [Result.chip == chip]
        if dtype:
            where.append(Result.dtype == dtype)
        if mlx:
            where.append(Result.mlx_version == mlx)
        summary = latest_runs(session, *where, Result.kernel == selected) if selected else []
        charts = []
        if selected is not None:
            extra = [c for c in where[1:]]
            for shape, points in run_points(session, chip, selected, runs, *extra).items():
                charts.append({"shape": shape, "figure": series_figure(points), "runs": len(points)})
        settings = session.execute(
            select(RuntimeSetting.mlx_version, RuntimeSetting.entry, RuntimeSetting.measured_at)
            .where(RuntimeSetting.chip == chip)
            .order_by(RuntimeSetting.mlx_version.desc(), RuntimeSetting.model, RuntimeSetting.dtype,
                      RuntimeSetting.workload)
        ).all()
        return page(
            request,
            "chip.html",
            runtime_settings=settings,
            title=chip,
            chip=chip,
            kernels=kernels,
            selected=selected,
            charts=charts,
            summary=summary,
            dtypes=dtypes,
            versions=versions,
            dtype=dtype,
            mlx=mlx,
            runs=runs,
            workers=workers,
            downloads=result_links(chip=chip, kernel=kernel, dtype=dtype, mlx_version=mlx),
            now=db_clock(session),
            cpu_chip=session.scalar(select(Result.backend).where(Result.chip == chip).limit(1)) == "cpu"
            or any(str(w.backend) == "cpu" for w in workers),
        )
