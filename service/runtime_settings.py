"""Storing a chip's runtime settings (``POST /runtime-settings``, and a runtime_settings job's result)
and their regressions across MLX versions.

One row per (chip, MLX version, model shape, dtype, workload): a later entry of the same key replaces
it, and each MLX version keeps its own. Each entry carries its gain over MLX's defaults in every
confirmation round (``round_gains``; the control's, stock against stock, where the defaults stay).

A regression: when an entry is stored, the same (chip, model, dtype, workload) at the MLX version
measured just before it is looked up, and the rounds of both are one series (each round a run whose
"time" is 1 / its gain: the step's time relative to MLX's defaults). The online detector's two-level
test (:meth:`.regressions.base.OnlineDetector.shift_at`), with the change at the upgrade, decides
whether the gain was lost beyond the noise (and by ``regression_min_effect``); the cause is what
changed between the two (:func:`.regressions.attribution.attribute`: the MLX version, the chosen
settings, the worker), grouped like a kernel series' (one alert per MLX upgrade across chips). It
is stored ``open`` at once: both sides are already paired, controlled measurements of several rounds,
and no worker can re-run the old MLX version to confirm it. Entries of fewer than
:data:`MIN_ROUNDS` rounds on either side (a budget spent early), or without ``round_gains`` (files
from before them), are not compared.

A gain lost can also mean MLX's own defaults caught up (an MLX release that adopts the tuned value):
the regression says the settings no longer gain, not that the model got slower.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from kernelfleet.runtime_settings_file import JOB_KERNEL
from kernelfleet.service.completion import check_origin
from kernelfleet.service.db import db_now, upsert_insert
from kernelfleet.service.errors import Invalid
from kernelfleet.service.models import Regression, RegressionStatus, RuntimeSetting, Worker
from kernelfleet.service.regressions import base
from kernelfleet.service.regressions.attribution import attribute, group_key
from kernelfleet.service.schemas import RuntimeEntry, RuntimeSettingsFile

logger = logging.getLogger(__name__)

KEY = ("chip", "mlx_version", "model", "dtype", "workload")
MIN_ROUNDS = 3  # rounds a side needs to be compared (as the search's verdicts: worker/runtime_settings)
CONFIRMATION = "paired rounds against MLX's defaults, both MLX versions"


def store_settings(session: Session, worker: Worker, body: RuntimeSettingsFile, min_effect: float) -> int:
    """Inside a transaction: ``body``'s entries for the worker's own chip (newest per key wins), and a
    regression for each whose gain an MLX upgrade lost; the number of entries stored."""
    check_origin(worker, body.chip, body.backend, what="these settings are for chip", acts="pushes settings")
    keys = [(e.model, e.dtype, e.workload) for e in body.entries]
    if len(set(keys)) != len(keys):
        raise Invalid("the file has two entries for one (model, dtype, workload)")
    insert = upsert_insert(session)
    for e in body.entries:
        row = {"chip": body.chip, "backend": body.backend, "arch": body.arch, "mlx_version": body.mlx_version,
               "model": e.model, "dtype": e.dtype, "workload": e.workload, "entry": e.model_dump(mode="json"),
               "worker_id": worker.id}
        stmt = insert(RuntimeSetting.__table__).values(**row)
        session.execute(stmt.on_conflict_do_update(
            index_elements=list(KEY),
            set_={"backend": stmt.excluded.backend, "arch": stmt.excluded.arch, "entry": stmt.excluded.entry,
                  "worker_id": stmt.excluded.worker_id, "measured_at": db_now()}))
        gain_regression(session, body.chip, body.mlx_version, e, worker.id, min_effect)
    return len(body.entries)


def series_shape(model: str, workload: str) -> str:
    """A runtime-settings series' ``shape`` in regressions: the model's shape key and the workload."""
    return f"{model} {workload}"[:128]


def _runs(gains: list[float], attrs: dict[str, str | None]) -> list[base.RunPoint]:
    return [base.RunPoint(median_us=1.0 / g, attrs=attrs) for g in gains]


def _setting(entry: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(entry.get("settings", {}).items())) or "MLX defaults"


def gain_regression(session: Session, chip: str, mlx_version: str, entry: RuntimeEntry, worker_id: int | None,
                    min_effect: float) -> Regression | None:
    """Inside a transaction: an open regression when ``entry`` (just stored for ``mlx_version``) lost
    the gain the same key had at the MLX version measured before it, beyond the noise."""
    before = session.scalars(
        select(RuntimeSetting)
        .where(RuntimeSetting.chip == chip, RuntimeSetting.model == entry.model,
               RuntimeSetting.dtype == entry.dtype, RuntimeSetting.workload == entry.workload,
               RuntimeSetting.mlx_version != mlx_version)
        .order_by(RuntimeSetting.measured_at.desc(), RuntimeSetting.id.desc()).limit(1)
    ).first()
    if before is None:
        return None
    old_gains = [float(g) for g in before.entry.get("round_gains") or []]
    if len(old_gains) < MIN_ROUNDS or len(entry.round_gains) < MIN_ROUNDS:
        return None
    old_attrs = {"mlx_version": before.mlx_version, "config_key": _setting(before.entry),
                 "worker": f"worker {before.worker_id}" if before.worker_id is not None else None}
    new_attrs = {"mlx_version": mlx_version, "config_key": _setting(entry.model_dump()),
                 "worker": f"worker {worker_id}" if worker_id is not None else None}
    runs = _runs(old_gains, old_attrs) + _runs(list(entry.round_gains), new_attrs)
    finding = base.online().shift_at(runs, len(old_gains), min_effect)
    if finding is None:
        return None
    shape = series_shape(entry.model, entry.workload)
    cause = attribute(runs[finding.index - 1], runs[finding.index])
    group = group_key(JOB_KERNEL, (chip, JOB_KERNEL, shape, entry.dtype), cause)
    seen = session.scalar(select(Regression.id).where(
        Regression.chip == chip, Regression.kernel == JOB_KERNEL, Regression.shape == shape,
        Regression.dtype == entry.dtype, Regression.group_key == group,
        Regression.status != RegressionStatus.dismissed).limit(1))
    if seen is not None:
        return None  # this upgrade's loss is already raised (the same version pushed again)
    regression = Regression(
        group_key=group, kernel=JOB_KERNEL, shape=shape, dtype=entry.dtype, chip=chip,
        config_key=old_attrs["config_key"], status=RegressionStatus.open, detector=finding.detector,
        baseline_median_us=finding.baseline_median_us, new_median_us=finding.new_median_us,
        effect=finding.effect, p_value=finding.p_value, cause=cause, confirmation=CONFIRMATION)
    session.add(regression)
    session.flush()
    logger.info("runtime settings of %s on %s lost %+.1f%% of their gain (%s)", shape, chip,
                100 * finding.effect, cause)
    return regression
