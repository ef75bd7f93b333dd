"""The schema changes only through Alembic: the migrations build exactly what the models declare."""

from __future__ import annotations

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from kernelfleet.service.db import make_engine
from kernelfleet.service.migrate import alembic_config, current_revision, head_revision, upgrade
from kernelfleet.service.models import Base


def test_models_and_migrations_agree(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    try:
        assert current_revision(engine) == head_revision(migrated_db_url) == "0004_revisions_webhooks"
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"compare_type": True})
            diff = compare_metadata(ctx, Base.metadata)
        assert diff == [], f"models and migrations differ: {diff}"
        tables = set(inspect(engine).get_table_names())
        assert set(Base.metadata.tables) <= tables
    finally:
        engine.dispose()


def test_downgrade_and_upgrade_round_trip(migrated_db_url: str) -> None:
    command.downgrade(alembic_config(migrated_db_url), "base")
    engine = make_engine(migrated_db_url)
    try:
        assert current_revision(engine) is None
        assert not set(Base.metadata.tables) & set(inspect(engine).get_table_names())
        upgrade(migrated_db_url)
        assert current_revision(engine) == "0004_revisions_webhooks"
    finally:
        engine.dispose()
