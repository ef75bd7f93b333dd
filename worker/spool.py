"""The worker's durable local spool of messages for the coordinator (results and failures).

Every result is written here *before* it is sent, and removed only when the coordinator
acknowledged it, so a crash, a reboot or a coordinator outage loses nothing.

Layout under the spool root::

    pending/<seq>-job<id>-<action>.json           one record, complete and fsynced
    pending/.<name>.tmp                           a write in progress (never replayed)
    quarantine/<name>                             a record that can never be delivered...
    quarantine/<name>.reason.txt                  ...and why (torn JSON, 409 stale lease, 422, ...)

Writes are atomic: write a temporary file, fsync it, rename it into place, fsync the directory.
A record is therefore either absent or complete; a leftover ``.tmp`` (crash mid-write) or a file
that does not parse (disk trouble, manual edits) is moved to quarantine at replay, with a reason
file, and every other record is replayed.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

Action = Literal["result", "fail"]
ACTIONS: tuple[Action, ...] = ("result", "fail")
RECORD_VERSION = 1


class SpoolError(Exception):
    """The spool directory cannot be used (permissions, full disk, ...)."""


@dataclass(frozen=True)
class SpoolRecord:
    """One message waiting for acknowledgement."""

    path: Path
    action: Action
    job_id: int | str
    lease_token: str
    body: dict[str, Any]     # the request body minus the lease token: {"report": ...} or {"error": ...}

    @property
    def name(self) -> str:
        return self.path.name

    def request_body(self) -> dict[str, Any]:
        return {"lease_token": self.lease_token, **self.body}


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class Spool:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.pending_dir = self.root / "pending"
        self.quarantine_dir = self.root / "quarantine"
        try:
            for d in (self.root, self.pending_dir, self.quarantine_dir):
                d.mkdir(parents=True, exist_ok=True, mode=0o700)
        except OSError as e:
            raise SpoolError(f"cannot create the spool at {self.root}: {e}") from e

    # ------------------------------------------------------------------ writing

    def put(self, action: Action, job_id: int | str, lease_token: str, body: dict[str, Any]) -> SpoolRecord:
        """Write one record durably and return it (it is on disk when this returns)."""
        if action not in ACTIONS:
            raise ValueError(f"unknown spool action {action!r}")
        name = f"{time.time_ns():020d}-job{job_id}-{action}.json"
        record = {"version": RECORD_VERSION, "action": action, "job_id": job_id,
                  "lease_token": lease_token, "body": body, "spooled_at": _now_iso()}
        data = json.dumps(record, allow_nan=False, separators=(",", ":")).encode()
        final = self.pending_dir / name
        tmp = self.pending_dir / f".{name}.tmp"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                os.fsync(fd)
            finally:
                os.close(fd)
            os.replace(tmp, final)
            _fsync_dir(self.pending_dir)
        except OSError as e:
            with contextlib.suppress(OSError):
                tmp.unlink()
            raise SpoolError(f"cannot write to the spool at {self.pending_dir}: {e}") from e
        return SpoolRecord(final, action, job_id, lease_token, body)

    # ------------------------------------------------------------------ reading

    def __len__(self) -> int:
        return sum(1 for p in self.pending_dir.iterdir()
                   if p.suffix == ".json" and not p.name.startswith("."))

    def _load(self, path: Path) -> SpoolRecord:
        """Parse one record file; raises ValueError with a reason a person can read."""
        try:
            raw = json.loads(path.read_bytes())
        except json.JSONDecodeError as e:
            raise ValueError(f"torn or corrupt record (invalid JSON: {e})") from e
        except UnicodeDecodeError as e:
            raise ValueError(f"torn or corrupt record (not UTF-8: {e})") from e
        if not isinstance(raw, dict):
            raise ValueError("malformed record: not a JSON object")
        missing = [k for k in ("action", "job_id", "lease_token", "body") if k not in raw]
        if missing:
            raise ValueError(f"malformed record: missing {', '.join(missing)}")
        if raw["action"] not in ACTIONS:
            raise ValueError(f"malformed record: unknown action {raw['action']!r}")
        if not isinstance(raw["job_id"], int | str) or not isinstance(raw["lease_token"], str) \
                or not isinstance(raw["body"], dict):
            raise ValueError("malformed record: job_id, lease_token or body has the wrong type")
        return SpoolRecord(path, raw["action"], raw["job_id"], raw["lease_token"], raw["body"])

    def replay(self) -> list[SpoolRecord]:
        """All deliverable records, oldest first. Torn ones and leftover temp files are quarantined."""
        records: list[SpoolRecord] = []
        for path in sorted(self.pending_dir.iterdir()):
            if path.name.startswith(".") and path.name.endswith(".tmp"):
                self.quarantine(path, "incomplete write: the worker stopped before this record was "
                                      "renamed into place, so it was never sent")
                continue
            if path.suffix != ".json":
                continue
            try:
                records.append(self._load(path))
            except ValueError as e:
                self.quarantine(path, str(e))
            except OSError as e:
                raise SpoolError(f"cannot read spool record {path}: {e}") from e
        return records

    def __iter__(self) -> Iterator[SpoolRecord]:
        return iter(self.replay())

    # ------------------------------------------------------------------ settling

    def ack(self, record: SpoolRecord) -> None:
        """The coordinator acknowledged the record: delete it."""
        try:
            record.path.unlink(missing_ok=True)
            _fsync_dir(self.pending_dir)
        except OSError as e:
            raise SpoolError(f"cannot remove acknowledged record {record.path}: {e}") from e

    def quarantine(self, path: Path, reason: str) -> Path:
        """Move a record that can never be delivered aside, with a reason file beside it."""
        target = self.quarantine_dir / path.name.lstrip(".")
        if target.exists():
            target = target.with_name(f"{time.time_ns()}-{target.name}")
        reason_path = target.with_name(target.name + ".reason.txt")
        try:
            reason_path.write_text(f"{_now_iso()} {reason}\n")
            os.replace(path, target)
            _fsync_dir(self.quarantine_dir)
            _fsync_dir(self.pending_dir)
        except OSError as e:
            raise SpoolError(f"cannot quarantine {path}: {e}") from e
        return target

    def quarantined(self) -> list[tuple[Path, str]]:
        """(record path, reason) for everything in quarantine."""
        out = []
        for p in sorted(self.quarantine_dir.iterdir()):
            if p.name.endswith(".reason.txt"):
                continue
            reason_path = p.with_name(p.name + ".reason.txt")
            out.append((p, reason_path.read_text().strip() if reason_path.exists() else ""))
        return out
