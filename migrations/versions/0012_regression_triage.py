"""regression triage: invalid, ignored and fixed; who changed it; grouping by hand; per-series thresholds

- ``regressions.status`` may also be ``invalid`` (noise), ``ignored`` (expected) or ``fixed`` (undone
  later): the column is a VARCHAR(24) without a CHECK constraint, so only the model's enum grows.
- ``regressions``: ``status_changed_by``/``status_changed_at``/``status_note`` (the last change a person
  made to its status), ``fixed_by_regression_id``/``fixed_by_result_id`` (what fixed it) and
  ``group_note`` (set when it was grouped or ungrouped by hand; the scan then keeps its group).
- ``regression_events``: every change a person made to a regression's status or group (append-only).
- ``series_thresholds``: a series' own minimum effect, used instead of ``regression_min_effect``.

Revision ID: 0012_regression_triage
Revises: 0011_runtime_settings
Create Date: 2026-11-28 12:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012_regression_triage"
down_revision: str | None = "0011_runtime_settings"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.add_column(sa.Column("status_changed_by", sa.String(length=160), nullable=True))
        batch.add_column(sa.Column("status_changed_at", TZ, nullable=True))
        batch.add_column(sa.Column("status_note", sa.Text(), nullable=True))
        batch.add_column(sa.Column("fixed_by_regression_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("fixed_by_result_id", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("group_note", sa.Text(), nullable=True))
        batch.create_foreign_key(op.f("fk_regressions_fixed_by_regression_id_regressions"), "regressions",
                                 ["fixed_by_regression_id"], ["id"], ondelete="SET NULL")
        batch.create_foreign_key(op.f("fk_regressions_fixed_by_result_id_results"), "results",
                                 ["fixed_by_result_id"], ["id"], ondelete="SET NULL")
    op.create_table(
        "regression_events",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("regression_id", sa.Integer(), nullable=False),
        sa.Column("at", TZ, server_default=sa.func.now(), nullable=False),
        sa.Column("actor", sa.String(length=160), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("old", sa.String(length=256), nullable=True),
        sa.Column("new", sa.String(length=256), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["regression_id"], ["regressions.id"],
                                name=op.f("fk_regression_events_regression_id_regressions"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regression_events")),
    )
    op.create_index(op.f("ix_regression_events_regression_id"), "regression_events", ["regression_id"])
    op.create_table(
        "series_thresholds",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("chip", sa.String(length=128), nullable=False),
        sa.Column("kernel", sa.String(length=64), nullable=False),
        sa.Column("shape", sa.String(length=128), nullable=False),
        sa.Column("dtype", sa.String(length=16), nullable=False),
        sa.Column("min_effect", sa.Float(), nullable=False),
        sa.Column("note", sa.Text(), nullable=True),
        sa.Column("set_by", sa.String(length=160), nullable=False),
        sa.Column("set_at", TZ, server_default=sa.func.now(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_series_thresholds")),
        sa.UniqueConstraint("chip", "kernel", "shape", "dtype", name="uq_series_thresholds_series"),
    )


def downgrade() -> None:
    op.drop_table("series_thresholds")
    op.drop_index(op.f("ix_regression_events_regression_id"), table_name="regression_events")
    op.drop_table("regression_events")
    # a regression triaged by hand goes back to the status nearest in the old schema: acknowledged
    op.execute("UPDATE regressions SET status = 'acknowledged' WHERE status IN ('invalid', 'ignored', 'fixed')")
    with op.batch_alter_table("regressions") as batch:
        batch.drop_constraint(op.f("fk_regressions_fixed_by_result_id_results"), type_="foreignkey")
        batch.drop_constraint(op.f("fk_regressions_fixed_by_regression_id_regressions"), type_="foreignkey")
        for column in ("group_note", "fixed_by_result_id", "fixed_by_regression_id", "status_note",
                       "status_changed_at", "status_changed_by"):
            batch.drop_column(column)
