"""queued change-point scans

``POST /api/v1/regressions/scan`` no longer runs the scan inside the request: it queues a
``regression_scans`` row (at most one queued at a time: a partial unique index on ``status =
'queued'``, so a request while one is queued joins it), which the background loop runs and
completes with its figures.

Revision ID: 0006_regression_scans
Revises: 0005_campaign_shapes
Create Date: 2026-11-26 19:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006_regression_scans"
down_revision: str | None = "0005_campaign_shapes"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
NOW = sa.text("(CURRENT_TIMESTAMP)")


def upgrade() -> None:
    op.create_table(
        "regression_scans",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("requested_at", TZ, server_default=NOW, nullable=False),
        sa.Column("requests", sa.Integer(), nullable=False),
        sa.Column("started_at", TZ, nullable=True),
        sa.Column("finished_at", TZ, nullable=True),
        sa.Column("runner", sa.String(length=128), nullable=True),
        sa.Column("series", sa.Integer(), nullable=True),
        sa.Column("findings", sa.Integer(), nullable=True),
        sa.Column("created", sa.JSON(), nullable=True),
        sa.Column("moved", sa.JSON(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_regression_scans")),
    )
    op.create_index("uq_regression_scans_queued", "regression_scans", ["status"], unique=True,
                    postgresql_where=sa.text("status = 'queued'"), sqlite_where=sa.text("status = 'queued'"))


def downgrade() -> None:
    op.drop_index("uq_regression_scans_queued", table_name="regression_scans")
    op.drop_table("regression_scans")
