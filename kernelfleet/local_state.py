"""Where KernelFleet keeps this machine's own state: the data directory, which holds the local-mode
SQLite database and the admin token a local-mode coordinator generates beside it.

The coordinator's settings (:mod:`kernelfleet.service.settings`) and ``kernelfleet pull`` (which
finds a local coordinator's token by itself) both resolve it here, so the two agree; this module
imports nothing of KernelFleet's."""

from __future__ import annotations

import os
import re
from pathlib import Path

from platformdirs import user_data_dir

ADMIN_TOKEN_FILE = "admin_token"


def default_data_dir() -> Path:
    return Path(user_data_dir("kernelfleet", appauthor=False))


def profile_dir() -> Path:
    """Where ``kernelfleet pull`` installs a chip's profile and runtime settings:
    ``$KERNELFLEET_PROFILE_DIR`` or ``<user data dir>/profiles``."""
    env = os.environ.get("KERNELFLEET_PROFILE_DIR")
    return Path(env) if env else default_data_dir() / "profiles"


def chip_slug(chip: str) -> str:
    """A chip's name as a file name: ``Apple M3 Max`` -> ``Apple_M3_Max``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", chip).strip("_") or "unknown"


def default_database_url() -> str:
    return f"sqlite:///{default_data_dir() / 'kernelfleet.db'}"


def is_local(database_url: str) -> bool:
    """Local mode: the database is a SQLite file on this machine."""
    return database_url.startswith("sqlite")


def data_dir(database_url: str, configured: str | Path | None = None) -> Path:
    """``configured`` (KERNELFLEET_DATA_DIR) if set; else a local-mode database file's folder; else the
    user's data directory."""
    if configured:
        return Path(configured).expanduser()
    if is_local(database_url):
        from sqlalchemy.engine import make_url

        database = make_url(database_url).database
        if database and database != ":memory:":
            return Path(database).expanduser().resolve().parent
    return default_data_dir()


def admin_token_path(database_url: str, configured_data_dir: str | Path | None = None) -> Path:
    return data_dir(database_url, configured_data_dir) / ADMIN_TOKEN_FILE


def stored_admin_token() -> str | None:
    """The admin token a local-mode coordinator on this machine generated and keeps, found as
    ``kernelfleet serve`` would with this environment (KERNELFLEET_DATABASE_URL, KERNELFLEET_DATA_DIR);
    None when there is none."""
    url = os.environ.get("KERNELFLEET_DATABASE_URL") or default_database_url()
    try:
        token = admin_token_path(url, os.environ.get("KERNELFLEET_DATA_DIR")).read_text().strip()
    except (OSError, ValueError):
        return None
    return token or None
