"""KernelFleet's own per-chip profile file, as written by ``kernelfleet pull`` and read at call time.

Importable with only the standard library, mlx and numpy.

File (JSON)::

    {"schema": "kernelfleet-profile/1", "chip": "Apple M3 Max", "mlx_version": "0.32.4" | null,
     "version": 7, "etag": "...",
     "entries": [{"kernel": "rmsnorm", "shape": "4096x4096", "dtype": "float16",
                  "config": {"tg": 256, "vec": 4} | {"variant": "builtin"}, "config_key": "tg=256,vec=4",
                  "median_us": 41.2, "speedup": 1.31, "predicted": false}, ...]}

Location: ``$KERNELFLEET_PROFILE_DIR`` or ``<user data dir>/profiles``, one file per chip
(:func:`profile_path`). Entries may carry more keys: ``runs`` (tuned), ``confidence``, ``basis``
and ``mode`` (predicted: ``own``, ``cross``, or ``transfer`` for another chip's measured entry at
the very shape). :func:`write` replaces a file atomically (temporary file, fsync, rename),
so a reader never sees half a profile.
"""

from __future__ import annotations

import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any

from kernelfleet.local_state import chip_slug, profile_dir

SCHEMA = "kernelfleet-profile/1"
KEY_FIELDS = ("kernel", "shape", "dtype")


def profile_path(chip: str) -> Path:
    return profile_dir() / f"{chip_slug(chip)}.json"


@lru_cache(maxsize=16)
def _load(path: str, mtime_ns: int) -> dict[tuple[str, str, str], dict[str, Any]]:
    data = json.loads(Path(path).read_text())
    if data.get("schema") != SCHEMA:
        return {}
    return {(e["kernel"], e["shape"], e["dtype"]): e for e in data.get("entries", [])}


class ProfileFileError(ValueError):
    """A profile body that is not in this format."""


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: a temporary file beside it, fsync, rename, fsync dir."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(body: dict[str, Any], path: Path | None = None) -> Path:
    """Store a profile (as served by the coordinator) for its chip; returns the file's path."""
    if body.get("schema") != SCHEMA or not isinstance(body.get("chip"), str) \
            or not isinstance(body.get("entries"), list):
        raise ProfileFileError(f"not a {SCHEMA} profile (schema {body.get('schema')!r})")
    for e in body["entries"]:
        if not isinstance(e, dict) or not all(isinstance(e.get(k), str) for k in KEY_FIELDS):
            raise ProfileFileError(f"profile entry without kernel, shape and dtype: {e!r}"[:200])
    target = path or profile_path(body["chip"])
    atomic_write_text(target, json.dumps(body, indent=1, sort_keys=True) + "\n")
    return target


def read(chip: str) -> dict[str, Any] | None:
    """The stored profile for ``chip``, or None when there is none or it cannot be read."""
    try:
        data = json.loads(profile_path(chip).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("schema") == SCHEMA else None


def lookup(kernel: str, shape: str, dtype: str, chip: str) -> dict[str, Any] | None:
    """The profile entry for (kernel, shape, dtype) on ``chip``, or None when there is none.

    A missing or unreadable file means "no profile": the caller uses the kernel's default.
    """
    path = profile_path(chip)
    try:
        stat = path.stat()
        entries = _load(str(path), stat.st_mtime_ns)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return entries.get((kernel, shape, dtype))
