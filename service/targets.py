"""Job targets: the distinct (backend, chip glob) pairs jobs are created for.

A campaign's jobs all share one target, so the table holds a handful of rows however many jobs are
queued. The lease matches a worker against the targets (a glob match in Python over these few rows)
and then picks, per matching target, the oldest available job through the partial index
``ix_jobs_queued_target (target_id, available_at, id) WHERE state = 'queued'``: O(log n) in queued
jobs, where ``SELECT DISTINCT target_chip`` over every queued job was O(n) on every lease.

Targets are inserted (:func:`target_id`) and never changed or deleted, so their number tells whether
the rows a process read before are still all of them: a lease reads that number in its worker's
token check (:data:`TARGET_COUNT`, a scalar subquery of the same statement) and matches the worker
against the rows its process last read, read again only when the number changed
(:func:`runnable_targets`): one round trip less per lease, and the glob match done once per machine.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, ScalarSelect, func, select
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


# how many targets there are (a column of the lease's token check): equal to the number of rows read
# before, they are the same rows
TARGET_COUNT: ScalarSelect[int] = select(func.count()).select_from(JobTarget).scalar_subquery()
_TARGETS = select(JobTarget.id, JobTarget.target_backend, JobTarget.target_chip)
MATCHED_MAX = 1024  # machines whose matches are remembered at most (then the memory starts afresh)


@dataclass
class _Read:
    """The targets an engine's connections last read, and the machines matched against them."""

    rows: list[tuple[int, Backend | None, str | None]]
    matched: dict[tuple[str, str], list[int]] = field(default_factory=dict)

    def match(self, backend: Backend | str, chip: str) -> list[int]:
        key = (str(backend), chip)
        ids = self.matched.get(key)
        if ids is None:
            ids = [i for i, b, c in self.rows if target_matches(b, c, backend, chip)]
            if len(self.matched) >= MATCHED_MAX:
                self.matched.clear()
            self.matched[key] = ids
        return list(ids)


_READ: WeakKeyDictionary[Engine, _Read] = WeakKeyDictionary()


def runnable_targets(db: Session | Connection, backend: Backend, chip: str, count: int | None = None,
                     ) -> list[int]:
    """The targets whose jobs a worker with this backend and chip can run. ``count``: the number of
    targets a statement of ``db`` read just before (:data:`TARGET_COUNT`); when the rows its engine
    last read are as many, they are these rows (targets are only ever added), and no query runs."""
    read = _READ.get(db.engine) if count is not None and isinstance(db, Connection) else None
    if read is None or len(read.rows) != count:
        read = _Read([(r.id, r.target_backend, r.target_chip) for r in db.execute(_TARGETS)])
        if isinstance(db, Connection):
            _READ[db.engine] = read
    return read.match(backend, chip)
