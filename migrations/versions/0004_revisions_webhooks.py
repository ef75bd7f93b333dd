"""source revisions, campaign control and webhook alerts

- ``results.revision``: the kernels' source revision a run was measured at (a git commit, or the
  package version), indexed for the results API's filter.
- ``campaigns.cancelled_at`` / ``deleted_at``: a cancelled campaign's queued jobs are cancelled (the
  new job state ``cancelled``; states are strings, no constraint changes); a deleted one is hidden and
  its row goes once none of its jobs is leased.
- ``regressions.alerted_at``: when its confirmation was announced. Regressions already past
  ``confirming`` count as announced, so an upgrade does not alert on old regressions.
- ``webhook_deliveries`` (one alert to one URL) and ``webhook_attempts`` (each POST).

Revision ID: 0004_revisions_webhooks
Revises: 0003
Create Date: 2026-11-26 16:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004_revisions_webhooks"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TZ = sa.DateTime(timezone=True)
NOW = sa.text("(CURRENT_TIMESTAMP)")


def upgrade() -> None:
    with op.batch_alter_table("results") as batch:
        batch.add_column(sa.Column("revision", sa.String(length=64), nullable=True))
    op.create_index(op.f("ix_results_revision"), "results", ["revision"], unique=False)
    with op.batch_alter_table("campaigns") as batch:
        batch.add_column(sa.Column("cancelled_at", TZ, nullable=True))
        batch.add_column(sa.Column("deleted_at", TZ, nullable=True))
    with op.batch_alter_table("regressions") as batch:
        batch.add_column(sa.Column("alerted_at", TZ, nullable=True))
    regressions = sa.table("regressions", sa.column("status"), sa.column("alerted_at"),
                           sa.column("detected_at"))
    op.get_bind().execute(sa.update(regressions).where(regressions.c.status != "confirming")
                          .values(alerted_at=regressions.c.detected_at))

    op.create_table(
        "webhook_deliveries",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("regression_id", sa.Integer(), nullable=True),
        sa.Column("url", sa.String(length=2048), nullable=False),
        sa.Column("payload", sa.JSON(), nullable=False),
        sa.Column("state", sa.Enum("pending", "delivered", "failed", name="deliverystate", native_enum=False,
                                   length=24), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("next_attempt_at", TZ, server_default=NOW, nullable=False),
        sa.Column("created_at", TZ, server_default=NOW, nullable=False),
        sa.Column("delivered_at", TZ, nullable=True),
        sa.ForeignKeyConstraint(["regression_id"], ["regressions.id"],
                                name=op.f("fk_webhook_deliveries_regression_id_regressions"),
                                ondelete="SET NULL"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_deliveries")),
    )
    op.create_index("ix_webhook_deliveries_due", "webhook_deliveries", ["state", "next_attempt_at"])
    op.create_index(op.f("ix_webhook_deliveries_regression_id"), "webhook_deliveries", ["regression_id"])
    op.create_table(
        "webhook_attempts",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("delivery_id", sa.Integer(), nullable=False),
        sa.Column("attempted_at", TZ, server_default=NOW, nullable=False),
        sa.Column("status_code", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("duration_ms", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["delivery_id"], ["webhook_deliveries.id"],
                                name=op.f("fk_webhook_attempts_delivery_id_webhook_deliveries"),
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_webhook_attempts")),
    )
    op.create_index(op.f("ix_webhook_attempts_delivery_id"), "webhook_attempts", ["delivery_id"])


def downgrade() -> None:
    op.drop_table("webhook_attempts")
    op.drop_table("webhook_deliveries")
    with op.batch_alter_table("regressions") as batch:
        batch.drop_column("alerted_at")
    with op.batch_alter_table("campaigns") as batch:
        batch.drop_column("deleted_at")
        batch.drop_column("cancelled_at")
    op.drop_index(op.f("ix_results_revision"), table_name="results")
    with op.batch_alter_table("results") as batch:
        batch.drop_column("revision")
