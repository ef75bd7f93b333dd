"""Background profile building: coalesced per chip, under a per-chip lock, never in a request.

Storing a result inserts a ``profile_requests`` row for its chip (insert-only: results of one chip
never wait on each other). Every :attr:`Settings.profile_build_interval_seconds` each coordinator
process runs :func:`build_pending`: for each chip with requests it takes the chip's lock, answers
every request up to the newest one it saw with one build (the chip-wide profile and one per MLX
version the chip has results for), deletes those requests and logs the build (``profile_builds``).
Requests that arrive during a build stay queued for the next pass, so a new profile version
appears within seconds of new data and readers always get the last complete version.

Locks: on PostgreSQL ``pg_try_advisory_xact_lock(KEY, hashtext(chip))``, one per chip, so replicas
build different chips at once and never the same chip twice at once; on SQLite an exclusive
``flock`` on a file beside the database (one builder at a time across processes), and the build
reads outside the write lock, so result writes are not held up by it.

Calibration (:mod:`kernelfleet.service.calibration`) is recomputed per backend at most every
:attr:`Settings.calibration_interval_seconds`, when the backend's stats changed, under the same
kind of lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path

from sqlalchemy import Integer, cast, delete, func, select, text
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import aggregates, calibration, profiles
from kernelfleet.service.db import db_now, immediate, is_sqlite
from kernelfleet.service.models import Calibration, ConfigStat, ProfileBuild, ProfileRequest
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

LOCK_CLASS = 0x6B66  # first key of the PostgreSQL advisory locks ("kf")
CALIBRATION_LOCK = "calibration:"
BUILDER = f"{socket.gethostname()}:{os.getpid()}"


def _pg_try_lock(session: Session, name: str) -> bool:
    return bool(session.scalar(text("SELECT pg_try_advisory_xact_lock(:c, hashtext(:n))"),
                               {"c": LOCK_CLASS, "n": name}))


@contextlib.contextmanager
def _sqlite_lock(session: Session) -> Iterator[bool]:
    """An exclusive, non-blocking lock on ``<database>.builder.lock``; yields whether it was taken."""
    database = make_url(str(session.get_bind().engine.url)).database or ""
    if not database or database == ":memory:":
        yield True
        return
    path = Path(database).expanduser().with_name(Path(database).name + ".builder.lock")
    with open(path, "a+") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _clock(session: Session) -> datetime:
    """The database's wall clock now (PostgreSQL's ``now()`` is the transaction's start)."""
    now = func.clock_timestamp() if not is_sqlite(session.get_bind().engine) else db_now()
    value = session.scalar(select(now))
    assert isinstance(value, datetime)
    return value


def pending_chips(factory: sessionmaker[Session]) -> list[str]:
    with factory() as session:
        return list(session.scalars(select(ProfileRequest.chip).distinct().order_by(ProfileRequest.chip)))


def _build(session: Session, chip: str, settings: Settings) -> bool:
    """Inside the chip's lock: answer its queued requests with one build. False when none were left."""
    newest, count, oldest, allow = session.execute(
        select(func.max(ProfileRequest.id), func.count(), func.min(ProfileRequest.created_at),
               func.max(cast(ProfileRequest.allow_predicted, Integer)))
        .where(ProfileRequest.chip == chip)
    ).one()
    if newest is None:
        return False  # another builder answered them
    started = _clock(session)
    if settings.profile_build_delay_seconds > 0:  # a testing knob: a slow build, on purpose
        time.sleep(settings.profile_build_delay_seconds)
    versions = [None, *sorted(set(session.scalars(
        select(ConfigStat.mlx_version).where(ConfigStat.chip == chip).distinct())))]
    bodies = {v: profiles.build_body(session, chip, v, threshold=settings.prediction_min_confidence,
                                     allow_predicted=bool(allow)) for v in versions}
    built: dict[str, int] = {}
    with _write(session):
        for version, body in bodies.items():
            if body is not None:
                built[version or ""] = profiles.store(session, chip, version, body).version
        session.execute(delete(ProfileRequest)
                        .where(ProfileRequest.chip == chip, ProfileRequest.id <= newest))
        session.add(ProfileBuild(chip=chip, builder=BUILDER, started_at=started, finished_at=_clock(session),
                                 requests=int(count), oldest_request_at=oldest, versions=built))
    logger.info("profile of %s built (%s requests): versions %s", chip, count, built)
    return True


@contextlib.contextmanager
def _write(session: Session) -> Iterator[None]:
    """SQLite: end the read transaction and write in a short ``BEGIN IMMEDIATE`` one. PostgreSQL:
    write in the transaction that holds the chip's lock."""
    if is_sqlite(session.get_bind().engine):
        session.rollback()
        with immediate(session):
            yield
    else:
        yield


def build_chip(factory: sessionmaker[Session], chip: str, settings: Settings) -> bool:
    """Build ``chip``'s profiles if its lock is free and requests are queued; True when built."""
    with factory() as session:
        if is_sqlite(session.get_bind().engine):
            with _sqlite_lock(session) as mine:
                return mine and _build(session, chip, settings)
        with session.begin():
            return _pg_try_lock(session, chip) and _build(session, chip, settings)


def calibrate(factory: sessionmaker[Session], backend: str, settings: Settings) -> Calibration | None:
    """Recompute ``backend``'s calibration when its stats changed and the last one is old enough."""
    with factory() as session:
        sqlite = is_sqlite(session.get_bind().engine)
        with (_sqlite_lock(session) if sqlite else contextlib.nullcontext(True)) as mine:
            if not mine:
                return None
            if not sqlite:
                session.begin()
                if not _pg_try_lock(session, CALIBRATION_LOCK + backend):
                    session.rollback()
                    return None
            count = session.scalar(select(func.count()).where(ConfigStat.backend == backend)) or 0
            last = session.scalars(select(Calibration).where(Calibration.backend == backend)
                                   .order_by(Calibration.id.desc()).limit(1)).first()
            due = last is None or (
                last.source_stats != count
                and session.scalar(select(db_now(-settings.calibration_interval_seconds))) > last.created_at)
            if not due or count == 0:
                session.rollback()
                return None
            rows = aggregates.current_rows(session, ConfigStat.backend == backend)
            tables, _ = profiles.observations(rows)
            samples = calibration.held_out(tables, profiles._validator)
            backend_chips = sorted(c for c, b in aggregates.chips_with_data(session).items() if b == backend)
            with _write(session):
                row = Calibration(backend=backend, bins=calibration.bins(samples), samples=len(samples),
                                  source_stats=count)
                session.add(row)
                # confidences may have moved: rebuild the backend's profiles with the new calibration
                session.add_all([ProfileRequest(chip=c) for c in backend_chips])
            if not sqlite:
                session.commit()
            logger.info("calibrated %s predictions on %d held-out samples", backend, len(samples))
            return row


def build_pending(factory: sessionmaker[Session], settings: Settings) -> int:
    """One pass: recalibrate what is due, then build every chip with queued requests. Returns builds."""
    with factory() as session:
        backends = list(session.scalars(select(ConfigStat.backend).distinct()))
    for backend in backends:
        if backend != "cpu":
            calibrate(factory, backend, settings)
    return sum(build_chip(factory, chip, settings) for chip in pending_chips(factory))


async def run_profile_builder(factory: sessionmaker[Session], settings: Settings) -> None:
    """The background loop (one per coordinator process)."""
    while True:
        try:
            await asyncio.to_thread(build_pending, factory, settings)
        except Exception:  # keep building: a failed pass is retried on the next one
            logger.exception("profile build pass failed")
        await asyncio.sleep(settings.profile_build_interval_seconds)
