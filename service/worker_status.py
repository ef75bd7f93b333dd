"""A worker's status as the dashboard and the CLI both show it: ``revoked``, ``online`` (a heartbeat
under ``KERNELFLEET_WORKER_OFFLINE_AFTER_SECONDS`` old, by the database clock) or ``offline``."""

from __future__ import annotations

from sqlalchemy import ColumnElement, case

from kernelfleet.service.db import db_now
from kernelfleet.service.models import Worker

STATUSES = ("online", "offline", "revoked")


def worker_status(offline_after: float) -> ColumnElement[str]:
    """The status as a SQL expression over ``workers`` (one query for a whole fleet)."""
    return case(
        (Worker.revoked_at.is_not(None), "revoked"),
        (Worker.last_heartbeat_at >= db_now(-offline_after), "online"),
        else_="offline",
    )
