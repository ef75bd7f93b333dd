"""Schema management through Alembic, and the check that refuses an un-migrated database."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine

import kernelfleet.migrations as _migrations
from kernelfleet.service.db import make_engine, normalize_url


class SchemaNotCurrent(RuntimeError):
    """The database is missing migrations; ``kernelfleet db upgrade`` fixes it."""


def alembic_config(database_url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(_migrations.__file__).parent))
    cfg.set_main_option("sqlalchemy.url", normalize_url(database_url).replace("%", "%%"))
    return cfg


def upgrade(database_url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def head_revision(database_url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(database_url)).get_current_head()


def current_revision(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def ensure_current(engine: Engine) -> None:
    """Raise :class:`SchemaNotCurrent` with an actionable message unless the schema is at head."""
    head = head_revision(str(engine.url))
    current = current_revision(engine)
    if current != head:
        where = engine.url.render_as_string(hide_password=True)
        state = "has no KernelFleet schema" if current is None else f"is at revision {current}"
        raise SchemaNotCurrent(
            f"the database {where} {state}, but this coordinator needs revision {head}. "
            f"Run `kernelfleet db upgrade` (with the same KERNELFLEET_DATABASE_URL) first."
        )


def make_checked_engine(database_url: str, **engine_options: Any) -> Engine:
    engine = make_engine(database_url, **engine_options)
    try:
        ensure_current(engine)
    except Exception:
        engine.dispose()
        raise
    return engine
