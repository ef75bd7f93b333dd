"""Background profile building: coalesced per chip, under a per-chip lock, never in a request.

Storing a result inserts a ``profile_requests`` row for its chip (insert-only: results of one chip
never wait on each other). Every :attr:`Settings.background_interval_seconds` each coordinator
process runs :func:`build_pending` (from :mod:`kernelfleet.service.background`): for each chip with
requests it takes the chip's lock, answers every request it saw with one build
(the chip-wide profile and one per MLX version the chip has results for), deletes those requests and
logs the build (``profile_builds``). A build rereads only the stats rows of the series that changed
since the process's last build (:mod:`kernelfleet.service.series_summaries`). Requests that arrive
during a build stay queued for the next pass, so a new profile version appears within seconds of
new data and readers always get the last complete version.

Locks (:mod:`kernelfleet.service.locks`): on PostgreSQL one advisory lock per chip, so replicas
build different chips at once and never the same chip twice at once; on SQLite an exclusive
``flock`` beside the database (one builder at a time across processes), and the build reads
outside the write lock, so result writes are not held up by it.

Calibration (:mod:`kernelfleet.service.calibration`) is recomputed per backend at most every
:attr:`Settings.calibration_interval_seconds`, when the backend's stats changed, under the same
kind of lock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session, sessionmaker

from kernelfleet.service import calibration, profiles, series_summaries
from kernelfleet.service.db import db_now, immediate, is_sqlite, keep_newest, stored_utc
from kernelfleet.service.locks import file_lock, pg_try_lock
from kernelfleet.service.models import Calibration, ProfileBuild, ProfileRequest
from kernelfleet.service.settings import Settings

logger = logging.getLogger(__name__)

CALIBRATION_LOCK = "calibration:"
KEEP_BUILDS = 200  # build log rows kept per chip
KEEP_CALIBRATIONS = 10  # calibrations kept per backend
ANSWER_BATCH = 10_000  # answered requests deleted per statement
BUILDER = f"{socket.gethostname()}:{os.getpid()}"


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
    # the requests this build answers, read before the data: each one's result committed with it, so
    # the build sees that result. Only these are deleted after, by id: on PostgreSQL an id is handed
    # out at insert, not at commit, so a request below the newest id seen here may commit later, and
    # deleting every id up to the newest dropped it unseen (its result stayed out of the profile
    # until the chip's next result)
    seen = session.execute(
        select(ProfileRequest.id, ProfileRequest.created_at, ProfileRequest.allow_predicted)
        .where(ProfileRequest.chip == chip)
    ).all()
    if not seen:
        return False  # another builder answered them
    count, oldest, allow = len(seen), min(r.created_at for r in seen), any(r.allow_predicted for r in seen)
    started = _clock(session)
    last = session.scalar(select(func.max(ProfileBuild.finished_at)).where(ProfileBuild.chip == chip))
    since = (stored_utc(started) - stored_utc(last)).total_seconds() if last is not None else None
    if since is not None and since < settings.profile_min_interval_seconds:
        return False  # built moments ago: its requests wait for the next pass after the interval
    if settings.profile_build_delay_seconds > 0:  # a testing knob: a slow build, on purpose
        time.sleep(settings.profile_build_delay_seconds)
    backend = profiles.chip_backend(session, chip)
    bodies: dict[str | None, dict[str, Any] | None] = {}
    if backend is not None:
        cache = series_summaries.cache_for(session, backend)
        with cache.lock:  # the series changed since the last build are reloaded; the rest is reused
            cache.refresh(session, lambda rows: profiles.summarize(rows, backend))
            bins = profiles.calibration_table(session, backend) if backend != "cpu" else None
            every = series_summaries.current(cache.summaries, None)
            for version in [None, *series_summaries.versions_of(list(cache.summaries.values()), chip)]:
                current = every if version is None else series_summaries.current(cache.summaries, version)
                whole = bodies.get(None)
                if version is not None and len(current) == len(every) and all(
                        a is b for a, b in zip(current, every, strict=True)):
                    # the fleet ran this MLX version only: the chip-wide body's entries, not built twice
                    bodies[version] = None if whole is None else {**whole, "mlx_version": version}
                    continue
                bodies[version] = profiles.body_from(
                    chip, version, backend, current, bins,
                    threshold=settings.prediction_min_confidence, allow_predicted=bool(allow))
    built: dict[str, int] = {}
    with _write(session):
        for version, body in bodies.items():
            if body is not None:
                built[version or ""] = profiles.store(session, chip, version, body).version
        ids = [r.id for r in seen]
        for start in range(0, len(ids), ANSWER_BATCH):  # within every backend's bound-parameter limit
            batch = ids[start:start + ANSWER_BATCH]
            session.execute(delete(ProfileRequest).where(ProfileRequest.id.in_(batch)))
        session.add(ProfileBuild(chip=chip, builder=BUILDER, started_at=started, finished_at=_clock(session),
                                 requests=int(count), oldest_request_at=oldest, versions=built))
        session.flush()
        keep_newest(session, ProfileBuild, KEEP_BUILDS, ProfileBuild.chip == chip)
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
            with file_lock(session, "builder") as mine:
                return mine and _build(session, chip, settings)
        with session.begin():
            return pg_try_lock(session, "profile:" + chip) and _build(session, chip, settings)


def calibrate(factory: sessionmaker[Session], backend: str, settings: Settings) -> Calibration | None:
    """Recompute ``backend``'s calibration when its stats changed and the last one is old enough."""
    with factory() as session:
        sqlite = is_sqlite(session.get_bind().engine)
        with (file_lock(session, "builder") if sqlite else contextlib.nullcontext(True)) as mine:
            if not mine:
                return None
            if not sqlite:
                session.begin()
                if not pg_try_lock(session, CALIBRATION_LOCK + backend):
                    session.rollback()
                    return None
            last = session.scalars(select(Calibration).where(Calibration.backend == backend)
                                   .order_by(Calibration.id.desc()).limit(1)).first()
            if last is not None and session.scalar(
                    select(db_now(-settings.calibration_interval_seconds))) <= last.created_at:
                session.rollback()
                return None  # calibrated moments ago (checked first: it needs no stats)
            # what the stats have seen: the newest result folded into them (a new run moves it; the
            # row count alone would not), from the builder's series cache (no scan of the rows)
            cache = series_summaries.cache_for(session, backend)
            with cache.lock:
                cache.refresh(session, lambda rows: profiles.summarize(rows, backend))
                current = series_summaries.current(cache.summaries, None)
            count = max((s.newest for s in cache.summaries.values()), default=0)
            if count == 0 or (last is not None and last.source_stats == count):
                session.rollback()
                return None
            tables, picks = profiles.tables_and_picks(current)
            samples = calibration.held_out(tables, profiles._validator, picks=picks)
            backend_chips = sorted(c for c in {s.chip for s in cache.summaries.values()}
                                   if profiles.chip_backend(session, c) == backend)
            with _write(session):
                row = Calibration(backend=backend, bins=calibration.bins(samples), samples=len(samples),
                                  source_stats=count)
                session.add(row)
                session.flush()
                keep_newest(session, Calibration, KEEP_CALIBRATIONS, Calibration.backend == backend)
                # confidences may have moved: rebuild the backend's profiles with the new calibration
                session.add_all([ProfileRequest(chip=c) for c in backend_chips])
            if not sqlite:
                session.commit()
            logger.info("calibrated %s predictions on %d held-out samples", backend, len(samples))
            return row


def build_pending(factory: sessionmaker[Session], settings: Settings) -> int:
    """One pass: recalibrate what is due, then build every chip with queued requests. Returns builds."""
    with factory() as session:
        backends = profiles.backends_with_data(session)
    for backend in backends:
        if backend != "cpu":
            calibrate(factory, backend, settings)
    return sum(build_chip(factory, chip, settings) for chip in pending_chips(factory))
