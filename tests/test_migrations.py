"""The schema changes only through Alembic: the migrations build exactly what the models declare."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect

from kernelfleet.service.db import make_engine
from kernelfleet.service.migrate import alembic_config, current_revision, head_revision, upgrade
from kernelfleet.service.models import Base

HEAD = "0012_regression_triage"


def test_models_and_migrations_agree(migrated_db_url: str) -> None:
    engine = make_engine(migrated_db_url)
    try:
        assert current_revision(engine) == head_revision(migrated_db_url) == HEAD
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
        assert current_revision(engine) == HEAD
    finally:
        engine.dispose()


def test_0005_gives_older_campaigns_their_shape_sets(db_url: str) -> None:
    """A campaign stored before per-kernel shape sets (kernels x shapes) gets ``kernel_shapes`` giving
    each kernel every shape; downgrade removes it and keeps the rest."""
    cfg = alembic_config(db_url)
    command.upgrade(cfg, "0004_revisions_webhooks")
    engine = make_engine(db_url)
    old = {"kernels": ["rmsnorm", "softmax"], "shapes": ["1x4096", "512x4096"], "dtypes": ["float16"]}
    campaigns = sa.table("campaigns", sa.column("id", sa.Integer), sa.column("name", sa.String),
                         sa.column("max_attempts", sa.Integer), sa.column("spec", sa.JSON))
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(campaigns).values(id=1, name="old", max_attempts=3, spec=old))
        command.upgrade(cfg, "head")
        with engine.connect() as conn:
            spec = conn.execute(sa.select(campaigns.c.spec)).scalar_one()
        assert spec == {**old, "kernel_shapes": {"rmsnorm": ["1x4096", "512x4096"],
                                                 "softmax": ["1x4096", "512x4096"]}}
        command.downgrade(cfg, "0004_revisions_webhooks")
        with engine.connect() as conn:
            assert conn.execute(sa.select(campaigns.c.spec)).scalar_one() == old
    finally:
        engine.dispose()
