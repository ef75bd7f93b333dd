"""MLX's runtime settings per chip: ``POST /runtime-settings`` (a worker's token: the entries of a
``kernelfleet settings tune`` file, for the chip the worker enrolled as) and
``GET /runtime-settings/{chip}`` (public-read per settings, like profiles: the chip's newest entries
as a runtime-settings file, which ``kernelfleet pull`` installs beside the profile and
``kernelfleet.apply_settings`` reads).

One row per (chip, MLX version, model shape, dtype, workload): a later push of the same key
replaces it. A GET without ``mlx_version`` answers the MLX version most recently measured."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status
from sqlalchemy import select

from kernelfleet.service.completion import check_origin
from kernelfleet.service.db import db_now, stored_utc, upsert_insert
from kernelfleet.service.deps import DashboardDep, DbDep, WorkerCallDep
from kernelfleet.service.errors import Invalid, NotFound
from kernelfleet.service.models import RuntimeSetting
from kernelfleet.service.schemas import RUNTIME_SETTINGS_SCHEMA, RuntimeSettingsFile, RuntimeSettingsPushed

router = APIRouter(tags=["runtime settings"])
KEY = ("chip", "mlx_version", "model", "dtype", "workload")


@router.post("/runtime-settings", status_code=status.HTTP_201_CREATED)
def push(body: RuntimeSettingsFile, call: WorkerCallDep) -> RuntimeSettingsPushed:
    """Store a worker's chosen runtime settings for its own chip (newest per key wins)."""
    with call.transaction() as (session, worker):
        check_origin(worker, body.chip, body.backend, what="these settings are for chip",
                     acts="pushes settings")
        keys = [(e.model, e.dtype, e.workload) for e in body.entries]
        if len(set(keys)) != len(keys):
            raise Invalid("the file has two entries for one (model, dtype, workload)")
        insert = upsert_insert(session)
        for e in body.entries:
            row = {"chip": body.chip, "backend": body.backend, "arch": body.arch,
                   "mlx_version": body.mlx_version, "model": e.model, "dtype": e.dtype,
                   "workload": e.workload, "entry": e.model_dump(mode="json"), "worker_id": worker.id}
            stmt = insert(RuntimeSetting.__table__).values(**row)
            session.execute(stmt.on_conflict_do_update(
                index_elements=list(KEY),
                set_={"backend": stmt.excluded.backend, "arch": stmt.excluded.arch,
                      "entry": stmt.excluded.entry, "worker_id": stmt.excluded.worker_id,
                      "measured_at": db_now()}))
    return RuntimeSettingsPushed(chip=body.chip, mlx_version=body.mlx_version, stored=len(body.entries))


@router.get("/runtime-settings/{chip}")
def chip_settings(
    chip: Annotated[str, Path(min_length=1, max_length=128, description="the chip's name")], _: DashboardDep,
    db: DbDep,
    mlx_version: Annotated[str | None, Query(min_length=1, max_length=64)] = None,
) -> dict[str, Any]:
    """The chip's runtime settings as a runtime-settings file (its newest measured MLX version unless
    ``mlx_version``); 404 naming the chips that have some."""
    with db() as session:
        where = [RuntimeSetting.chip == chip]
        if mlx_version is not None:
            where.append(RuntimeSetting.mlx_version == mlx_version)
        rows = session.scalars(select(RuntimeSetting).where(*where)
                               .order_by(RuntimeSetting.measured_at.desc(), RuntimeSetting.id.desc())).all()
        if not rows:
            have = session.scalars(select(RuntimeSetting.chip).distinct().order_by(RuntimeSetting.chip)
                                   .limit(20)).all()
            which = f" for MLX {mlx_version}" if mlx_version else ""
            listed = ", ".join(repr(c) for c in have) or "none yet (`kernelfleet settings push`)"
            raise NotFound(f"no runtime settings for chip {chip!r}{which}; chips with some: {listed}")
        newest = rows[0]
        chosen = [r for r in rows if r.mlx_version == newest.mlx_version]
        chosen.sort(key=lambda r: (r.model, r.dtype, r.workload))
        return {"schema": RUNTIME_SETTINGS_SCHEMA, "chip": chip, "backend": newest.backend,
                "arch": newest.arch, "mlx_version": newest.mlx_version,
                "measured_at": stored_utc(newest.measured_at).isoformat(),
                "entries": [r.entry for r in chosen]}
