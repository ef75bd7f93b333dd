"""Alembic environment. Run through ``kernelfleet db upgrade`` (see kernelfleet.service.migrate)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from kernelfleet.service.db import is_sqlite, make_engine
from kernelfleet.service.models import Base

config = context.config
target_metadata = Base.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        render_as_batch=is_sqlite(connection.engine),
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    engine = make_engine(config.get_main_option("sqlalchemy.url") or "")
    try:
        with engine.connect() as conn:
            _run(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    raise SystemExit("offline migrations are not supported; run `kernelfleet db upgrade`")
run_migrations_online()
