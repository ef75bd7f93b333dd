"""Local mode's admin token: when none is configured, generate one, keep it (mode 0600) in the data
directory next to the SQLite database so restarts reuse it, and print it once when generated."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from kernelfleet import local_state
from kernelfleet.service.settings import Settings


def admin_token_path(settings: Settings) -> Path:
    return local_state.admin_token_path(settings.database_url, settings.data_dir)


def ensure_admin_token(settings: Settings) -> tuple[str | None, bool]:
    """Return ``(token, generated_now)``. Outside local mode an unset token stays unset (admin routes
    then refuse every request)."""
    if settings.admin_token:
        return settings.admin_token, False
    if not settings.is_local:
        return None, False
    path = admin_token_path(settings)
    if path.exists():
        token = path.read_text().strip()
        if token:
            return token, False
    path.parent.mkdir(parents=True, exist_ok=True)
    from kernelfleet.service.auth import ADMIN_PREFIX  # here: the CLI loads this module, auth the ORM

    token = ADMIN_PREFIX + secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    os.chmod(path, 0o600)
    return token, True
