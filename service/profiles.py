"""Per-chip profiles built from results: for each kernel, shape and dtype the best correct config
(or the built-in where that wins), its expected time and the speedup over the built-in; plus
learned predictions (:mod:`kernelfleet.service.predict`) for what was never tuned on the chip:
the shapes tuned on other chips and the catalog's standard shapes of every kernel with results.

A profile is stored as a versioned row (``profiles``: chip, optional MLX version, version, ETag,
body in the :mod:`kernelfleet.kernels.profile_file` format). It is rebuilt when stale: when the
results it was built from (their count and newest id) changed. A rebuild whose entries are the
same keeps the version and ETag. The result hook rebuilds a chip's profile at most every
:data:`REBUILD_EVERY_SECONDS`; a read rebuilds a stale one on the spot.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from sqlalchemy import func, select, text
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.kernels.profile_file import SCHEMA
from kernelfleet.kernels.spec import parse_config_key
from kernelfleet.service.db import db_now, immediate, is_sqlite
from kernelfleet.service.errors import NotFound
from kernelfleet.service.hooks import on_result_stored
from kernelfleet.service.models import Profile, Result, Trial, TrialStatus
from kernelfleet.service.predict import ChipTable, Observations, predict

logger = logging.getLogger(__name__)

REBUILD_EVERY_SECONDS = 30.0
PROFILE_LOCK = 0x6B66_7066  # PostgreSQL advisory lock id for profile writes ("kfpf")


def fingerprint(session: Session, mlx_version: str | None) -> dict[str, int]:
    """What a profile was built from: the number of results and the newest result id."""
    query = select(func.count(Result.id), func.max(Result.id))
    if mlx_version is not None:
        query = query.where(Result.mlx_version == mlx_version)
    count, newest = session.execute(query).one()
    return {"results": int(count or 0), "max_result_id": int(newest or 0)}


def observations(session: Session, mlx_version: str | None = None) -> tuple[Observations, dict[Any, int]]:
    """Mean time of every correct config per (chip, kernel, shape, dtype), from the results of each
    chip's latest kernel source version; and how many runs each (chip, kernel, shape, dtype) has."""
    newest = select(func.max(Result.id)).group_by(Result.chip, Result.kernel)
    if mlx_version is not None:
        newest = newest.where(Result.mlx_version == mlx_version)
    current = {
        (c, k): h
        for c, k, h in session.execute(
            select(Result.chip, Result.kernel, Result.kernel_hash).where(Result.id.in_(newest))
        ).all()
    }
    query = (
        select(
            Result.chip,
            Result.kernel,
            Result.shape,
            Result.dtype,
            Result.kernel_hash,
            Trial.config_key,
            func.avg(Trial.median_us),
            func.count(func.distinct(Result.id)),
        )
        .join(Trial, Trial.result_id == Result.id)
        .where(Trial.status == TrialStatus.ok, Trial.median_us > 0)
        .group_by(
            Result.chip, Result.kernel, Result.shape, Result.dtype, Result.kernel_hash, Trial.config_key
        )
    )
    if mlx_version is not None:
        query = query.where(Result.mlx_version == mlx_version)
    tables: dict[str, ChipTable] = {}
    runs: dict[Any, int] = {}
    for chip, kernel, shape, dtype, khash, key, mean, n in session.execute(query).all():
        if current.get((chip, kernel)) != khash:
            continue  # configs measured on an older kernel source
        tables.setdefault(chip, {}).setdefault((kernel, shape, dtype), {})[key] = float(mean)
        runs[(chip, kernel, shape, dtype)] = max(runs.get((chip, kernel, shape, dtype), 0), int(n))
    return tables, runs


def _validator(kernel: str, shape: str, dtype: str) -> Any:
    """``valid(config_key)`` from the kernel catalog, or None when the catalog does not know it."""
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import config_key, parse_shape

        spec = get_spec(kernel)
        keys = {config_key(c) for c in spec.space(parse_shape(shape), dtype)} | {"builtin"}
    except Exception:  # unknown kernel or shape: no validity information, every measured config may go
        return None
    return keys.__contains__


def _catalog_shapes(kernel: str) -> list[str]:
    """The catalog's standard shapes of ``kernel`` (decode and large), predicted even when untuned."""
    try:
        from kernelfleet.kernels.catalog import get_spec
        from kernelfleet.kernels.spec import format_shape

        return [format_shape(s) for shapes in get_spec(kernel).shapes.values() for s in shapes]
    except Exception:  # a kernel this coordinator's catalog does not know
        return []


def build_entries(chip: str, tables: Observations, runs: dict[Any, int]) -> list[dict[str, Any]]:
    entries: list[dict[str, Any]] = []
    mine = tables.get(chip, {})
    for (kernel, shape, dtype), times in sorted(mine.items()):
        best = min(times, key=lambda k: (times[k], k))
        builtin = times.get("builtin")
        entries.append(
            {
                "kernel": kernel,
                "shape": shape,
                "dtype": dtype,
                "config": parse_config_key(best),
                "config_key": best,
                "median_us": times[best],
                "speedup": builtin / times[best] if builtin else None,
                "predicted": False,
                "runs": runs.get((chip, kernel, shape, dtype), 0),
            }
        )
    fleet = {key for table in tables.values() for key in table}
    catalog = {(k, shape, d) for k, d in {(k, d) for k, _, d in fleet} for shape in _catalog_shapes(k)}
    wanted = sorted((fleet | catalog) - set(mine))
    for kernel, shape, dtype in wanted:
        guess = predict(chip, kernel, shape, dtype, tables, valid=_validator(kernel, shape, dtype))
        if guess is None:
            continue
        entries.append(
            {
                "kernel": kernel,
                "shape": shape,
                "dtype": dtype,
                "config": parse_config_key(guess.config_key),
                "config_key": guess.config_key,
                "median_us": guess.median_us,
                "speedup": guess.speedup,
                "predicted": True,
                "confidence": round(guess.confidence, 3),
                "basis": guess.basis,
            }
        )
    return entries


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


def current_profile(session: Session, chip: str, mlx_version: str | None = None) -> Profile:
    """The chip's up-to-date profile, rebuilt (and versioned) first when stale. Raises NotFound
    when nothing is known for the chip (no results and nothing to predict from)."""
    with immediate(session):
        if not is_sqlite(session.get_bind().engine):
            session.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": PROFILE_LOCK})
        source = fingerprint(session, mlx_version)
        row = latest(session, chip, mlx_version)
        if row is not None and row.body.get("source") == source:
            return row
        tables, runs = observations(session, mlx_version)
        entries = build_entries(chip, tables, runs)
        if not entries and row is None:
            where = f" with MLX {mlx_version}" if mlx_version else ""
            raise NotFound(
                f"no profile for chip {chip!r}{where}: no results from it or any similar chip yet; "
                f"run a tuning campaign for it (kernelfleet admin campaign create ...)"
            )
        etag = content_etag(chip, mlx_version, entries)
        if row is not None and row.etag == etag:
            row.body = {**row.body, "source": source}
            return row
        version = (row.version + 1) if row is not None else 1
        body = {
            "schema": SCHEMA,
            "chip": chip,
            "mlx_version": mlx_version,
            "version": version,
            "etag": etag,
            "entries": entries,
            "source": source,
        }
        row = Profile(chip=chip, mlx_version=mlx_version, version=version, etag=etag, body=body)
        session.add(row)
        session.flush()
    logger.info("profile for %s (MLX %s) is now version %s", chip, mlx_version or "any", version)
    return row


def is_stale(session: Session, row: Profile) -> bool:
    return bool(row.body.get("source") != fingerprint(session, row.mlx_version))


def rebuild_on_result(factory: sessionmaker[Session], result_id: int) -> None:
    """Result hook: refresh the chip-wide profile of the result's chip, at most every 30 seconds."""
    with factory() as session:
        chip = session.scalar(select(Result.chip).where(Result.id == result_id))
        if chip is None:
            return
        fresh = session.scalar(
            select(func.count(Profile.id)).where(
                Profile.chip == chip,
                Profile.mlx_version.is_(None),
                Profile.created_at > db_now(-REBUILD_EVERY_SECONDS),
            )
        )
        if fresh:
            return
        session.rollback()
        current_profile(session, chip, None)


on_result_stored(rebuild_on_result)
