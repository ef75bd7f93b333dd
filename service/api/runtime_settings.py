"""MLX's runtime settings per chip: ``POST /runtime-settings`` (a worker's token: the entries of a
``kernelfleet settings tune`` file, for the chip the worker enrolled as) and
``GET /runtime-settings/{chip}`` (public-read per settings, like profiles: the chip's newest entries
as a runtime-settings file, which ``kernelfleet pull`` installs beside the profile and
``kernelfleet.apply_settings`` reads).

One row per (chip, MLX version, model shape, dtype, workload): a later push of the same key
replaces it (:mod:`kernelfleet.service.runtime_settings`, which a runtime_settings job's result goes
through too). A GET without ``mlx_version`` answers the MLX version most recently measured."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, status
from sqlalchemy import select

from kernelfleet.service.db import stored_utc
from kernelfleet.service.deps import DashboardDep, DbDep, SettingsDep, WorkerCallDep
from kernelfleet.service.errors import NotFound
from kernelfleet.service.models import RuntimeSetting
from kernelfleet.service.runtime_settings import store_settings
from kernelfleet.service.schemas import RUNTIME_SETTINGS_SCHEMA, RuntimeSettingsFile, RuntimeSettingsPushed

router = APIRouter(tags=["runtime settings"])


@router.post("/runtime-settings", status_code=status.HTTP_201_CREATED)
def push(body: RuntimeSettingsFile, call: WorkerCallDep, settings: SettingsDep) -> RuntimeSettingsPushed:
    """Store a worker's chosen runtime settings for its own chip (newest per key wins); a gain an MLX
    upgrade lost is raised as a regression (service/runtime_settings.py)."""
    with call.transaction() as (session, worker):
        stored = store_settings(session, worker, body, settings.regression_min_effect)
    return RuntimeSettingsPushed(chip=body.chip, mlx_version=body.mlx_version, stored=stored)


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
