"""Job targets: the distinct (backend, chip glob) pairs jobs are created for.

A campaign's jobs all share one target, so the table holds a handful of rows however many jobs are
queued. The lease matches a worker against the targets (a glob match in Python over these few rows)
and then picks, per matching target, the oldest available job through the partial index
``ix_jobs_queued_target (target_id, available_at, id) WHERE state = 'queued'``: O(log n) in queued
jobs, where ``SELECT DISTINCT target_chip`` over every queued job was O(n) on every lease.
"""

from __future__ import annotations

import fnmatch
import json
import re

from sqlalchemy import Connection, select
from sqlalchemy.orm import Session

from kernelfleet.service.db import upsert_insert
from kernelfleet.service.models import Backend, JobTarget


def chip_matches(pattern: str, chip: str) -> bool:
    """Case-insensitive glob match: ``Apple M3*`` matches ``Apple M3 Max``."""
    return fnmatch.fnmatchcase(chip.casefold(), pattern.casefold())


def target_matches(target_backend: Backend | None, target_chip: str | None, backend: Backend | str,
                   chip: str) -> bool:
    """Whether a target ``(backend or None, chip glob or None)`` takes a machine of ``backend`` and
    ``chip`` (None: any)."""
    return (target_backend is None or target_backend == backend) and (
        target_chip is None or chip_matches(target_chip, chip))


def exact_chip_pattern(chip: str) -> str:
    """A glob matching exactly ``chip`` (jobs target chips by glob)."""
    return re.sub(r"([*?\[])", r"[\1]", chip)


def target_key(backend: Backend | None, chip: str | None) -> str:
    return json.dumps([backend.value if backend else None, chip], separators=(",", ":"))


def target_id(session: Session, backend: Backend | None, chip: str | None) -> int:
    """The id of the target ``(backend, chip)``, created if new (safe against concurrent creators)."""
    key = target_key(backend, chip)
    session.execute(upsert_insert(session)(JobTarget)
                    .values(key=key, target_backend=backend, target_chip=chip)
                    .on_conflict_do_nothing(index_elements=["key"]))
    found = session.scalar(select(JobTarget.id).where(JobTarget.key == key))
    assert found is not None  # inserted above or by a concurrent transaction that committed
    return found


def runnable_targets(db: Session | Connection, backend: Backend, chip: str) -> list[int]:
    """The targets whose jobs a worker with this backend and chip can run."""
    rows = db.execute(select(JobTarget.id, JobTarget.target_backend, JobTarget.target_chip)).all()
    return [r.id for r in rows if target_matches(r.target_backend, r.target_chip, backend, chip)]
