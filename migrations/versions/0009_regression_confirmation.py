"""how a regression was confirmed

``regressions.confirmation``: how it was confirmed or why it was not: ``re-run`` (its confirmation job
reproduced it), ``stored runs`` (no worker of its chip could re-run it: the stored and imported runs
after it did), ``unconfirmed: no worker of this chip`` (raised after the wait with nothing to confirm
it), or what it waits for while ``confirming``.

Revision ID: 0009_regression_confirmation
Revises: 0008_enrollment_uses
Create Date: 2026-11-28 14:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009_regression_confirmation"
down_revision: str | None = "0008_enrollment_uses"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.add_column(sa.Column("confirmation", sa.String(length=128), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("regressions") as batch:
        batch.drop_column("confirmation")
