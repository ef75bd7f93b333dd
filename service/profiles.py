"""Per-chip profiles, built from the incremental ``config_stats`` (never from raw trials).

A profile holds, per kernel, shape and dtype:

- **measured** entries, for what the chip itself ran: the config with the best speedup over the
  built-in measured in the same runs, or the built-in where no config beat it (the evidence never
  picks a config it says is slower). Each carries its evidence: runs, workers, imported runs,
  first and last measurement, the spread of its run medians and a ~95 % speedup interval;
- **predicted** entries (:mod:`kernelfleet.service.predict`), for shapes the chip never ran: from
  results of the same backend only, other chips weighted by similarity; all targets of a kernel in
  one batch (:func:`kernelfleet.service.predict.predict_many`). Each carries a confidence
  calibrated on held-out data (:mod:`kernelfleet.service.calibration`); below the threshold, or
  where the predicted speedup is not above 1, the entry is the built-in (``fallback`` says why).

CPU profiles hold only built-ins: MLX's CPU backend runs no custom kernels. A profile is stored as
a versioned row (``profiles``: chip, optional MLX version, version, ETag, body in the
:mod:`kernelfleet.kernels.patch.profile_file` format). A build whose entries are unchanged keeps the
version and ETag. Building is background work (:mod:`kernelfleet.service.profile_builder`) from
per-series summaries (:mod:`kernelfleet.service.series_summaries`, refreshed by the series that
changed): it reads O(the changed series' rows) and assembles the body from the backend's current
series, independent of how many results and old stats rows are stored.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session, load_only

from kernelfleet.chips import backend_of
from kernelfleet.kernels.patch.profile_file import SCHEMA
from kernelfleet.kernels.spec import parse_config_key
from kernelfleet.service import aggregates, calibration, series_summaries
from kernelfleet.service.aggregates import StatRow
from kernelfleet.service.db import keep_newest, stored_utc
from kernelfleet.service.models import Backend, Calibration, ConfigStat, Profile
from kernelfleet.service.predict import (
    ChipTable,
    Observations,
    Picks,
    Prediction,
    SourcePick,
    chip_similarity,
    predict_many,
)
from kernelfleet.service.series_summaries import SeriesKey

BUILTIN = "builtin"
# (chip, kernel, shape, dtype) -> {config_key: its stats row}
Evidence = dict[tuple[str, str, str, str], dict[str, StatRow]]


@lru_cache(maxsize=4096)  # a kernel's config space at a shape: built once per process, not per build
def _validator(kernel: str, shape: str, dtype: str) -> Callable[[str], bool] | None:
    """``valid(config_key)`` from the kernel catalog, or None when the catalog does not know it."""
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import config_key, parse_shape

        spec = get_spec(kernel)
        keys = {config_key(c) for c in spec.space(parse_shape(shape), dtype)} | {BUILTIN}
    except Exception:  # unknown kernel or shape: no validity information, every measured config may go
        return None
    return keys.__contains__


@lru_cache(maxsize=256)
def _catalog_shapes(kernel: str) -> tuple[str, ...]:
    """The catalog's standard shapes of ``kernel`` (decode and large), predicted even when untuned."""
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import format_shape

        return tuple(format_shape(s) for shapes in get_spec(kernel).shapes.values() for s in shapes)
    except Exception:  # a kernel this coordinator's catalog does not know
        return ()


def observations(rows: Sequence[StatRow]) -> tuple[Observations, Evidence]:
    """Per chip, the robust center time of every config per (kernel, shape, dtype), and the rows."""
    tables: dict[str, ChipTable] = {}
    evidence: Evidence = {}
    for r in rows:
        tables.setdefault(r.chip, {}).setdefault((r.kernel, r.shape, r.dtype), {})[r.config_key] = r.center_us
        evidence.setdefault((r.chip, r.kernel, r.shape, r.dtype), {})[r.config_key] = r
    return tables, evidence


def _iso(value: datetime | None) -> str | None:
    if value is None:
        return None
    return stored_utc(value).isoformat()


def choose(stats: dict[str, StatRow], backend: str) -> StatRow | None:
    """The measured pick: the best same-run speedup above 1, else the built-in (never a config the
    evidence says is slower). Without a built-in measurement: the fastest center. CPU: the built-in."""
    builtin = stats.get(BUILTIN)
    if backend == "cpu":
        return builtin
    best = best_custom(stats)
    if best is not None and (best.speedup or 0.0) > 1.0:
        return best
    if builtin is not None:
        return builtin
    return min(stats.values(), key=lambda r: (r.center_us, r.config_key)) if stats else None


def best_custom(stats: dict[str, StatRow]) -> StatRow | None:
    """The custom config with the best same-run speedup over the built-in (None without one): the pick
    where it is above 1, else the entry's ``custom``, which a fused launch may run
    (:meth:`kernelfleet.kernels.patch.profile_view.ProfileView.fused_choice`)."""
    custom = [r for k, r in stats.items() if k != BUILTIN and r.speedup is not None]
    return max(custom, key=lambda r: (r.speedup or 0.0, -r.center_us, r.config_key)) if custom else None


def source_pick(stats: dict[str, StatRow], backend: str) -> SourcePick | None:
    """One series' measured pick (:func:`choose`) with its margin, for transfers: for a config, the
    low end of its same-run speedup interval over the built-in; for the built-in, the inverse of the
    best config's high end. None without a same-run comparison with the built-in."""
    pick = choose(stats, backend)
    if pick is None:
        return None
    if pick.config_key != BUILTIN:
        return SourcePick(pick.config_key, pick.speedup_lo) if pick.speedup_lo is not None else None
    others = [r.speedup_hi for k, r in stats.items() if k != BUILTIN and r.speedup_hi]
    return SourcePick(BUILTIN, 1.0 / max(others) if others else math.inf)


def measured_picks(evidence: Evidence, backend: str) -> dict[tuple[str, str, str, str], SourcePick]:
    """Every chip's :func:`source_pick` per (chip, kernel, shape, dtype) that has one."""
    picks = {key: source_pick(stats, backend) for key, stats in evidence.items()}
    return {key: pick for key, pick in picks.items() if pick is not None}


def _interval(row: StatRow) -> list[float] | None:
    if row.speedup_lo is None or row.speedup_hi is None:
        return None
    return [round(row.speedup_lo, 4), round(row.speedup_hi, 4)]


def measured_entry(kernel: str, shape: str, dtype: str, pick: StatRow, runner_up: StatRow | None = None
                   ) -> dict[str, Any]:
    """One measured profile entry; where ``pick`` is the built-in, ``runner_up`` (:func:`best_custom`)
    is its ``custom``."""
    is_builtin = pick.config_key == BUILTIN
    interval = [1.0, 1.0] if is_builtin else _interval(pick)
    custom = {} if not is_builtin or runner_up is None or runner_up.speedup is None else {"custom": {
        "config": parse_config_key(runner_up.config_key), "config_key": runner_up.config_key,
        "median_us": round(runner_up.center_us, 4), "speedup": round(runner_up.speedup, 4),
        "speedup_interval": _interval(runner_up)}}
    return {
        "kernel": kernel, "shape": shape, "dtype": dtype,
        "config": parse_config_key(pick.config_key), "config_key": pick.config_key,
        "median_us": round(pick.center_us, 4),
        "speedup": 1.0 if is_builtin else (round(pick.speedup, 4) if pick.speedup is not None else None),
        "speedup_interval": interval,
        "predicted": False,
        "runs": pick.runs, "workers": len(pick.worker_ids), "imported_runs": pick.imported_runs,
        "first_seen": _iso(pick.first_seen_at), "last_seen": _iso(pick.last_seen_at),
        "spread": round(pick.spread, 4), "mlx_version": pick.mlx_version, "kernel_hash": pick.kernel_hash,
        **custom,
    }


def predicted_entries(chip: str, tables: Observations, skip: set[tuple[str, str, str]],
                      table: Sequence[dict[str, Any]] | None, threshold: float,
                      picks: Picks | None = None) -> list[dict[str, Any]]:
    """Predictions for the backend's fleet shapes and the catalog shapes of its kernels that ``chip``
    did not measure; below ``threshold`` confidence or without a speedup above 1: the built-in.
    ``picks``: the chips' measured picks (:func:`measured_picks`), for transfers."""
    fleet = {key for t in tables.values() for key in t}
    catalog = {(k, shape, d) for k, d in {(k, d) for k, _, d in fleet} for shape in _catalog_shapes(k)}
    # once per build, not per prediction: each chip's similarity to this one (over every kernel) and
    # each kernel's tables (a prediction reads only its kernel's sources)
    similarity = {other: chip_similarity(chip, other, tables) for other in tables}
    by_kernel: dict[str, dict[str, ChipTable]] = {}
    for other, chip_table in tables.items():
        for key, times in chip_table.items():
            by_kernel.setdefault(key[0], {}).setdefault(other, {})[key] = times
    wanted: dict[str, list[tuple[str, str]]] = {}  # kernel -> its (shape, dtype) targets, in order
    for kernel, shape, dtype in sorted((fleet | catalog) - skip):
        wanted.setdefault(kernel, []).append((shape, dtype))
    out: list[dict[str, Any]] = []
    for kernel, targets in wanted.items():
        # every target of the kernel at once: O(targets x sources) in numpy matrix products
        found = predict_many(chip, kernel, targets, by_kernel.get(kernel, {}), picks=picks,
                             similarity=similarity,
                             valid=lambda shape, dtype, kernel=kernel: _validator(kernel, shape, dtype))
        out += [_predicted_entry(kernel, shape, dtype, pick, table, threshold)
                for (shape, dtype), pick in zip(targets, found, strict=True) if pick is not None]
    return out


def _predicted_entry(kernel: str, shape: str, dtype: str, pick: Prediction,
                     table: Sequence[dict[str, Any]] | None, threshold: float) -> dict[str, Any]:
    conf = calibration.confidence(table, pick)
    fallback = None
    if pick.config_key == BUILTIN:
        fallback = "the built-in is predicted fastest"
    elif conf < threshold:
        fallback = f"confidence {conf:.2f} is below {threshold:.2f}"
    elif pick.speedup is None or pick.speedup <= 1.0:
        fallback = "not predicted faster than the built-in"
    entry: dict[str, Any] = {
        "kernel": kernel, "shape": shape, "dtype": dtype, "predicted": True,
        "confidence": round(conf, 3), "score": round(pick.score, 3), "cross_chip": pick.cross_chip,
        "mode": pick.mode,
        "basis": pick.basis,
    }
    if fallback is None:
        entry.update(config=parse_config_key(pick.config_key), config_key=pick.config_key,
                     median_us=round(pick.median_us, 4), speedup=round(pick.speedup or 0.0, 4))
    else:
        entry.update(config=parse_config_key(BUILTIN), config_key=BUILTIN, median_us=None, speedup=1.0,
                     fallback=fallback, predicted_config_key=pick.config_key)
    return entry


def calibration_table(session: Session, backend: str) -> list[dict[str, Any]] | None:
    row = session.scalars(
        select(Calibration).where(Calibration.backend == backend).order_by(Calibration.id.desc()).limit(1)
    ).first()
    return list(row.bins) if row is not None else None


def _has(session: Session, *where: Any) -> bool:
    return session.scalar(select(ConfigStat.id).where(*where).limit(1)) is not None


def chip_backend(session: Session, chip: str) -> str | None:
    """The backend of ``chip``'s results (the GPU one when several), else guessed from its name.
    Index probes (chip, backend), not a scan of the chip's rows."""
    for backend in ("metal", "cuda"):
        if _has(session, ConfigStat.chip == chip, ConfigStat.backend == backend):
            return backend
    backends = sorted(session.scalars(select(ConfigStat.backend).where(ConfigStat.chip == chip).distinct()))
    return backends[0] if backends else backend_of(chip)


def backends_with_data(session: Session) -> list[str]:
    """The backends with stats rows: one index probe each, not a scan of every row."""
    return [b.value for b in Backend if _has(session, ConfigStat.backend == b.value)]


@dataclass(frozen=True)
class SeriesSummary:
    """What a profile needs of one series' stats rows (:mod:`kernelfleet.service.series_summaries`)."""

    chip: str
    mlx_version: str
    kernel_hash: str
    kernel: str
    shape: str
    dtype: str
    newest: int  # the newest result folded into any of its rows
    times: dict[str, float]  # config_key -> robust center time, in config_key order
    entry: dict[str, Any] | None  # its measured profile entry (:func:`choose`)
    pick: SourcePick | None  # its pick for transfers (:func:`source_pick`)


def summarize(rows: Sequence[StatRow], backend: str) -> SeriesSummary:
    """The summary of one series from all its stats rows (non-empty)."""
    first = rows[0]
    stats = {r.config_key: r for r in sorted(rows, key=lambda r: r.config_key)}
    chosen = choose(stats, backend)
    return SeriesSummary(
        chip=first.chip, mlx_version=first.mlx_version, kernel_hash=first.kernel_hash, kernel=first.kernel,
        shape=first.shape, dtype=first.dtype, newest=max(r.last_result_id for r in rows),
        times={k: r.center_us for k, r in stats.items()},
        entry=None if chosen is None else measured_entry(first.kernel, first.shape, first.dtype, chosen,
                                                         best_custom(stats)),
        pick=source_pick(stats, backend))


def build_body(session: Session, chip: str, mlx_version: str | None, *, threshold: float,
               allow_predicted: bool = False, summaries: dict[SeriesKey, SeriesSummary] | None = None
               ) -> dict[str, Any] | None:
    """The profile body for ``chip`` (all MLX versions, or one), or None when there is nothing to
    put in it (no measured entry, unless ``allow_predicted``). ``summaries``: the series of the
    chip's backend, when the caller holds them (:mod:`kernelfleet.service.series_summaries`); else
    they are made from every stats row of the backend."""
    backend = chip_backend(session, chip)
    if backend is None:
        return None
    if summaries is None:
        rows = aggregates.load_rows(session, ConfigStat.backend == backend)
        summaries = {key: summarize(series, backend) for key, series in series_summaries.group(rows).items()}
    return body_from(chip, mlx_version, backend, series_summaries.current(summaries, mlx_version),
                     calibration_table(session, backend) if backend != "cpu" else None,
                     threshold=threshold, allow_predicted=allow_predicted)


def tables_and_picks(current: Sequence[SeriesSummary]) -> tuple[dict[str, ChipTable], Picks]:
    """The predictor's inputs from the current series: each chip's times per (kernel, shape, dtype),
    and each series' measured pick (:func:`source_pick`) where it has one."""
    tables: dict[str, ChipTable] = {}
    for s in current:
        tables.setdefault(s.chip, {})[(s.kernel, s.shape, s.dtype)] = s.times
    picks = {(s.chip, s.kernel, s.shape, s.dtype): s.pick for s in current if s.pick is not None}
    return tables, picks


def body_from(chip: str, mlx_version: str | None, backend: str, current: Sequence[SeriesSummary],
              calibration_bins: Sequence[dict[str, Any]] | None, *, threshold: float,
              allow_predicted: bool) -> dict[str, Any] | None:
    """The profile body from the backend's current series (in (chip, kernel, shape, dtype) order)."""
    entries = [s.entry for s in current if s.chip == chip and s.entry is not None]
    if not entries and not allow_predicted:
        return None
    if backend != "cpu":
        tables, picks = tables_and_picks(current)
        mine = {(s.kernel, s.shape, s.dtype) for s in current if s.chip == chip and s.entry is not None}
        entries = [*entries, *predicted_entries(chip, tables, mine, calibration_bins, threshold, picks)]
    if not entries:
        return None
    body = {"schema": SCHEMA, "chip": chip, "backend": backend, "mlx_version": mlx_version,
            "entries": entries, "confidence_threshold": threshold}
    return {**body, "counts": counts(body)}


def counts(body: dict[str, Any]) -> dict[str, int]:
    """A profile body's measured entries, predicted ones with a predicted config, and predicted ones
    that fell back to the built-in."""
    entries = body.get("entries", [])
    predicted = [e for e in entries if e.get("predicted")]
    return {"measured": len(entries) - len(predicted),
            "predicted": sum(1 for e in predicted if "fallback" not in e),
            "fallback": sum(1 for e in predicted if "fallback" in e)}


def content_etag(chip: str, mlx_version: str | None, entries: list[dict[str, Any]]) -> str:
    canonical = json.dumps(
        {"chip": chip, "mlx_version": mlx_version, "entries": entries}, sort_keys=True, separators=(",", ":")
    )
    return hashlib.sha256(canonical.encode()).hexdigest()[:32]


def latest(session: Session, chip: str, mlx_version: str | None) -> Profile | None:
    version_match = (
        Profile.mlx_version.is_(None) if mlx_version is None else Profile.mlx_version == mlx_version
    )
    return session.scalars(
        select(Profile).where(Profile.chip == chip, version_match).order_by(Profile.version.desc()).limit(1)
    ).first()


KEEP_VERSIONS = 20  # stored versions per (chip, MLX version); older ones are deleted


def store(session: Session, chip: str, mlx_version: str | None, body: dict[str, Any]) -> Profile:
    """Store ``body`` as the chip's next version, unless its entries equal the latest version's.
    Keeps the newest :data:`KEEP_VERSIONS` versions."""
    same = Profile.mlx_version.is_(None) if mlx_version is None else Profile.mlx_version == mlx_version
    row = session.scalars(  # not the latest body (it can be megabytes): its version and ETag decide
        select(Profile).options(load_only(Profile.id, Profile.version, Profile.etag))
        .where(Profile.chip == chip, same).order_by(Profile.version.desc()).limit(1)).first()
    etag = content_etag(chip, mlx_version, body["entries"])
    if row is not None and row.etag == etag:
        return row
    version = (row.version + 1) if row is not None else 1
    row = Profile(chip=chip, mlx_version=mlx_version, version=version, etag=etag,
                  body={**body, "version": version, "etag": etag})
    session.add(row)
    session.flush()
    keep_newest(session, Profile, KEEP_VERSIONS, Profile.chip == chip, same)
    return row
